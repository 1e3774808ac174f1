#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/ctest_rounds.sh — the whole ctest suite on the cuda backend,
# ROUNDS times in a row at -j equal to the machine's cores (the load the
# suite meets on a busy machine), to show that no test depends on timing.
#
# Run from the repository root on the GPU machine:
#   ROUNDS=3 scripts/device/ctest_rounds.sh
# Builds in $BUILD_DIR (build-device) with GM_TEST_BACKEND=cuda, then runs
# `ctest -j $(nproc)` ROUNDS times; logs and a summary go to $OUT
# (build-device/out by default): ctest-round-N.log, ctest-rounds.md.
# Exit status: 0 when every round passed.
set -u -o pipefail
ROUNDS="${ROUNDS:-3}"
BUILD_DIR="${BUILD_DIR:-build-device}"
OUT="${OUT:-$BUILD_DIR/out}"
JOBS="${CTEST_JOBS:-$(nproc)}"
CTEST_TIMEOUT="${CTEST_TIMEOUT:-300}"
mkdir -p "$OUT"
export GPUMEM_TEST_BACKEND=cuda

summary="$OUT/ctest-rounds.md"
{
    echo "# ctest on the cuda backend, $ROUNDS rounds at -j $JOBS"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- commit: $(. bench/commit_id.sh && gm_commit_id)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
    echo "- CPUs: $(nproc)"
    echo "- command: \`ROUNDS=$ROUNDS scripts/device/ctest_rounds.sh\`"
    echo
} >"$summary"

rm -rf "$BUILD_DIR/cmake-build"
if ! { cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGM_TEST_BACKEND=cuda \
        -DGM_WERROR=ON -DBUILD_TESTING=ON >"$OUT/build.log" 2>&1 &&
       cmake --build "$BUILD_DIR" -j "$(nproc)" >>"$OUT/build.log" 2>&1; }; then
    echo "- build: FAILED (build.log)" >>"$summary"
    tail -n 30 "$OUT/build.log"
    cat "$summary"
    exit 1
fi

status=0
echo "| round | tests | passed | failed | skipped | seconds |" >>"$summary"
echo "|---:|---:|---:|---:|---:|---:|" >>"$summary"
for r in $(seq 1 "$ROUNDS"); do
    log="$OUT/ctest-round-$r.log"
    start=$(date +%s)
    (cd "$BUILD_DIR" && ctest -j "$JOBS" --timeout "$CTEST_TIMEOUT" --output-on-failure \
        --no-tests=error) >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    total=$(grep -oE 'out of [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+')
    failed=$(grep -oE '[0-9]+ tests failed' "$log" | tail -n 1 | grep -oE '^[0-9]+')
    skipped=$(grep -c '\*\*\*Skipped' "$log")
    total=${total:-0}; failed=${failed:-0}
    echo "| $r | $total | $((total - failed - skipped)) | $failed | $skipped | $secs |" >>"$summary"
    if [ "$rc" -ne 0 ]; then
        status=1
        { echo; echo "Round $r failures:"; echo '```'
          sed -n '/The following tests FAILED/,$p' "$log"; echo '```'; } >>"$summary.fail"
    fi
done
[ -f "$summary.fail" ] && cat "$summary.fail" >>"$summary" && rm -f "$summary.fail"
echo >>"$summary"
echo "Result: $([ $status -eq 0 ] && echo "every round passed" || echo "FAILED")" >>"$summary"
cat "$summary"
exit "$status"
