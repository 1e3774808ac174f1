#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_share_bench.sh — build and run the sharing benchmark
# (bench/share_bench.c: gm_share_* between real processes — import latency,
# weight sync, reclaim after kill -9 on either side, read-only enforcement,
# and cuIpcOpenMemHandle for comparison) and write
# bench/results/DATE-GPU-share.{md,json}.
#
# usage: bench/run_share_bench.sh            (from anywhere)
# Environment:
#   OUT        also copy the results and the log there (default: none)
#   BUILD_DIR  gpumem build directory (default build-device)
#   QUICK=1    weight sync at 1 GiB instead of 8 GiB (SHARE_BENCH_QUICK=1)
#   GM_COMMIT  the commit recorded (default: HEAD's short hash, +changes when the tree differs; bench/commit_id.sh)
# The bench runs with GPUMEM_BACKEND unset (auto: cuda where an NVIDIA
# driver is installed).  When the pool ends up on another backend (no
# driver: the sim) the results go to $OUT (else BUILD_DIR/bench-results),
# never to bench/results.
# Needs: cmake, a C compiler, python3 (to read the GPU name back from the
# JSON when nvidia-smi is missing).  No CUDA toolkit: the legacy-IPC figure
# loads libcuda.so.1 with dlopen.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-device" QUICK="${SHARE_BENCH_QUICK:-0}"
gm_workdir

echo "=== build share_bench ($BUILD_DIR)"
gm_build "$work/cmake.log" "$BUILD_DIR" share_bench -DCMAKE_BUILD_TYPE=RelWithDebInfo || exit 1
bench="$BUILD_DIR/bench/share_bench"
[ -x "$bench" ] || { echo "FAILED: no $bench after the build"; exit 1; }

gm_banner "open files limit $(ulimit -n) (hard $(ulimit -Hn))"

# GM_COMMIT overrides the label (a copy of the tree without its git history).
GM_COMMIT="$(gm_commit_id)"
export GM_COMMIT
command="bench/run_share_bench.sh"
quick_env=()
if [ "$QUICK" = 1 ]; then
    command="QUICK=1 $command"
    quick_env=(SHARE_BENCH_QUICK=1)
fi

gm_run_bench "share_bench (weight sync $([ "$QUICK" = 1 ] && echo 1 || echo 8) GiB)" "$work/share" \
    env -u GPUMEM_BACKEND -u SHARE_BENCH_QUICK "${quick_env[@]}" \
    timeout --kill-after=10 1500 "$bench" --json "$work/share.json" --md "$work/share.md" --command "$command"
gm_publish share "$work/share" "$work/log.txt"
echo
echo "=== $base.md"
cat "$base.md"
exit "$st"
