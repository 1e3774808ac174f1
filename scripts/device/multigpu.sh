#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/multigpu.sh — several GPUs on a machine with two: build
# (Release), the multigpu tests and the api/share tests on the cuda backend,
# bench/multigpu_bench.cu (built here with nvcc: peer copies, NCCL all-reduce
# on registered gpumem buffers against ncclMemAlloc and cudaMalloc, access
# grants, compression), then a 2-rank DDP GPT-2 run with PyTorch's allocator
# and with gpumem (scripts/device/plugins/ddp_gpt2.py), whose losses must
# match; writes $OUT/DATE-GPU-multigpu.{json,md} with ddp_losses_identical.
#
# Run from the repository root:  OUT=/some/dir scripts/device/multigpu.sh
# Files under $OUT (few, on purpose): multigpu-build.log, multigpu-tests.log,
# multigpu-run.log, mempool{,-enable}.log, DATE-GPU-multigpu.{json,md}.
# Exit status: the number of failed parts.
# Knobs: BUILD_DIR (build-device-multigpu), DEADLINE (560 s), PYTHON, TORCH=0
# (no DDP run), TESTS (ctest label regex, ^(multigpu|api|share)$).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build-device-multigpu" DEADLINE="560" PYTHON="python3" \
    TESTS="^(multigpu|api|share)\$"
gm_outdir
export GPUMEM_BACKEND=cuda
export GM_COMMIT="${GM_COMMIT:-$(git rev-parse --short --verify -q HEAD 2>/dev/null || echo none)}"
unset GPUMEM_BROKER GPUMEM_LIMIT GPUMEM_EVICT GPUMEM_PEERS GPUMEM_NCCL GPUMEM_COMPRESSIBLE
gm_deadline_start
failed=()

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>/dev/null || true
nvidia-smi topo -m 2>/dev/null | head -6 || true
echo "host: $(nproc) cores; commit $GM_COMMIT"

echo "=== build ($BUILD_DIR, Release, tests on cuda)"
start=$SECONDS
gm_build_all "$OUT/multigpu-build.log" "$BUILD_DIR" "$(left 300)" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
    -DGM_TEST_BACKEND=cuda -DGM_VALGRIND=OFF || failed+=(build)
# NCCL: PyTorch's wheel, else the toolkit's.
NCCL_DIR="$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)"
for d in "$NCCL_DIR" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then NCCL_DIR="$d"; break; fi
done
echo "libnccl.so.2 from: ${NCCL_DIR:-not found}"
nvcc -O2 -std=c++17 -Iinclude bench/multigpu_bench.cu -o "$BUILD_DIR/multigpu_bench" \
    -L"$BUILD_DIR" -lgpumem -ldl -Xlinker -rpath="$(cd "$BUILD_DIR" && pwd)" >>"$OUT/multigpu-build.log" 2>&1 ||
    { echo "nvcc failed"; tail -20 "$OUT/multigpu-build.log"; failed+=(bench-build); }
echo "--- build: $((SECONDS - start)) s"

echo "=== ctest -L '$TESTS' (cuda)"
start=$SECONDS
(cd "$BUILD_DIR" && timeout "$(left 200)" ctest -L "$TESTS" --timeout 120 --output-on-failure) \
    >"$OUT/multigpu-tests.log" 2>&1 || failed+=(tests)
grep -E '^ *[0-9]+/[0-9]+ Test|tests passed' "$OUT/multigpu-tests.log" | grep -vE ' Passed ' | head -30
grep -E 'tests passed' "$OUT/multigpu-tests.log"
echo "--- tests: $((SECONDS - start)) s"

DATE="$(date -u +%Y-%m-%d)"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')"
JSON="$OUT/$DATE-${GPU:-GPU}-multigpu.json"
MD="$OUT/$DATE-${GPU:-GPU}-multigpu.md"
echo "=== bench/multigpu_bench"
start=$SECONDS
if [ -x "$BUILD_DIR/multigpu_bench" ]; then
    LD_LIBRARY_PATH="${NCCL_DIR:+$NCCL_DIR:}${LD_LIBRARY_PATH:-}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG \
        timeout "$(left 240)" "$BUILD_DIR/multigpu_bench" --json "$JSON" --md "$MD" \
        --command "scripts/device/multigpu.sh (bench/multigpu_bench.cu)" >"$OUT/multigpu-run.log" 2>&1 ||
        failed+=(bench)
    # NCCL's word on registration, per all-reduce run: buffers it registered
    # for IPC (zero-copy to the peer) and registrations it reused.
    awk '/^multigpu_bench: all-reduce/ { if (k) printf "%-32s IPC registered %d, reused %d\n", k, r, u; k = $3 " " $4; r = u = 0 }
         /IPC register buffer/ { r++ } /IPC reuse buffer/ { u++ }
         END { if (k) printf "%-32s IPC registered %d, reused %d\n", k, r, u }' "$OUT/multigpu-run.log"
    grep -v 'NCCL INFO' "$OUT/multigpu-run.log" | tail -5
    cat "$MD" 2>/dev/null
