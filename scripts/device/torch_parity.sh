#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device/torch_parity.sh — what a PyTorch user keeps under
# gpumem.torch.enable(), on a GPU.  Builds libgpumem.so (Release) and the
# native allocator (gpumem.torch.build_native, timed), then runs one part:
#   probe   every row of the parity matrix in a fresh process with PyTorch's
#           allocator, gpumem's native allocator and gpumem's pluggable one
#           (plugins/torch_parity_probe.py) -> $OUT/parity-probe.json
#   train   GPT-2 (transformers) and ViT-B/16 (timm) training, PyTorch's
#           allocator and gpumem native interleaved, ROUNDS rounds of STEPS
#           steps; GPT-2 small in plain PyTorch eager and with the whole step
#           captured in a CUDA graph, under both allocators
#           (plugins/torch_parity_train.py) -> $OUT/parity-train.json
# PART=probe|train (both when unset; one run then takes ~10 minutes).  Then
# scripts/device/torch_parity_summary.py merges the two files into
# bench/results/DATE-GPU-torch-parity.{json,md}.
# Knobs: OUT (build-device/out), PART, ROUNDS (3), STEPS (30), PYTHON.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/lib.sh
gm_default PART="probe train" ROUNDS="3" STEPS="30" PYTHON="python3"
gm_outdir

gm_build "$OUT/parity-build.log" build-parity "" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF || exit 1
export GPUMEM_BACKEND=cuda GPUMEM_LIBRARY="$PWD/build-parity/libgpumem.so"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" GPUMEM_CACHE_DIR="$PWD/build-parity/cache"
rm -rf "$GPUMEM_CACHE_DIR"
t0=$(date +%s.%N)
"$PYTHON" -c 'import gpumem.torch as t; print(t.build_native())' || { echo "torch_parity.sh: build_native failed"; exit 1; }
t1=$(date +%s.%N)
BUILD_S=$("$PYTHON" -c "print(round($t1 - $t0, 1))")
echo "native allocator built in $BUILD_S s"

for part in $PART; do
    case $part in
    probe)
        "$PYTHON" scripts/device/plugins/torch_parity_probe.py --out "$OUT/parity-probe.json" --timeout 90 \
            --allocators default,native,pluggable
        ;;
    train)
        T=scripts/device/plugins/torch_parity_train.py
        runs=()
        for al in default native; do
            for mode in capturable graph; do
                f="$OUT/tr-plain-$al-$mode.json"
                "$PYTHON" $T --allocator $al --model gpt2-plain --"$mode" --steps 12 --out "$f" 2>&1 | tail -n 1
                runs+=("$f")
            done
        done
        for r in $(seq "$ROUNDS"); do
            for model in gpt2 vit; do
                for al in default native; do
                    f="$OUT/tr-$model-$al-$r.json"
                    "$PYTHON" $T --allocator $al --model $model --steps "$STEPS" --out "$f" 2>&1 | tail -n 1
                    runs+=("$f")
                done
            done
        done
        "$PYTHON" - "$OUT/parity-train.json" "$BUILD_S" "${runs[@]}" <<'PY'
import json, sys
out, build_s, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
runs = {}
for f in files:
    try:
        runs[f.rsplit("/", 1)[1][3:-5]] = json.load(open(f))
    except (OSError, ValueError) as e:
        runs[f.rsplit("/", 1)[1][3:-5]] = {"error": str(e)}
json.dump({"native_build_s": build_s, "runs": runs}, open(out, "w"), indent=1)
PY
        rm -f "$OUT"/tr-*.json
        ;;
    esac
done
