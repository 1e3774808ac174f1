#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/broker.sh — the broker on a GPU: build, the broker tests on
# the cuda backend (a test that hangs gets its threads' stacks dumped, then is
# killed), then bench/run_broker_bench.sh (with the PyTorch part).
# Run from the repository root; logs and results under $OUT.
#   TESTS      ctest regex of the tests to run   (^broker/|^preload/broker$)
#   TEST_LIMIT seconds per test before the stack dump and kill (120)
#   BENCH=0    skip the benchmark
set -u -o pipefail
OUT="${OUT:-build-device/out}"
BUILD_DIR="${BUILD_DIR:-build-device}"
TESTS="${TESTS:-^broker/|^preload/broker$}"
TEST_LIMIT="${TEST_LIMIT:-120}"
mkdir -p "$OUT"
export GPUMEM_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/broker-gpu.txt"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON \
      -DGM_TEST_BACKEND=cuda -DGM_VALGRIND=OFF -DGM_WERROR=ON >"$OUT/broker-build.log" 2>&1 &&
    { cmake --build "$BUILD_DIR" -j "$(nproc)" -- -k >>"$OUT/broker-build.log" 2>&1 ||
      { echo "build: some targets failed"; grep -E 'error' "$OUT/broker-build.log" | head; }; } ||
    { echo "configure failed"; tail -30 "$OUT/broker-build.log"; exit 1; }

# Each test alone, so a hang is seen and its stacks taken.
dump() { # pid: every thread's stack of pid and its children
    local p
    for p in $1 $(pgrep -P "$1" 2>/dev/null); do
        echo "--- pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)"
        if command -v gdb >/dev/null; then
            gdb -p "$p" -batch -ex "thread apply all bt" 2>/dev/null | grep -E '^(#|Thread)' | head -80
        else
            for t in /proc/"$p"/task/*; do echo "  $t $(cat "$t"/wchan 2>/dev/null)"; done
        fi
    done
}
fail=0
tests=$(cd "$BUILD_DIR" && ctest -N -R "$TESTS" | sed -n 's/^ *Test *#[0-9]*: //p')
for t in $tests; do
    cmdline=$(cd "$BUILD_DIR" && ctest -R "^${t}\$" --show-only=json-v1 |
              python3 -c 'import json,sys; t=json.load(sys.stdin)["tests"][0]; print("\x1f".join(t["command"]))')
    IFS=$'\x1f' read -r -a cmd <<<"$cmdline"
    log="$OUT/broker-test-$(echo "$t" | tr / _).log"
    start=$(date +%s.%N)
    "${cmd[@]}" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq $((TEST_LIMIT * 10))); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $pid 2>/dev/null; then
        { echo "=== HUNG after ${TEST_LIMIT}s"; dump $pid; } >>"$log" 2>&1
        pkill -9 -P $pid; kill -9 $pid
    fi
    wait $pid; rc=$?
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    printf '%-32s rc=%-3s %6.1fs  %s\n' "$t" "$rc" "$secs" "$(grep -E 'passed, [0-9]+ failed|: ok' "$log" | tail -1)" |
        tee -a "$OUT/broker-tests.txt"
    [ "$rc" = 0 ] || [ "$rc" = 77 ] || { fail=1; grep -E 'CHECK failed|returned|FAIL|HUNG' "$log" | head -5; }
done
if [ "${BENCH:-1}" = 1 ]; then
    BUILD_DIR="$BUILD_DIR" OUT="$OUT" bench/run_broker_bench.sh >"$OUT/broker-bench.log" 2>&1
    echo "bench rc=$?"; tail -25 "$OUT/broker-bench.log"
fi
exit $fail