fi
echo "--- bench: $((SECONDS - start)) s"

if [ "${TORCH:-1}" = 1 ]; then
    echo "=== DDP GPT-2, 2 ranks: PyTorch's allocator, then gpumem"
    start=$SECONDS
    for a in default gpumem; do
        GPUMEM_LIBRARY="$(cd "$BUILD_DIR" && pwd)/libgpumem.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
            timeout --kill-after=10 "$(left 150)" "$PYTHON" scripts/device/plugins/ddp_gpt2.py \
            --allocator "$a" --out "$OUT/ddp-$a.json" >>"$OUT/multigpu-run.log" 2>&1 || failed+=("ddp-$a")
        grep -E "^$a:" "$OUT/multigpu-run.log" | tail -1
    done
    "$PYTHON" - "$JSON" "$MD" "$OUT/ddp-default.json" "$OUT/ddp-gpumem.json" <<'EOF' || failed+=(ddp-compare)
import json, sys
jp, mp, dp, gp = sys.argv[1:5]
try:
    d, g = json.load(open(dp)), json.load(open(gp))
except Exception as e:  # noqa: BLE001
    print("ddp: no results (%s)" % e); sys.exit(1)
same = d["losses"] == g["losses"] and len(d["losses"]) > 0
r = json.load(open(jp))
r["ddp_losses_identical"] = same
r["ddp"] = {"steps": d["steps"], "layers": d["layers"], "world": d["world"], "torch": d["torch"],
            "nccl": d["nccl"], "losses_default": d["losses"], "losses_gpumem": g["losses"],
            "median_step_ms_default": 1e3 * d["median_step_s"], "median_step_ms_gpumem": 1e3 * g["median_step_s"]}
json.dump(r, open(jp, "w"), indent=1)
with open(mp, "a") as f:
    f.write("\nDDP GPT-2 (%d layers, %d steps, 2 ranks, NCCL %s, torch %s): losses identical to PyTorch's "
            "allocator: %s; median step %.1f ms (PyTorch's allocator) vs %.1f ms (gpumem, GPUMEM_NCCL=1).\n"
            % (d["layers"], d["steps"], d["nccl"], d["torch"], "yes" if same else "NO",
               1e3 * d["median_step_s"], 1e3 * g["median_step_s"]))
print("ddp_losses_identical:", same)
sys.exit(0 if same else 1)
EOF
    rm -f "$OUT/ddp-default.json" "$OUT/ddp-gpumem.json" # merged into the results
    echo "--- ddp: $((SECONDS - start)) s"
    echo "=== gpumem.torch.nccl_mem_pool + register_mem_pool, 2 ranks"
    start=$SECONDS
    for m in "" --enable; do
        tag=${m:+-enable}
        GPUMEM_LIBRARY="$(cd "$BUILD_DIR" && pwd)/libgpumem.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG timeout --kill-after=10 "$(left 120)" "$PYTHON" \
            scripts/device/plugins/nccl_mempool.py $m --out "$OUT/mempool$tag.json" >"$OUT/mempool$tag.log" 2>&1 ||
            failed+=("mempool$tag")
        grep -E '^nccl_mempool' "$OUT/mempool$tag.log" || tail -5 "$OUT/mempool$tag.log"
        echo "NCCL: ncclCommRegister $(grep -c 'INFO register comm' "$OUT/mempool$tag.log"), IPC registered" \
            "$(grep -c 'IPC register buffer' "$OUT/mempool$tag.log"), reused $(grep -c 'IPC reuse buffer' "$OUT/mempool$tag.log")"
    done
    "$PYTHON" - "$JSON" "$OUT/mempool.json" "$OUT/mempool-enable.json" <<'EOF2' || true
import json, sys
r = json.load(open(sys.argv[1]))
for k, p in (("torch_nccl_mem_pool", sys.argv[2]), ("torch_nccl_mem_pool_under_enable", sys.argv[3])):
    try:
        r[k] = json.load(open(p))
    except Exception as e:  # noqa: BLE001
        r[k] = {"error": str(e)}
json.dump(r, open(sys.argv[1], "w"), indent=1)
EOF2
    rm -f "$OUT/mempool.json" "$OUT/mempool-enable.json"
    echo "--- mempool: $((SECONDS - start)) s"
fi
[ -f "$JSON" ] && "$PYTHON" scripts/device/multigpu_summary.py "$JSON" "$MD" "$OUT/multigpu-run.log" ||
    failed+=(summary)
echo "=== multigpu.sh: $((SECONDS - start_all)) s; failed parts: ${failed[*]:-none}"
exit "${#failed[@]}"
