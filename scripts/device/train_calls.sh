#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/train_calls.sh — GPT-2 and a small Llama trained with PyTorch's
# allocator and under gpumem.torch.enable(), each in its own process
# (scripts/device/plugins/gpt2_train.py); writes $OUT/DATE-GPU-torch-calls.json:
# per model, whether the losses are identical, the median step times, and
# gpumem's driver calls and stream synchronisations after the first and after
# the second step, PyTorch's own cudaMalloc calls (num_device_alloc) over the
# same steps, and the live peaks after the first and the second step.  Run
# from the repository root on the GPU machine (after `make`).  Knobs: OUT
# (build/train-calls), STEPS (20), BATCH (8), SEQ (512).
set -u -o pipefail
OUT="${OUT:-build/train-calls}"
STEPS="${STEPS:-20}" BATCH="${BATCH:-8}" SEQ="${SEQ:-512}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export GPUMEM_LIBRARY="${GPUMEM_LIBRARY:-$PWD/build/libgpumem.so}"
for model in gpt2 llama; do
    layers=12
    [ "$model" = llama ] && layers=8
    for alloc in default gpumem; do
        timeout 300 python3 scripts/device/plugins/gpt2_train.py --model "$model" --allocator "$alloc" \
            --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --layers "$layers" \
            --out "$OUT/$model-$alloc.json" >"$OUT/$model-$alloc.log" 2>&1 ||
            { echo "$model $alloc failed:"; tail -n 20 "$OUT/$model-$alloc.log"; }
    done
done
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' ' '-')"
python3 - "$OUT" "$(date -u +%Y-%m-%d)" "${gpu:-GPU}" <<'PY'
import json, os, sys
out, date, gpu = sys.argv[1:]
res = {"date": date, "gpu": gpu, "command": "scripts/device/train_calls.sh", "models": {}}
for m in ("gpt2", "llama"):
    try:
        d = json.load(open(os.path.join(out, m + "-default.json")))
        g = json.load(open(os.path.join(out, m + "-gpumem.json")))
    except Exception as e:  # a failed run leaves no file
        res["models"][m] = {"error": str(e)}
        continue
    res["models"][m] = {
        "losses_identical": d["losses"] == g["losses"],
        "step_time_ratio": g["median_step_s_5_20"] / d["median_step_s_5_20"],
        "reserved_over_allocated": g["peak_reserved"] / g["peak_allocated"],
        "default_reserved_over_allocated": d["peak_reserved"] / d["peak_allocated"],
        "driver_calls_after_first_step": g.get("driver_calls_after_first_step"),
        "driver_calls_after_first_step_by_kind": g.get("driver_calls_after_first_step_by_kind"),
        "stream_syncs_after_first_step": g.get("stream_syncs_after_first_step"),
        "driver_calls_after_second_step": g.get("driver_calls_after_second_step"),
        "driver_calls_after_second_step_by_kind": g.get("driver_calls_after_second_step_by_kind"),
        "stream_syncs_after_second_step": g.get("stream_syncs_after_second_step"),
        # PyTorch's allocator in the same run: its cudaMalloc calls (num_device_alloc)
        "default_device_allocs_after_first_step": d.get("device_allocs_after_first_step"),
        "default_device_allocs_after_second_step": d.get("device_allocs_after_second_step"),
        "allocated_peak_after_steps_1_2_end": {"default": d.get("allocated_peak_after_steps_1_2_end"),
                                               "gpumem": g.get("allocated_peak_after_steps_1_2_end")},
    }
path = os.path.join(out, f"{date}-{gpu}-torch-calls.json")
json.dump(res, open(path, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
