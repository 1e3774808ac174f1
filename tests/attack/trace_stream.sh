# SPDX-License-Identifier: Apache-2.0
# Attacks the promise of `gpumem replay` (docs/workloads.md) that it streams:
# a trace is replayed a chunk at a time, re-read for each --repeat pass, so
# its memory does not grow with the trace.  A trace of ~1.2 M ops (what the
# old whole-file reader held as ~70 MB of text and ops) must not raise the
# replay's peak RSS by more than 16 MB over a 2-op trace; and --repeat 2
# gives twice the ops and the same peaks.
# usage: bash trace_stream.sh GPUMEM HOLDER
set -u
GPUMEM=$1
export GPUMEM_BACKEND=sim
if [ ! -x /usr/bin/time ]; then
    echo "no /usr/bin/time: skipped"
    exit 0
fi
# Sanitizer builds (debug level 3: a pool check after every call) take ms
# per op, and their RSS is the sanitizer's: there only the --repeat check
# runs, on a short trace.
rows=600000
if grep -qa -e __asan_init -e __tsan_init "$GPUMEM"; then
    rows=500
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

printf 'Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x10,64,0\n1,0.2,free,0x10,64,0\n' >"$tmp/small.csv"
awk -v rows="$rows" 'BEGIN {
    print "Thread,Time,Action,Pointer,Size,Stream"
    for (i = 0; i < rows; i++) {
        printf "1,%d.%06d,allocate,0x%x,%d,0\n", i / 1000000, i % 1000000, 4096 * (i % 64) + 268435456, 512 * (i % 13 + 1)
        if (i >= 32) { j = i - 32
            printf "1,%d.%06d,free,0x%x,%d,0\n", i / 1000000, i % 1000000, 4096 * (j % 64) + 268435456, 512 * (j % 13 + 1) }
    } }' >"$tmp/big.csv"

rss() { # TRACE ARGS...: peak RSS in KiB of gpumem replay (runs in a subshell:
         # a failure is left in $tmp/failed)
    local trace=$1; shift
    if ! /usr/bin/time -f "%M" -o "$tmp/rss" "$GPUMEM" replay --json "$@" "$trace" \
            >"$tmp/json.$#" 2>"$tmp/err"; then
        echo "FAIL: replay $trace $*: $(cat "$tmp/err")" >&2
        echo x >>"$tmp/failed"
    fi
    tail -n 1 "$tmp/rss"
}
small=$(rss "$tmp/small.csv")
big=$(rss "$tmp/big.csv")
echo "peak RSS: 2-op trace $small KiB, $((2 * rows - 32))-op trace $big KiB"
if [ "$rows" -eq 600000 ]; then
    [ $((big - small)) -lt 16384 ] || fail "peak RSS grew by $((big - small)) KiB with the trace"
fi

one=$(sed -E 's/.*"ops":([0-9]+),"repeat":1,"live_peak":([0-9]+),"reserved_peak":([0-9]+).*/\1 \2 \3/' "$tmp/json.0")
rss "$tmp/big.csv" --repeat 2 >/dev/null
two=$(sed -E 's/.*"ops":([0-9]+),"repeat":2,"live_peak":([0-9]+),"reserved_peak":([0-9]+).*/\1 \2 \3/' "$tmp/json.2")
[ "$one" = "$two" ] && [ "${one%% *}" = $((2 * rows - 32)) ] || fail "repeat 2: '$two', repeat 1: '$one'"

[ -e "$tmp/failed" ] && fails=$((fails + 1))
[ "$fails" -eq 0 ] && echo "trace_stream: all passed"
[ "$fails" -eq 0 ]
