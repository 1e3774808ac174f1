#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/broker.sh — the broker on a GPU: build, the broker tests on
# the cuda backend, then bench/run_broker_bench.sh (with the PyTorch part).
# Run from the repository root; logs and results under $OUT.
#   TESTS      ctest regex of the tests to run (the broker and sharing tests)
#   TEST_LIMIT seconds per test (120)
#   BENCH=0    skip the benchmark
set -u -o pipefail
. bench/lib.sh
gm_default BUILD_DIR="build-device" TESTS="^broker/|^preload/broker$|^attack/broker_config$|^share/" \
    TEST_LIMIT="120"
gm_outdir
export GPUMEM_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/broker-gpu.txt"
gm_build_all "$OUT/broker-build.log" "$BUILD_DIR" 3600 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON \
    -DGM_TEST_BACKEND=cuda -DGM_VALGRIND=OFF -DGM_WERROR=ON

# The tests through ctest (each with its own environment: the preload test
# runs on the sim with stub CUDA libraries), one at a time so their
# figures are not disturbed by each other.
fail=0
(cd "$BUILD_DIR" && ctest -R "$TESTS" --timeout "$TEST_LIMIT" --output-on-failure -V) \
    >"$OUT/broker-tests.log" 2>&1 || fail=1
grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|passed, [0-9]+ failed|ms at most|pages back in|: ok$' \
    "$OUT/broker-tests.log" | tee "$OUT/broker-tests.txt"
[ $fail = 0 ] || grep -E 'CHECK failed|returned .*, want|FAIL' "$OUT/broker-tests.log" | head -20
if [ "${BENCH:-1}" = 1 ]; then
    BUILD_DIR="$BUILD_DIR" OUT="$OUT" bench/run_broker_bench.sh >"$OUT/broker-bench.log" 2>&1
    echo "bench rc=$?"; tail -25 "$OUT/broker-bench.log"
fi
exit $fail
