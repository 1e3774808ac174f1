#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/train_calls.sh — GPT-2 and a small Llama trained with PyTorch's
# allocator and under gpumem.torch.enable(), each in its own process
# (scripts/device/plugins/gpt2_train.py), and under gpumem with two heaps
# (GPUMEM_HEAPS=2: PyTorch's autograd thread gets a heap of its own); writes
# $OUT/DATE-GPU-calls-torch.json:
# per model, whether the losses are identical, the median step times, and
# gpumem's driver calls and stream synchronisations after the first and after
# the second step, PyTorch's own cudaMalloc calls (num_device_alloc) over the
# same steps, and the live peaks after the first and the second step.  The
# calls after the first step are also split into growth (new pages: their
# creation, map and access) and moving (unmaps, maps of pages that existed,
# events, waits): growth is what a higher live peak needs, moving is churn.  Run
# from the repository root on the GPU machine (after `make`).  Knobs: OUT
# (build/train-calls), STEPS (20), BATCH (8), SEQ (512), GM_COMMIT (the
# commit recorded; bench/commit_id.sh).
set -u -o pipefail
OUT="${OUT:-build/train-calls}"
STEPS="${STEPS:-20}" BATCH="${BATCH:-8}" SEQ="${SEQ:-512}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export GPUMEM_LIBRARY="${GPUMEM_LIBRARY:-$PWD/build/libgpumem.so}"
for model in gpt2 llama; do
    layers=12
    [ "$model" = llama ] && layers=8
    for run in default gpumem gpumem-heaps2; do
        alloc="${run%-heaps2}" heaps=1
        [ "$run" = gpumem-heaps2 ] && heaps=2
        GPUMEM_HEAPS=$heaps timeout 300 python3 scripts/device/plugins/gpt2_train.py --model "$model" \
            --allocator "$alloc" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --layers "$layers" \
            --out "$OUT/$model-$run.json" >"$OUT/$model-$run.log" 2>&1 ||
            { echo "$model $run failed:"; tail -n 20 "$OUT/$model-$run.log"; }
    done
done
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' ' '-')"
. bench/commit_id.sh
python3 - "$OUT" "$(date -u +%Y-%m-%d)" "${gpu:-GPU}" "$(gm_commit_id)" <<'PY'
import json, os, sys
out, date, gpu, commit = sys.argv[1:]
res = {"date": date, "gpu": gpu, "commit": commit, "command": "scripts/device/train_calls.sh",
       "models": {}}


def moving(kinds):
    """Calls of a by-kind dict that move pages or fence them: unmaps, maps
    beyond the new pages' own, events and waits (the rest is growth); the
    churn controller counts the same (remap_calls in src/core/alloc.c)."""
    if kinds is None:
        return None
    k = lambda n: kinds.get(n, 0)
    return (k("unmap") + max(0, k("map") - k("phys_create")) + k("event_record") +
            k("event_query") + k("stream_sync"))


def gm_keys(g):
    a1, a2 = g.get("driver_calls_after_first_step"), g.get("driver_calls_after_second_step")
    m1 = moving(g.get("driver_calls_after_first_step_by_kind"))
    return {
        "reserved_over_allocated": g["peak_reserved"] / g["peak_allocated"],
        "driver_calls_after_first_step": a1,
        "driver_calls_after_first_step_by_kind": g.get("driver_calls_after_first_step_by_kind"),
        "moving_calls_after_first_step": m1,
        "growth_calls_after_first_step": None if a1 is None or m1 is None else a1 - m1,
        "stream_syncs_after_first_step": g.get("stream_syncs_after_first_step"),
        "driver_calls_after_second_step": a2,
        "driver_calls_after_second_step_by_kind": g.get("driver_calls_after_second_step_by_kind"),
        "stream_syncs_after_second_step": g.get("stream_syncs_after_second_step"),
    }
for m in ("gpt2", "llama"):
    try:
        d = json.load(open(os.path.join(out, m + "-default.json")))
        g = json.load(open(os.path.join(out, m + "-gpumem.json")))
    except Exception as e:  # a failed run leaves no file
        res["models"][m] = {"error": str(e)}
        continue
    try:
        h = json.load(open(os.path.join(out, m + "-gpumem-heaps2.json")))
        heaps2 = dict(gm_keys(h), losses_identical=d["losses"] == h["losses"],
                      step_time_ratio=h["median_step_s_5_20"] / d["median_step_s_5_20"])
    except Exception as e:
        heaps2 = {"error": str(e)}
    res["models"][m] = {
        "losses_identical": d["losses"] == g["losses"],
        "step_time_ratio": g["median_step_s_5_20"] / d["median_step_s_5_20"],
        "default_reserved_over_allocated": d["peak_reserved"] / d["peak_allocated"],
        **gm_keys(g),
        "heaps2": heaps2,
        # PyTorch's allocator in the same run: its cudaMalloc calls (num_device_alloc)
        "default_device_allocs_after_first_step": d.get("device_allocs_after_first_step"),
        "default_device_allocs_after_second_step": d.get("device_allocs_after_second_step"),
        "allocated_peak_after_steps_1_2_end": {"default": d.get("allocated_peak_after_steps_1_2_end"),
                                               "gpumem": g.get("allocated_peak_after_steps_1_2_end")},
    }
path = os.path.join(out, f"{date}-{gpu}-calls-torch.json")
json.dump(res, open(path, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
