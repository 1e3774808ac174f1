#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/plugins.sh — the plug-ins on a GPU: PyTorch, CuPy, LD_PRELOAD.
#
# Run from the repository root on the GPU machine (it runs `make` first when
# build/libgpumem.so or build/libgpumem_preload.so is missing).  Parts, each
# recorded as pass/fail with its figures, none stopping the others:
#   gpt2       GPT-2 (transformers, from its config) trains STEPS steps with
#              PyTorch's default allocator and, in another process, with
#              gpumem.torch.enable(); losses compared exactly, peaks and
#              median step times (steps 5..STEPS) compared; writes
#              $OUT/DATE-GPU-torch.md and $OUT/DATE-GPU-torch.json
#   torch_oom  an 8 GiB tensor under GPUMEM_LIMIT=2GiB: what PyTorch raises,
#              whether CUDA works after, gpumem.max_batch_size on an MLP; and
#              the same with GPUMEM_TORCH_OOM=null (allocator returns NULL)
#   cupy       FFTs, matmuls, sums of varying sizes under gpumem.cupy.enable(),
#              checked against NumPy; CuPy's OutOfMemoryError over a limit
#   preload_c  scripts/device/plugins/vecadd.cu built with nvcc (static
#              runtime) run plain, under LD_PRELOAD, and under LD_PRELOAD with
#              GPUMEM_LIMIT=512MiB (an allocation must fail)
#   preload_torch  a PyTorch training loop (default allocator) under LD_PRELOAD
# Logs and JSON go to $OUT (default build/plugins-out); the last lines are a
# compact summary.  Exit status 0 when every part passed.
#
# Knobs: OUT, RESULTS_DIR (where DATE-GPU-torch.{md,json} go: $OUT; use
#        bench/results to commit them), STEPS (20), BATCH (8), SEQ (512),
#        LAYERS (12), PARTS (all), PYTHON (python3), NVCC (nvcc),
#        PART_TIMEOUT (seconds, 300).
# shellcheck disable=SC2317  # parts are called by name
set -u -o pipefail

PARTS="${PARTS:-gpt2 torch_oom cupy preload_c preload_torch}"
OUT="${OUT:-build/plugins-out}"
STEPS="${STEPS:-20}"
BATCH="${BATCH:-8}"
SEQ="${SEQ:-512}"
LAYERS="${LAYERS:-12}"
PYTHON="${PYTHON:-python3}"
NVCC="${NVCC:-nvcc}"
PART_TIMEOUT="${PART_TIMEOUT:-300}"
RESULTS_DIR="${RESULTS_DIR:-}"

if [ ! -f CMakeLists.txt ] || [ ! -d python/gpumem ]; then
    echo "plugins.sh: run me from the gpumem repository root" >&2
    exit 2
fi
mkdir -p "$OUT" "${RESULTS_DIR:-$OUT}"
OUT="$(cd "$OUT" && pwd)"
RESULTS_DIR="$(cd "${RESULTS_DIR:-$OUT}" && pwd)"
ROOT="$(pwd)"
HERE="$ROOT/scripts/device/plugins"

if [ ! -f build/libgpumem.so ] || [ ! -f build/libgpumem_preload.so ]; then
    echo "=== make"
    make >"$OUT/make.log" 2>&1 || { tail -n 30 "$OUT/make.log"; echo "plugins.sh: make failed"; exit 1; }
fi

export GPUMEM_BACKEND=cuda
export GPUMEM_LIBRARY="$ROOT/build/libgpumem.so"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
PRELOAD="$ROOT/build/libgpumem_preload.so"

declare -A RESULT FIGURES
note() { printf '\n=== %s ===\n' "$*"; }
record() { # part pass|FAIL figures...
    RESULT[$1]=$2
    FIGURES[$1]="${*:3}"
    printf -- '--- %s: %s %s\n' "$1" "$2" "${*:3}"
}
# json FILE EXPR: a Python expression over the object `d` loaded from FILE.
json() { "$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null; }

DATE="$(date -u +%Y-%m-%d)"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' ' '-' | tr -cd 'A-Za-z0-9._-')"
GPU="${GPU:-unknown-GPU}"
{ nvidia-smi 2>&1 | head -n 15; "$PYTHON" --version; "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
  "$PYTHON" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1; "$PYTHON" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1
  "$NVCC" --version 2>&1 | tail -n 2; } >"$OUT/env.log"
cat "$OUT/env.log"

