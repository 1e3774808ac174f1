# SPDX-License-Identifier: Apache-2.0
# Attacks the promise of `gpumem replay` (docs/workloads.md, `gpumem help
# replay`): a trace with bugs in it (double frees, frees of pointers never
# allocated, an allocate of a pointer already live, a free whose size differs
# from its allocate's) is never replayed in silence: one warning line per
# trace names each kind, its count and its first line, and --strict refuses
# the trace (exit 2) before anything is replayed.
# usage: bash trace_bugs.sh GPUMEM HOLDER
set -u
GPUMEM=$1
export GPUMEM_BACKEND=sim
. "$(dirname "${BASH_SOURCE[0]}")/cli_common.bash" # $tmp; fail MESSAGE, counted in $fails

# Line numbers: the header is line 1.
cat >"$tmp/bugs.csv" <<'EOF'
Thread,Time,Action,Pointer,Size,Stream
1,0.1,allocate,0x1000,4096,0
1,0.2,free,0x1000,4096,0
1,0.3,free,0x1000,4096,0
1,0.4,allocate,0x2000,512,0
1,0.5,allocate,0x2000,1024,0
1,0.6,free,0x9999,64,0
1,0.7,free,0x2000,2048,0
1,0.8,free,0x1000,4096,0
EOF
# line 4: double free; 6: allocate of a live pointer; 7: never allocated;
# 8: size 2048 freed, 1024 allocated; 9: a second double free.
printf 'Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n1,0.2,free,0x10,64,0\n' >"$tmp/clean.csv"

"$GPUMEM" replay "$tmp/bugs.csv" "$tmp/clean.csv" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || fail "warn: exit $rc, want 0: $(cat "$tmp/err")"
want="warning: $tmp/bugs.csv: trace bugs: 2 double frees (first on line 4), 1 free of a pointer never allocated (first on line 7), 1 allocate of a live pointer (first on line 6), 1 free whose size differs from the allocate's (first on line 8)"
grep -qF "$want" "$tmp/err" || fail "warn: want '$want', got: $(cat "$tmp/err")"
[ "$(grep -c "trace bugs" "$tmp/err")" -eq 1 ] || fail "warn: one line for the buggy trace only: $(cat "$tmp/err")"
grep -q "clean.csv" "$tmp/out" || fail "warn: the clean trace was not replayed"

"$GPUMEM" replay --json "$tmp/bugs.csv" >"$tmp/json" 2>/dev/null
for f in '"double_frees":2' '"free_size_mismatches":1' '"unknown_frees":3' '"dup_allocs":1' \
         '"first_bug_lines":{"unknown_free":7,"double_free":4,"dup_alloc":6,"size_mismatch":8}'; do
    grep -qF "$f" "$tmp/json" || fail "json: lacks $f: $(cat "$tmp/json")"
done

"$GPUMEM" replay --strict "$tmp/clean.csv" "$tmp/bugs.csv" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "strict: exit $rc, want 2"
grep -q "^error: $tmp/bugs.csv: trace bugs: 2 double frees" "$tmp/err" || fail "strict: no error line: $(cat "$tmp/err")"
[ ! -s "$tmp/out" ] || fail "strict: something was replayed: $(cat "$tmp/out")"

"$GPUMEM" replay --strict "$tmp/clean.csv" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] || fail "strict clean: exit $rc, stderr: $(cat "$tmp/err")"

[ "$fails" -eq 0 ] && echo "trace_bugs: all passed"
[ "$fails" -eq 0 ]
