# SPDX-License-Identifier: Apache-2.0
# Attacks the trace reader's promise (docs/workloads.md, "Limits on hostile
# input") that a trace cannot make a replay hold memory out of proportion:
# every distinct Stream value costs the replaying pool a free index of its
# own (~21 KiB), so a trace naming 65 535 streams held 1.3 GB.  At most 1 024
# distinct streams are accepted: 1 024 replay, 1 025 (or 65 535) are refused
# with exit 2 and the line of the first stream over the limit.
# usage: bash trace_streams.sh GPUMEM HOLDER
set -u
GPUMEM=$1
export GPUMEM_BACKEND=sim
. "$(dirname "${BASH_SOURCE[0]}")/cli_common.bash" # $tmp; fail MESSAGE, counted in $fails

# n streams, one 512-byte block allocated and freed on each.
make_trace() {
    awk -v n="$1" 'BEGIN {
        print "Thread,Time,Action,Pointer,Size,Stream"
        for (s = 0; s < n; s++) printf "0,0.1,allocate,0x%x,512,%d\n", 268435456 + s * 4096, s
        for (s = 0; s < n; s++) printf "0,0.2,free,0x%x,512,%d\n", 268435456 + s * 4096, s
    }' >"$2"
}

make_trace 1024 "$tmp/ok.csv"
"$GPUMEM" replay "$tmp/ok.csv" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || fail "1024 streams: exit $rc, want 0: $(cat "$tmp/err")"

for n in 1025 65535; do
    make_trace "$n" "$tmp/many.csv"
    "$GPUMEM" replay "$tmp/many.csv" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq 2 ] || fail "$n streams: exit $rc, want 2"
    # The header is line 1: stream 1024 (the 1025th) is on line 1026.
    grep -qF "$tmp/many.csv:1026: more than 1024 distinct streams" "$tmp/err" ||
        fail "$n streams: want the line of the 1025th stream named, got: $(cat "$tmp/err")"
    grep -q "ratio\|ns/op" "$tmp/out" && fail "$n streams: something was replayed: $(cat "$tmp/out")"
done

[ "$fails" -eq 0 ] && echo "trace_streams: all passed"
[ "$fails" -eq 0 ]