part_gpt2() {
    local args=(--steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --layers "$LAYERS")
    local cmd_default="$PYTHON scripts/device/plugins/gpt2_train.py --allocator default ${args[*]}"
    local cmd_gpumem="$PYTHON scripts/device/plugins/gpt2_train.py --allocator gpumem ${args[*]}"
    timeout "$PART_TIMEOUT" "$PYTHON" "$HERE/gpt2_train.py" --allocator default "${args[@]}" \
        --out "$OUT/gpt2-default.json" >"$OUT/gpt2-default.log" 2>&1
    local rd=$?
    timeout "$PART_TIMEOUT" "$PYTHON" "$HERE/gpt2_train.py" --allocator gpumem "${args[@]}" \
        --out "$OUT/gpt2-gpumem.json" >"$OUT/gpt2-gpumem.log" 2>&1
    local rg=$?
    tail -n 3 "$OUT/gpt2-default.log" "$OUT/gpt2-gpumem.log"
    if [ "$rd" -ne 0 ] || [ "$rg" -ne 0 ]; then
        record gpt2 FAIL "default rc=$rd gpumem rc=$rg (see gpt2-*.log)"
        return
    fi
    local stem="$RESULTS_DIR/$DATE-$GPU-torch"
    "$PYTHON" - "$OUT/gpt2-default.json" "$OUT/gpt2-gpumem.json" "$stem" "$DATE" "$GPU" \
        "scripts/device/plugins.sh (PARTS=gpt2 STEPS=$STEPS BATCH=$BATCH SEQ=$SEQ LAYERS=$LAYERS): $cmd_default; $cmd_gpumem" <<'EOF'
import json, sys
dflt, gm = (json.load(open(p)) for p in sys.argv[1:3])
stem, date, gpu, command = sys.argv[3:7]
identical = dflt["losses"] == gm["losses"]
first_diff = next((i for i, (x, y) in enumerate(zip(dflt["losses"], gm["losses"])) if x != y), None)
r = {
    "date": date, "gpu": gpu, "command": command,
    "loss_identical": identical,
    "reserved_over_allocated": gm["peak_reserved"] / gm["peak_allocated"],
    "default_reserved_over_allocated": dflt["peak_reserved"] / dflt["peak_allocated"],
    "step_time_ratio": gm["median_step_s_5_20"] / dflt["median_step_s_5_20"],
    "steps": gm["steps"],
    "batch": gm["batch"], "seq": gm["seq"], "layers": gm["layers"], "torch": gm["torch"],
    "median_step_ms": {"default": 1e3 * dflt["median_step_s_5_20"], "gpumem": 1e3 * gm["median_step_s_5_20"]},
    "peak_reserved": {"default": dflt["peak_reserved"], "gpumem": gm["peak_reserved"]},
    "peak_allocated": {"default": dflt["peak_allocated"], "gpumem": gm["peak_allocated"]},
    "first_differing_step": first_diff,
    "losses": {"default": dflt["losses"], "gpumem": gm["losses"]},
    "gpumem_hooks": gm.get("hooks"),
    "gpumem_after_empty_cache": {"reserved": gm.get("after_empty_cache_reserved"),
                                 "allocated": gm.get("after_empty_cache_allocated")},
    "allocated_definition": "default: torch.cuda.max_memory_allocated (block sizes PyTorch hands out); "
                            "gpumem: allocated_peak, the peak of bytes PyTorch requested (a plugged "
                            "allocator is asked for exact tensor sizes); reserved: max_memory_reserved "
                            "vs gpumem reserved_peak (physical pages held)",
}
r["meets"] = {"loss_identical": identical, "reserved_over_allocated<=1.02": r["reserved_over_allocated"] <= 1.02,
              "step_time_ratio<=1.02": r["step_time_ratio"] <= 1.02}
json.dump(r, open(stem + ".json", "w"), indent=1)
md = f"""# GPT-2 training with gpumem as PyTorch's allocator — {gpu}, {date}

Command: `{command}`

GPT-2 ({r['layers']} layers, from its config, eager attention), AdamW, batch {r['batch']} x {r['seq']} tokens,
{r['steps']} steps, fp32, `torch.use_deterministic_algorithms(True)`, `CUBLAS_WORKSPACE_CONFIG=:4096:8`,
same seeds; each allocator in its own process. PyTorch {r['torch']}.

| | PyTorch default | gpumem | target |
|---|---|---|---|
| losses identical (all {r['steps']} steps) | | {'yes' if identical else 'NO (first difference at step %s)' % first_diff} | yes |
| peak reserved / peak allocated | {r['default_reserved_over_allocated']:.4f} | {r['reserved_over_allocated']:.4f} | <= 1.02 |
| peak reserved (bytes) | {dflt['peak_reserved']} | {gm['peak_reserved']} | |
| peak allocated (bytes) | {dflt['peak_allocated']} | {gm['peak_allocated']} | |
| median step, steps 5-{r['steps']} (ms) | {r['median_step_ms']['default']:.2f} | {r['median_step_ms']['gpumem']:.2f} | |
| step time ratio gpumem / default | | {r['step_time_ratio']:.4f} | <= 1.02 |

Allocated: PyTorch's `max_memory_allocated` for the default allocator; for gpumem `allocated_peak`, the
peak of the bytes PyTorch asked for (a plugged allocator receives exact tensor sizes, so this is the
comparable figure). Reserved: `max_memory_reserved` vs gpumem's `reserved_peak` (physical pages held).
After `torch.cuda.empty_cache()` (wired to gm_trim) gpumem held {gm.get('after_empty_cache_reserved')} bytes
reserved for {gm.get('after_empty_cache_allocated')} bytes allocated. Hooks wired: {', '.join(gm.get('hooks') or [])}.

Last loss: default {dflt['losses'][-1]}, gpumem {gm['losses'][-1]}.
"""
open(stem + ".md", "w").write(md)
print(md)
EOF
    local f="$stem.json"
    if [ ! -f "$f" ]; then record gpt2 FAIL "no results file"; return; fi
    local li ra rd st
    li=$(json "$f" 'd["loss_identical"]'); ra=$(json "$f" '"%.4f" % d["reserved_over_allocated"]')
    rd=$(json "$f" '"%.4f" % d["default_reserved_over_allocated"]'); st=$(json "$f" '"%.4f" % d["step_time_ratio"]')
    local ok=pass
    [ "$(json "$f" 'all(d["meets"].values())')" = "True" ] || ok=FAIL
    record gpt2 "$ok" "losses_identical=$li reserved/allocated=$ra (default $rd) step_time_ratio=$st -> $stem.{md,json}"
}

