#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/offload.sh — tags, offload and restore on a GPU: build
# (Release), the offload tests on the cuda backend (ctest -L offload), then
# bench/run_offload_bench.sh (bench/results/DATE-GPU-offload.{json,md}), then
# the PyTorch sleep/wake run (scripts/device/plugins/offload_torch.py).
#
# Run from the repository root:  OUT=/some/dir scripts/device/offload.sh
# Files under $OUT (few, on purpose): offload-build.log, offload-tests.log,
# offload-bench.log, DATE-GPU-offload.{json,md}, offload_torch.json,
# offload-torch.log; the summary of each part is printed.  A failing part is
# recorded and the next one still runs.  Exit status: the number of failed
# parts.  About 4 minutes on an H100; each part is cut to what is left of
# DEADLINE.
# Knobs (environment):
#   BUILD_DIR   build directory (build-device-offload)
#   TESTS       ctest label regex (^offload$); TEST_LIMIT seconds per test (120)
#   BENCH=0     skip the benchmark; SIZES (1GiB,16GiB), REPS (5), BLOCK (256MiB)
#   TORCH=0     skip the PyTorch run; LAYERS (16), DIM (8192): the model
#   DEADLINE    seconds for the whole script (540)
#   PYTHON      python3
#   BACKEND=sim a dry run without a GPU: tests and bench on the sim (small
#               sizes), PyTorch skipped
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-device-offload" BACKEND="cuda" TESTS="^offload\$" TEST_LIMIT="120" \
    DEADLINE="540" PYTHON="python3" LAYERS="16" DIM="8192"
if [ "$BACKEND" = sim ]; then
    SIZES="${SIZES:-64MiB,256MiB}"
    BLOCK="${BLOCK:-32MiB}"
    REPS="${REPS:-3}"
    TORCH=0
else
    SIZES="${SIZES:-1GiB,16GiB}"
    BLOCK="${BLOCK:-256MiB}"
    REPS="${REPS:-5}"
fi
gm_outdir
export GPUMEM_BACKEND="$BACKEND"
export GM_COMMIT="${GM_COMMIT:-$(git rev-parse --short --verify -q HEAD 2>/dev/null || echo none)}"
unset GPUMEM_BROKER GPUMEM_LIMIT GPUMEM_EVICT
gm_deadline_start
failed=()

gm_banner "backend $BACKEND; commit $GM_COMMIT"

# ---- build ----------------------------------------------------------------------------
echo "=== build ($BUILD_DIR, Release, tests on $BACKEND)"
start=$SECONDS
gm_build_all "$OUT/offload-build.log" "$BUILD_DIR" "$(left 300)" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
    -DGM_TEST_BACKEND="$BACKEND" -DGM_VALGRIND=OFF || failed+=(build)
echo "--- build: $((SECONDS - start)) s"

# ---- the offload tests ------------------------------------------------------------------
echo "=== ctest -L '$TESTS' (GPUMEM_BACKEND=$BACKEND)"
start=$SECONDS
if ! gm_time_for tests 30 240; then
    failed+=(tests)
else
    (cd "$BUILD_DIR" && timeout "$t" ctest -L "$TESTS" --timeout "$TEST_LIMIT" --output-on-failure -V) \
        >"$OUT/offload-tests.log" 2>&1 || failed+=(tests)
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|passed, [0-9]+ failed|No tests were found' "$OUT/offload-tests.log"
    if grep -q 'No tests were found' "$OUT/offload-tests.log"; then
        echo "no test labelled '$TESTS' in $BUILD_DIR (tests/offload/ missing?)"
        failed+=(tests)
    fi
    case " ${failed[*]} " in
    *" tests "*) grep -E 'CHECK failed|FAIL|returned .*, want|Timeout' "$OUT/offload-tests.log" | head -20 ;;
    esac
fi
echo "--- tests: $((SECONDS - start)) s"

# ---- the benchmark ----------------------------------------------------------------------
if [ "${BENCH:-1}" = 1 ]; then
    start=$SECONDS
    if ! gm_time_for bench 40 240; then
        failed+=(bench)
    else
        echo "=== bench/run_offload_bench.sh (SIZES=$SIZES REPS=$REPS BLOCK=$BLOCK)"
        BUILD_DIR="$BUILD_DIR" OUT="$OUT" SIZES="$SIZES" REPS="$REPS" BLOCK="$BLOCK" PYTHON="$PYTHON" \
            BENCH_TIMEOUT="$((t - 10))" bench/run_offload_bench.sh >"$OUT/offload-bench.log" 2>&1 || failed+=(bench)
        rm -f "$OUT/offload-bench-log.txt" # its content is in offload-bench.log
        sed -n '/^=== summary/,$p' "$OUT/offload-bench.log"
        grep -E '^FAILED|^WARNING' "$OUT/offload-bench.log" | head -10
        echo "--- bench: $((SECONDS - start)) s"
    fi
fi

# ---- PyTorch sleep / wake ------------------------------------------------------------------
if [ "${TORCH:-1}" = 1 ]; then
    start=$SECONDS
    if ! gm_time_for offload_torch.py 40 240; then
        failed+=(torch)
    elif [ ! -f "$BUILD_DIR/libgpumem.so" ]; then
        echo "=== offload_torch.py skipped: no $BUILD_DIR/libgpumem.so"
        failed+=(torch)
    else
        echo "=== scripts/device/plugins/offload_torch.py (LAYERS=$LAYERS DIM=$DIM)"
        GPUMEM_LIBRARY="$(cd "$BUILD_DIR" && pwd)/libgpumem.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
            timeout --kill-after=10 "$t" "$PYTHON" scripts/device/plugins/offload_torch.py \
            --out "$OUT/offload_torch.json" --layers "$LAYERS" --dim "$DIM" --budget "$((t - 10))" \
            >"$OUT/offload-torch.log" 2>&1 || failed+=(torch)
        grep -E '^offload_torch.py' "$OUT/offload-torch.log"
        "$PYTHON" - "$OUT/offload_torch.json" <<'EOF' || echo "(no readable $OUT/offload_torch.json: see offload-torch.log)"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("torch_skipped", "gpu", "torch", "model_bytes", "sleep_s", "wake_s", "sleep_GBps", "wake_GBps",
          "sleep_warm_s", "wake_warm_s", "freed_fraction", "freed_fraction_reserved", "hog_ok",
          "hog_exceeds_free_before_offload", "sleep_wake_identical", "params_identical", "warm_identical",
          "naive_sleep_s", "naive_wake_s", "naive_sleep_warm_s", "naive_wake_warm_s", "naive_freed_fraction",
          "naive_identical", "same_output_as_default_allocator", "errors"):
    if k in d:
        print("%-34s %s" % (k, json.dumps(d[k])))
EOF
        echo "--- torch: $((SECONDS - start)) s"
    fi
fi

echo "=== offload.sh: $((SECONDS - start_all)) s; failed parts: ${failed[*]:-none}"
exit "${#failed[@]}"
