# SPDX-License-Identifier: Apache-2.0
"""Merges the two files of scripts/device/torch_parity.sh (parity-probe.json,
parity-train.json) into bench/results/DATE-GPU-torch-parity.{json,md}.

Each matrix row gets a value: "works" (works under gpumem's native and
pluggable allocators, as with PyTorch's), "gpumem" (works under the native
allocator, fails under the pluggable one: made to work by gpumem), "not_yet"
(fails under both; the reason says what gpumem offers instead), and the
first line of each allocator's result.  Step ratios are gpumem native over
PyTorch's allocator, each the median over ROUNDS processes of the median step
time after warm-up.

usage: python3 torch_parity_summary.py --probe F --train F --out-json F
       --out-md F --commit SHA [--command TEXT]
"""
import argparse
import datetime
import json
import statistics
import sys

NOT_YET = {
    "multiprocessing_cuda_tensor": "CUDA IPC (cudaIpcGetMemHandle) does not work on virtual-memory pages, "
                                   "and gpumem publishes only whole-page blocks; the native allocator's error "
                                   "says to set GPUMEM_TORCH_SHAREABLE",
}

# A row that works once the user sets something: its value comes from the
# row that sets it.
WITH_SETTING = {
    "multiprocessing_cuda_tensor": ("multiprocessing_shareable",
                                    "works under the native allocator when the producer sets "
                                    "GPUMEM_TORCH_SHAREABLE (tensors of at least that size get whole pages, "
                                    "published on a gpumem share server); without it the native allocator "
                                    "refuses with an error that says so"),
}


def classify(name, row):
    native, plug, default = row.get("native", ""), row.get("pluggable", ""), row.get("default", "")
    if default != "works":
        if native == "works":
            return "gpumem", "works under the native allocator, beyond PyTorch's own (which: " + default + ")"
        return "n/a", "fails with PyTorch's own allocator too: " + default
    if native == "works" and plug == "works":
        return "works", "works under both of gpumem's allocators"
    if native == "works":
        return "gpumem", "made to work by the native allocator; pluggable: " + plug
    return "not_yet", NOT_YET.get(name, "fails under gpumem: " + native)


def ratio(runs, model):
    med = {al: statistics.median(runs["%s-%s-%d" % (model, al, r)]["median_step_ms"]
                                 for r in range(1, 100) if "%s-%s-%d" % (model, al, r) in runs)
           for al in ("default", "native")}
    losses = {al: [runs[k]["losses"] for k in runs if k.startswith("%s-%s-" % (model, al))]
              for al in ("default", "native")}
    same = all(l == losses["default"][0] for al in losses for l in losses[al])
    return med, round(med["native"] / med["default"], 4), same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", default="OUT=DIR scripts/device/torch_parity.sh, then "
                                         "scripts/device/torch_parity_summary.py")
    a = ap.parse_args()
    probe = json.load(open(a.probe))
    train = json.load(open(a.train))
    runs = train["runs"]
    matrix = {}
    for name, row in probe["rows"].items():
        value, reason = classify(name, row)
        matrix[name] = {"value": value, "reason": reason, **row}
    for name, (other, reason) in WITH_SETTING.items():
        if name in matrix and matrix.get(other, {}).get("value") in ("works", "gpumem") \
                and matrix[name]["value"] == "not_yet":
            matrix[name]["value"], matrix[name]["reason"] = "gpumem", reason
    res = {"date": datetime.date.today().isoformat(), "gpu": probe.get("gpu"), "torch": probe.get("torch"),
           "commit": a.commit, "command": a.command, "native_build_s": train.get("native_build_s"),
           "matrix": matrix}
    for model in ("gpt2", "vit"):
        med, r, same = ratio(runs, model)
        res["%s_step_ratio" % model] = r
        res["%s_step_ms" % model] = {k: round(v, 2) for k, v in med.items()}
        res["%s_losses_identical" % model] = same
        res["%s_reserved_peak" % model] = {al: runs["%s-%s-1" % (model, al)]["max_memory_reserved"]
                                           for al in ("default", "native")}
    plain = {k: runs["plain-%s" % k] for k in ("default-capturable", "default-graph", "native-capturable",
                                                "native-graph")}
    res["gpt2_graph_losses_identical"] = len({tuple(v["losses"]) for v in plain.values()}) == 1
    res["gpt2_graph_step_ms"] = {k: round(v["median_step_ms"], 2) for k, v in plain.items()}
    res["gpt2_graph_reserved_peak"] = {k: v["max_memory_reserved"] for k, v in plain.items()}
    with open(a.out_json, "w") as f:
        json.dump(res, f, indent=1)

    counts = {}
    for m in matrix.values():
        counts[m["value"]] = counts.get(m["value"], 0) + 1
    md = ["# PyTorch features under gpumem.torch.enable(), %s" % res["gpu"], "",
          "Command: `%s`; commit %s; PyTorch %s; %s. Each row ran in a fresh process with PyTorch's own "
          "allocator, with gpumem's native allocator (`enable(allocator=\"native\")`, the default where a C++ "
          "compiler exists; built on first use in %.1f s) and with gpumem's pluggable one "
          "(`allocator=\"pluggable\"`)." % (a.command, a.commit, res["torch"], res["date"],
                                            res["native_build_s"] or 0), "",
          "| feature | value | PyTorch | gpumem native | gpumem pluggable |", "|---|---|---|---|---|"]
    for name, m in matrix.items():
        md.append("| %s | **%s** | %s | %s | %s |" % (name, m["value"], m["default"][:60], m["native"][:90],
                                                      m["pluggable"][:90]))
    md += ["", "Rows: %s." % ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())), ""]
    md += ["## Training", "",
           "| run | PyTorch (ms/step) | gpumem native (ms/step) | ratio | losses identical | reserved peak, "
           "PyTorch / gpumem |", "|---|---|---|---|---|---|"]
    for model, label in (("gpt2", "GPT-2 (transformers, 12 layers, batch 8 x 512)"),
                         ("vit", "ViT-B/16 (timm, batch 64)")):
        rp = res["%s_reserved_peak" % model]
        md.append("| %s | %.2f | %.2f | %.4f | %s | %.2f / %.2f GB |" % (
            label, res["%s_step_ms" % model]["default"], res["%s_step_ms" % model]["native"],
            res["%s_step_ratio" % model], res["%s_losses_identical" % model],
            rp["default"] / 1e9, rp["native"] / 1e9))
    g = res["gpt2_graph_step_ms"]
    gr = res["gpt2_graph_reserved_peak"]
    md += ["", "Step times are the median over the rounds of each process's median after 5 warm-up steps.", "",
           "GPT-2 small in plain PyTorch, the whole training step (forward, backward, AdamW with "
           "capturable=True) captured once in a CUDA graph and replayed, against the same steps run "
           "eagerly: losses identical across all four runs: **%s**." % res["gpt2_graph_losses_identical"], "",
           "| allocator | eager (ms/step) | graph (ms/step) | reserved peak eager / graph |", "|---|---|---|---|",
           "| PyTorch | %.2f | %.2f | %.2f / %.2f GB |" % (g["default-capturable"], g["default-graph"],
                                                          gr["default-capturable"] / 1e9, gr["default-graph"] / 1e9),
           "| gpumem native | %.2f | %.2f | %.2f / %.2f GB |" % (g["native-capturable"], g["native-graph"],
                                                                gr["native-capturable"] / 1e9,
                                                                gr["native-graph"] / 1e9), ""]
    with open(a.out_md, "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