part_torch_oom() {
    GPUMEM_LIMIT=2GiB timeout "$PART_TIMEOUT" "$PYTHON" "$HERE/torch_oom.py" >"$OUT/torch-oom.json" 2>"$OUT/torch-oom.log"
    local r1=$?
    GPUMEM_LIMIT=2GiB GPUMEM_TORCH_OOM=null timeout 120 "$PYTHON" "$HERE/torch_oom.py" >"$OUT/torch-oom-null.json" 2>"$OUT/torch-oom-null.log"
    local r2=$?
    cat "$OUT/torch-oom.json" "$OUT/torch-oom-null.json"; tail -n 5 "$OUT/torch-oom.log" "$OUT/torch-oom-null.log"
    local exc works mbs
    exc=$(json "$OUT/torch-oom.json" 'd.get("exception")'); works=$(json "$OUT/torch-oom.json" 'd.get("cuda_works_after")')
    mbs=$(json "$OUT/torch-oom.json" 'd.get("max_batch_size")')
    local ok=pass
    [ "$r1" -eq 0 ] && [ "$works" = "True" ] && [ "$exc" != "None" ] && [ -n "$exc" ] && [ "$mbs" != "None" ] || ok=FAIL
    record torch_oom "$ok" "rc=$r1 exception=$exc cuda_works_after=$works max_batch_size=$mbs;" \
        "null mode: rc=$r2 exception=$(json "$OUT/torch-oom-null.json" 'd.get("exception")') cuda_works_after=$(json "$OUT/torch-oom-null.json" 'd.get("cuda_works_after")')"
}

part_cupy() {
    timeout "$PART_TIMEOUT" "$PYTHON" "$HERE/cupy_work.py" >"$OUT/cupy.json" 2>"$OUT/cupy.log"
    local rc=$?
    cat "$OUT/cupy.json"; tail -n 5 "$OUT/cupy.log"
    local ok=FAIL
    [ "$rc" -eq 0 ] && [ "$(json "$OUT/cupy.json" 'd["pass"]')" = "True" ] && ok=pass
    record cupy "$ok" "rc=$rc checks=$(json "$OUT/cupy.json" 'sum(1 for _, k in d["checks"] if k)')/$(json "$OUT/cupy.json" 'len(d["checks"])') allocs=$(json "$OUT/cupy.json" 'd["alloc_count"]') reserved_peak=$(json "$OUT/cupy.json" 'd["reserved_peak"]')"
}

