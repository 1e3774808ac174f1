#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/observe.sh — observability on a GPU (cuda backend), run from
# the repository root on the GPU machine.  Builds in build-obs-device/ and
# writes every log and figure under $OUT (default build-obs-device/out):
#   observe-build.log         configure + build
#   observe-api.log           tests/api/test_observe on the cuda backend
#                             (stats, OOM report + handlers under a 64 MiB
#                             limit, leak report, leaking child, trace rows)
#   observe-cli.log           tests/obs/*.sh with the cuda backend (trace round
#                             trip via `gpumem replay --backend cuda`, top/metrics,
#                             report; the browser part skips without chromium)
#   observe-top.log           `gpumem top --once` and `--json`, `gpumem metrics`
#                             while a cuda process holds 8 MiB
#   observe-bench.jsonl       bench/obs_bench on cuda: nothing, monitor, trace,
#                             trace.gz, leak (3 runs each)
#   observe-roundtrip.log     a cuda replay of data/sample.csv.gz traced, the
#                             trace replayed again, and its HTML report
#   observe-summary.log       one line per part: ok / FAILED
# Never stops at the first failure.  Exit status: 0 when every part passed.
set -u -o pipefail
if [ ! -f CMakeLists.txt ] || [ ! -f include/gpumem.h ]; then
    echo "observe.sh: run me from the gpumem repository root" >&2
    exit 2
fi
BUILD_DIR="${BUILD_DIR:-build-obs-device}"
OUT="${OUT:-$BUILD_DIR/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export GPUMEM_BACKEND=cuda GPUMEM_TEST_BACKEND=cuda
summary="$OUT/observe-summary.log"
: >"$summary"
status=0
result() { # part rc
    if [ "$2" -eq 0 ]; then echo "$1: ok" | tee -a "$summary"
    else echo "$1: FAILED (status $2)" | tee -a "$summary"; status=1; fi
}

echo "=== build ==="
{
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGM_TEST_BACKEND=cuda &&
    cmake --build "$BUILD_DIR" -j "$(nproc)"
} >"$OUT/observe-build.log" 2>&1
rc=$?
result build $rc
if [ $rc -ne 0 ]; then tail -30 "$OUT/observe-build.log"; exit 1; fi
G="$BUILD_DIR/gpumem"
T="$BUILD_DIR/tests/api/test_observe"
"$G" info 2>&1 | tee "$OUT/observe-info.log"

echo "=== api test on cuda ==="
timeout 300 "$T" >"$OUT/observe-api.log" 2>&1
rc=$?
tail -3 "$OUT/observe-api.log"
result api $rc

echo "=== CLI tests ==="
: >"$OUT/observe-cli.log"
crc=0
for s in tests/obs/*.sh; do
    echo "--- $s" >>"$OUT/observe-cli.log"
    timeout 300 bash "$s" "$G" "$T" >>"$OUT/observe-cli.log" 2>&1 || crc=$?
done
tail -20 "$OUT/observe-cli.log"
result cli $crc

echo "=== top / metrics with a cuda process ==="
{
    dir=$(mktemp -d)
    mkfifo "$dir/in"
    "$T" hold <"$dir/in" >"$dir/out" 2>&1 &
    hpid=$!
    exec 3>"$dir/in"
    for _ in $(seq 100); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.1; done
    "$G" top --once
    "$G" top --once --json
    "$G" metrics --pid-labels | grep -E "^gpumem_(allocated|reserved|alloc)_" | grep "pid=\"$hpid\""
    exec 3>&-
    wait "$hpid"
    echo "holder exit $?"
    rm -rf "$dir"
} >"$OUT/observe-top.log" 2>&1
grep -q 'backend":"cuda' "$OUT/observe-top.log"
result top $?
head -12 "$OUT/observe-top.log"

echo "=== overhead on cuda ==="
: >"$OUT/observe-bench.jsonl"
brc=0
for r in 1 2 3; do
    for m in nothing off trace trace.gz leak; do
        if [ "$m" = nothing ]; then
            GPUMEM_MONITOR=0 timeout 120 "$BUILD_DIR/bench/obs_bench" off - >>"$OUT/observe-bench.jsonl" 2>&1 || brc=$?
        else
            timeout 120 "$BUILD_DIR/bench/obs_bench" "$m" - >>"$OUT/observe-bench.jsonl" 2>&1 || brc=$?
        fi
    done
done
cat "$OUT/observe-bench.jsonl"
result bench $brc

echo "=== traced cuda replay, replayed again, reported ==="
(
    tmp=$(mktemp -d)
    GPUMEM_TRACE="$tmp/rec.csv.gz" "$G" replay --backend cuda --json data/sample.csv.gz &&
    "$G" replay --backend cuda --json "$tmp/rec.csv.gz" &&
    "$G" report "$tmp/rec.csv.gz" -o "$OUT/observe-report.html"
    r=$?
    rm -rf "$tmp"
    exit "$r"
) >"$OUT/observe-roundtrip.log" 2>&1
rc=$?
cat "$OUT/observe-roundtrip.log"
result roundtrip "$rc"

echo "=== summary ==="
cat "$summary"
exit "$status"