# served LOG: "allocations re-entered" from the preload's verbose report.
served() { sed -n 's/^gpumem preload: \([0-9]*\) allocations.* \([0-9]*\) re-entered$/\1 \2/p' "$1" | tail -n 1; }

part_preload_c() {
    local exe="$OUT/vecadd" stubs
    # -lcuda links against the toolkit's stub library (the driver may ship
    # only libcuda.so.1); at run time the driver's libcuda.so.1 is used.
    stubs="$(dirname "$(command -v "$NVCC" || echo /usr/local/cuda/bin/nvcc)")/../lib64/stubs"
    if ! "$NVCC" -O2 -o "$exe" "$HERE/vecadd.cu" -L"$stubs" -lcuda >"$OUT/vecadd-build.log" 2>&1; then
        cat "$OUT/vecadd-build.log"; record preload_c FAIL "nvcc failed"; return
    fi
    timeout 120 "$exe" >"$OUT/vecadd-plain.log" 2>&1; local r0=$?
    GPUMEM_PRELOAD_VERBOSE=1 LD_PRELOAD="$PRELOAD" timeout 120 "$exe" >"$OUT/vecadd-preload.log" 2>&1; local r1=$?
    GPUMEM_PRELOAD_VERBOSE=1 GPUMEM_LIMIT=512MiB LD_PRELOAD="$PRELOAD" timeout 120 "$exe" limit 512 >"$OUT/vecadd-limit.log" 2>&1; local r2=$?
    tail -n 8 "$OUT/vecadd-plain.log" "$OUT/vecadd-preload.log" "$OUT/vecadd-limit.log"
    local s1 s2 n1 re1 n2
    s1=$(served "$OUT/vecadd-preload.log"); n1=${s1% *}; re1=${s1#* }
    s2=$(served "$OUT/vecadd-limit.log"); n2=${s2% *}
    local ok=FAIL
    [ "$r0" -eq 0 ] && [ "$r1" -eq 0 ] && [ "$r2" -eq 0 ] && [ "${n1:-0}" -ge 5 ] && [ "${re1:-1}" -eq 0 ] && ok=pass
    record preload_c "$ok" "plain rc=$r0; preload rc=$r1 gpumem_allocations=${n1:-none} re-entered=${re1:-?};" \
        "limit rc=$r2 gpumem_allocations=${n2:-none} ($(grep -m1 'failed after' "$OUT/vecadd-limit.log"))"
}

part_preload_torch() {
    GPUMEM_PRELOAD_VERBOSE=1 LD_PRELOAD="$PRELOAD" timeout "$PART_TIMEOUT" "$PYTHON" "$HERE/torch_preload.py" \
        >"$OUT/torch-preload.json" 2>"$OUT/torch-preload.log"
    local rc=$?
    cat "$OUT/torch-preload.json"; grep '^gpumem preload' "$OUT/torch-preload.log" | tail -n 4; tail -n 3 "$OUT/torch-preload.log"
    local s n re
    s=$(served "$OUT/torch-preload.log"); n=${s% *}; re=${s#* }
    local ok=FAIL
    [ "$rc" -eq 0 ] && [ "$(json "$OUT/torch-preload.json" 'd["decreased"] and d["big_ok"]')" = "True" ] \
        && [ "${n:-0}" -ge 1 ] && [ "${re:-1}" -eq 0 ] && ok=pass
    record preload_torch "$ok" "rc=$rc loss $(json "$OUT/torch-preload.json" '"%.4f -> %.4f" % (d["loss_first"], d["loss_last"])') gpumem_allocations=${n:-none} re-entered=${re:-?}"
}

for p in $PARTS; do
    note "$p"
    if declare -F "part_$p" >/dev/null; then "part_$p"; else record "$p" FAIL "unknown part"; fi
done

note "summary ($OUT)"
status=0
for p in $PARTS; do
    printf '%-14s %-4s %s\n' "$p" "${RESULT[$p]:-FAIL}" "${FIGURES[$p]:-}"
    [ "${RESULT[$p]:-FAIL}" = pass ] || status=1
done | tee "$OUT/summary.log"
grep -q ' FAIL ' "$OUT/summary.log" && status=1
exit $status
