#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""results_index.py — write docs/results.md from the committed results files.

bench/results/ holds every measured result as a dated file (JSON, JSON lines,
Markdown, text) named DATE-[MACHINE-]WHAT.EXT.  This script reads them and
writes one Markdown page with two parts:

  * the newest figure of each benchmark: for each kind in KINDS below, the
    newest JSON (or JSON lines) file of that kind, its date, GPU, commit and
    file, and a few headline figures read from it;
  * an index of every file of bench/results/, grouped by benchmark, newest
    first, so a reader finds the current file of each at once.

Only files git tracks are read (a result being written is not yet a figure).
"Newest" is the date in the file (else in its name); files of the same date
are ordered by the time the commit that added them was made (git log),
added but uncommitted files last, then by name.  Without git history (a tarball) the
order of same-day files falls back to their names, so --check skips (77):
the page may then legitimately differ.

Usage:
  results_index.py                    print the page
  results_index.py --write FILE       write it (make results)
  results_index.py --check FILE       exit 1 when FILE is not what --write
                                      would write (ctest docs/results_current)
Python 3 standard library only.
"""
import json
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "bench/results"
NAME_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})-(?:(NVIDIA-H\d+(?:-80GB-HBM3)?|sim(?:-2core)?)-)?(.+)$")


# ---- formatting helpers ---------------------------------------------------------
def num(v, digits=3):
    """A number as the results pages print it; '?' when absent."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "?"
    if isinstance(v, float) and not math.isfinite(v):
        return "?"
    if isinstance(v, int) or abs(v) >= 1000:
        return "{:,}".format(int(round(v))).replace(",", " ")
    a = abs(v)
    if a >= 100:
        return "%.1f" % v
    if a >= 10:
        return "%.2f" % v
    return ("%%.%df" % digits) % v


def yes(v):
    return "yes" if v is True else "no" if v is False else "?"


def dig(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


# ---- headline figures of each kind ------------------------------------------------
def h_replay(rows):
    out = []
    for r in rows:
        if isinstance(r, dict) and "trace" in r:
            name = re.sub(r"\.csv(\.gz)?$", "", str(r["trace"]))
            out.append("%s %s (%s steady calls)" % (name, num(r.get("ratio")),
                                                  num(r.get("steady_backend_calls"), 0)))
    return ["reserved ÷ live peak, 3 passes: " + "; ".join(out)] if out else []


def h_alloc(d):
    out = []
    pair = dig(d, "pair_ns", "gpumem") or {}
    out.append("gpumem alloc+free pair 512 B / 64 KiB / 2 MiB: %s / %s / %s ns" %
               (num(pair.get("512B")), num(pair.get("64KiB")), num(pair.get("2MiB"))))
    mix = d.get("mix_ns_per_op") or {}
    out.append("random mix: gpumem %s ns/op, PyTorch %s, cudaMallocAsync %s; gpumem reserved ÷ "
               "requested %s" % (num(mix.get("gpumem")), num(mix.get("torch")),
                                 num(mix.get("cudaMallocAsync")), num(dig(d, "mix_ratio", "gpumem"))))
    tr = dig(d, "trace_ratio", "gpumem") or {}
    if tr:
        out.append("gpumem trace ratios: " + ", ".join("%s %s" % (k, num(v)) for k, v in sorted(tr.items())))
    if dig(d, "threads16_speedup_cpu_mean", "gpumem") is not None:
        out.append("16 threads ÷ one thread's mean rate over the 16 CPUs: %s (%s of the host ceiling)" %
                   (num(dig(d, "threads16_speedup_cpu_mean", "gpumem"), 2),
                    num(dig(d, "threads16_of_ceiling_cpu_mean", "gpumem"), 2)))
    elif dig(d, "threads16_speedup", "gpumem") is not None:
        out.append("16 threads ÷ one thread: %s" % num(dig(d, "threads16_speedup", "gpumem"), 2))
    return out


def h_torch(d):
    return ["GPT-2, %s steps: losses identical %s; peak reserved ÷ allocated %s (PyTorch's "
            "allocator %s); step time ratio %s" %
            (num(d.get("steps"), 0), yes(d.get("loss_identical")), num(d.get("reserved_over_allocated")),
             num(d.get("default_reserved_over_allocated")), num(d.get("step_time_ratio")))]


def h_torch_calls(d):
    out = []
    for m, v in sorted((d.get("models") or {}).items()):
        if not isinstance(v, dict):
            continue
        out.append("%s: driver calls after step 1 %s, after step 2 %s; reserved ÷ allocated %s; "
                   "losses identical %s" %
                   (m, num(v.get("driver_calls_after_first_step"), 0),
                    num(v.get("driver_calls_after_second_step"), 0),
                    num(v.get("reserved_over_allocated")), yes(v.get("losses_identical"))))
    return out


def h_torch_parity(d):
    m = d.get("matrix") or {}
    # value: "works" (under every allocator), "gpumem" (made to work by the native one), else not
    native = sum(1 for v in m.values() if isinstance(v, dict) and v.get("value") in ("works", "gpumem"))
    only = sum(1 for v in m.values() if isinstance(v, dict) and v.get("value") == "gpumem")
    out = ["features that work under gpumem's native allocator: %d of %d (%d of them only there, "
           "not under the pluggable one)" % (native, len(m), only)]
    if d.get("gpt2_step_ratio") is not None:
        out.append("step time ratio GPT-2 %s, ViT %s; losses identical %s / %s" %
                   (num(d.get("gpt2_step_ratio")), num(d.get("vit_step_ratio")),
                    yes(d.get("gpt2_losses_identical")), yes(d.get("vit_losses_identical"))))
    return out


def h_cupy(d):
    return ["64 KiB alloc+free: gpumem C path %s µs, CuPy's pool %s µs, gpumem Python path %s µs" %
            (num(d.get("cupy_pair_us")), num(d.get("cupy_pool_pair_us")),
             num(d.get("cupy_python_path_pair_us")))]


def h_host(d):
    return ["pageable → device %s GB/s (cudaMemcpy %s), device → pageable %s GB/s (cudaMemcpy %s)" %
            (num(d.get("pageable_h2d_GBps")), num(d.get("cudaMemcpy_pageable_h2d_GBps")),
             num(d.get("pageable_d2h_GBps")), num(d.get("cudaMemcpy_pageable_d2h_GBps"))),
            "pinned alloc+free %s ns (cudaHostAlloc + cudaFreeHost %s ns)" %
            (num(d.get("pinned_pool_pair_ns")), num(d.get("cudaHostAlloc_pair_ns")))]


def h_share(d):
    imp = d.get("import_us")
    return ["%s GiB of weights published → read in another process: %s s" %
            (num((d.get("weight_sync_bytes") or 0) / 2**30, 0), num(d.get("weight_sync_s"))),
            "connect + import + map 1 GiB: %s ms; kill -9 of an importer / the exporter → "
            "memory back: %s / %s ms" %
            (num(imp / 1000 if isinstance(imp, (int, float)) else None),
             num(d.get("dead_importer_reclaim_ms")), num(d.get("dead_exporter_reclaim_ms")))]


def h_broker(d):
    return ["quota overshoot, %s processes racing: %s bytes; lease of 64 MiB %s µs; kill -9 → "
            "pages back in %s ms" % (num(d.get("clients"), 0), num(d.get("quota_overshoot_bytes"), 0),
                                     num(d.get("lease_us")), num(d.get("reclaim_ms"))),
            "GPT-2 under a tenant quota: losses identical %s" % yes(d.get("torch_losses_identical"))]


def h_offload(d):
    out = []
    for key, what in (("offload_GBps", "offload, warm"), ("restore_GBps", "restore, warm"),
                      ("offload_cold_GBps", "offload, cold"), ("gpu_freed_fraction", "device memory given back")):
        v = d.get(key)
        if isinstance(v, dict) and v:
            out.append("%s: %s" % (what, ", ".join("%s %s" % (k, num(x)) for k, x in v.items())) +
                       ("" if key == "gpu_freed_fraction" else " GB/s"))
    return out


def h_offload_torch(d):
    return ["a %s GB model: sleep %s s (warm %s s), wake %s s (warm %s s), device memory given "
            "back %s; outputs identical %s" %
            (num((d.get("model_bytes") or 0) / 1e9, 1), num(d.get("sleep_s")), num(d.get("sleep_warm_s")),
             num(d.get("wake_s")), num(d.get("wake_warm_s")), num(d.get("freed_fraction")),
             yes(d.get("sleep_wake_identical")))]


def h_multigpu(d):
    ar = d.get("allreduce_busbw_GBps") or {}
    ddp = "" if d.get("ddp_losses_identical") is None else \
        "; DDP losses identical %s" % yes(d.get("ddp_losses_identical"))
    return ["peer copy 1 GiB: %s GB/s (cudaMalloc with peer access %s)" %
            (num(d.get("peer_copy_GBps")), num(d.get("cudamalloc_peer_copy_GBps"))),
            "NCCL all-reduce 1 GiB: %s GB/s on registered gpumem segments (ncclMemAlloc %s)%s" %
            (num(dig(ar, "gpumem_registered", "1GiB")), num(dig(ar, "ncclMemAlloc", "1GiB")), ddp)]


def side_by_side(d):
    mix = d.get("mix_ns_per_op")
    return isinstance(mix, dict) and len(mix) >= 3


# name, title, how it is measured, pattern of WHAT (the name after date and
# machine), extension, predicate on the data, headline function.
KINDS = [
    ("replay", "Trace replay", "gpumem replay --repeat 3 (bench/replay.sh)",
     r"^(perf-core-)?replay$", "jsonl", None, h_replay),
    ("alloc", "Allocators side by side", "bench/run_alloc_bench.sh",
     r"^alloc(-percpu|-rounds-\d+|-run\d+)?$", "json", side_by_side, h_alloc),
    ("torch", "GPT-2 training under PyTorch", "scripts/device/plugins.sh",
     r"^torch$", "json", None, h_torch),
    ("torch-calls", "Driver calls after the first training step", "scripts/device/train_calls.sh",
     r"^(torch-calls|calls-torch)$", "json", lambda d: isinstance(d.get("models"), dict), h_torch_calls),
    ("torch-parity", "PyTorch features under gpumem", "scripts/device/torch_parity.sh",
     r"^torch-parity$", "json", None, h_torch_parity),
    ("cupy", "CuPy", "bench/cupy_pair.py", r"^cupy$", "json", None, h_cupy),
    ("host", "Host memory and staged copies", "bench/run_host_bench.sh", r"^host$", "json", None, h_host),
    ("share", "Sharing between processes", "bench/run_share_bench.sh", r"^share$", "json", None, h_share),
    ("broker", "The broker", "bench/run_broker_bench.sh", r"^broker$", "json", None, h_broker),
    ("offload", "Offload and restore", "bench/run_offload_bench.sh",
     r"^offload(-review-mend|-cold-ahead)?$", "json", None, h_offload),
    ("offload-torch", "A PyTorch model put to sleep and woken", "scripts/device/plugins/offload_torch.py",
     r"^offload(-cold-ahead)?-torch$", "json", None, h_offload_torch),
    ("multigpu", "Several GPUs", "scripts/device/multigpu.sh", r"^multigpu$", "json", None, h_multigpu),
]
GROUP_TESTS = ("tests", "Test suite runs on a GPU (ctest, attack, sanitizer)")
GROUP_OTHER = ("other", "Studies, A/B runs and probes")


# ---- reading the folder -----------------------------------------------------------
def git_added_times():
    """{path: commit time of the commit that first added it}, or None without git."""
    try:
        # --relative: names relative to ROOT, also when the tree sits inside
        # another repository (vendored).
        out = subprocess.run(["git", "-C", ROOT, "log", "--relative", "--diff-filter=A",
                              "--format=@%ct", "--name-only", "--", RESULTS],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    times, t = {}, 0
    for line in out.splitlines():
        if line.startswith("@"):
            t = int(line[1:])
        elif line.strip():
            times[line.strip()] = t  # log is newest first: the last seen is the first add
    # No results file in the history: a copy without its own history (a
    # tarball, or files copied into another repository), not a checkout.
    return times or None


def git_tracked():
    """The names of bench/results/ that git tracks, or None without git."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "--", RESULTS], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {os.path.basename(l) for l in out.splitlines() if l.strip()}
    return names or None


def load(path):
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            return [json.loads(l) for l in f if l.strip()]
        return json.load(f)


def first(d, *keys):
    for k in keys:
        v = d.get(k) if isinstance(d, dict) else None
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def describe(path, data):
    """date, gpu, commit of one file, from its content, else its name."""
    base = os.path.basename(path)
    m = NAME_RE.match(base.rsplit(".", 1)[0])
    meta = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else data
    if isinstance(meta, dict) and isinstance(meta.get("meta"), dict):
        meta = dict(meta, **meta["meta"])
    date = first(meta, "date") or (m.group(1) if m else "?")
    gpu = first(meta, "gpu") or (m.group(2) if m and m.group(2) else None)
    if gpu is None and isinstance(meta, dict) and meta.get("backend") == "sim":
        gpu = "sim"
    if gpu is None and m and m.group(2):
        gpu = m.group(2)
    commit = first(meta, "commit", "new_commit", "commit_after", "torch_commit")
    if commit:
        commit = commit.split()[0] if re.match(r"^[0-9a-f]{7,40}\b", commit) else commit
    gpu = re.split(r"[,(]", gpu)[0].strip() if gpu else gpu
    return date[:10], (gpu or "not recorded").replace("NVIDIA-", "NVIDIA ").replace("-80GB-HBM3", " 80GB HBM3"), \
        commit or "not recorded"


def scan():
    folder = os.path.join(ROOT, RESULTS)
    added = git_added_times()
    # Only the files git tracks: a result being written, not yet added, is
    # not a committed figure (without git: every file).
    tracked = git_tracked() if added is not None else None
    stems = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(".") or name == "README.md" or not os.path.isfile(os.path.join(folder, name)):
            continue
        if tracked is not None and name not in tracked:
            continue
        stem, ext = name.rsplit(".", 1) if "." in name else (name, "")
        stems.setdefault(stem, []).append(ext)
    entries = []
    for stem, exts in stems.items():
        m = NAME_RE.match(stem)
        what = m.group(3) if m else stem
        e = {"stem": stem, "exts": sorted(exts), "what": what, "date": m.group(1) if m else "?",
             "gpu": (m.group(2) or "") if m else "", "commit": None, "kind": None, "data": None}
        t = [added.get("%s/%s.%s" % (RESULTS, stem, x)) for x in exts] if added is not None else []
        t = [x for x in t if x is not None]
        e["added"] = min(t) if t else math.inf
        for kname, _title, _how, pat, ext, pred, _h in KINDS:
            if ext in exts and re.match(pat, what):
                path = os.path.join(folder, "%s.%s" % (stem, ext))
                try:
                    data = load(path)
                except (OSError, ValueError) as err:
                    sys.exit("results_index.py: %s: %s" % (path, err))
                if pred is None or (isinstance(data, dict) and pred(data)):
                    e["kind"], e["data"], e["file"] = kname, data, "%s.%s" % (stem, ext)
                break
        if e["kind"] is None:
            for x in ("json", "jsonl"):
                if x in exts:
                    try:
                        e["data"] = load(os.path.join(folder, "%s.%s" % (stem, x)))
                    except (OSError, ValueError) as err:
                        sys.exit("results_index.py: %s.%s: %s" % (stem, x, err))
                    break
        if e["data"] is not None:
            e["date"], e["gpu"], e["commit"] = describe(stem + ".json", e["data"])
        elif e["gpu"]:
            e["gpu"] = e["gpu"].replace("NVIDIA-", "NVIDIA ").replace("-80GB-HBM3", " 80GB HBM3")
        entries.append(e)
    # newest first: date, then when it was committed, then name
    entries.sort(key=lambda e: (e["date"], e["added"], e["stem"]), reverse=True)
    return entries, added is not None


def link(stem, ext, prefix="../" + RESULTS + "/"):
    return "[%s](%s%s.%s)" % (ext, prefix, stem, ext)


def files_of(e):
    main = "md" if "md" in e["exts"] else e["exts"][0]
    s = "[%s](../%s/%s.%s)" % (e["stem"], RESULTS, e["stem"], main)
    more = [link(e["stem"], x) for x in e["exts"] if x != main]
    return s + (" (" + ", ".join(more) + ")" if more else "")


def render(entries):
    L = ["# Results: the newest figure of each benchmark", "",
         "<!-- Generated by scripts/results_index.py from bench/results/ (`make results`); do not edit:",
         "     the ctest docs/results_current fails when this page is stale. -->", "",
         "Every figure below is read from a committed results file of `bench/results/` by",
         "`scripts/results_index.py`; `make results` rewrites this page and `make test` checks that it",
         "is current. For each benchmark, the newest run (by date, then by when it was committed), the",
         "machine, the commit measured and a few headline figures; the file has the rest, with the",
         "command that produced it. What the figures mean and how they were judged:",
         "[results-notes.md](results-notes.md) and the docs page of each feature.", ""]
    by_kind = {}
    for e in entries:
        if e["kind"]:
            by_kind.setdefault(e["kind"], []).append(e)
    L += ["| benchmark | date | GPU | commit | file |", "|---|---|---|---|---|"]
    for kname, title, how, *_ in KINDS:
        if kname in by_kind:
            e = by_kind[kname][0]
            L.append("| [%s](#%s) | %s | %s | %s | [%s](../%s/%s) |" %
                     (title, kname, e["date"], e["gpu"], e["commit"], e["file"], RESULTS, e["file"]))
    L.append("")
    for kname, title, how, _pat, _ext, _pred, headline in KINDS:
        if kname not in by_kind:
            continue
        e = by_kind[kname][0]
        L += ['<a id="%s"></a>' % kname, "## %s" % title, "",
              "`%s`, %s, %s, commit %s: %s" % (how, e["date"], e["gpu"], e["commit"], files_of(e)), ""]
        L += ["- " + h for h in headline(e["data"])]
        older = by_kind[kname][1:]
        if older:
            L += ["", "Earlier runs: " + "; ".join("%s %s (%s)" % (o["date"], o["gpu"], files_of(o))
                                                   for o in older[:6]) +
                  ("; and %d more in the index below." % (len(older) - 6) if len(older) > 6 else ".")]
        L.append("")
    L += ["## Index of bench/results/", "",
          "Every file, newest first, one line per run (its formats together).", ""]
    groups = [(k, t) for k, t, *_ in KINDS] + [GROUP_TESTS, GROUP_OTHER]
    for gk, gt in groups:
        if gk == "tests":
            rows = [e for e in entries if not e["kind"] and re.search(r"ctest|attack|sanitize", e["what"])]
        elif gk == "other":
            rows = [e for e in entries if not e["kind"] and not re.search(r"ctest|attack|sanitize", e["what"])]
        else:
            rows = by_kind.get(gk, [])
        if not rows:
            continue
        L += ["### %s" % gt, ""]
        for e in rows:
            L.append("- %s · %s · %s" % (e["date"], e["gpu"] or "no GPU named", files_of(e)))
        L.append("")
    return "\n".join(L).rstrip() + "\n"


def main(argv):
    entries, have_git = scan()
    page = render(entries)
    if len(argv) == 3 and argv[1] == "--write":
        with open(argv[2], "w", encoding="utf-8") as f:
            f.write(page)
        return 0
    if len(argv) == 3 and argv[1] == "--check":
        if not have_git:
            print("SKIP: no git history here, so same-day results cannot be ordered")
            return 77
        # Result files git does not track: either one being written, or a
        # copy of the tree whose .git is not this tree's history (a stale
        # one); either way what is committed cannot be told here.
        tracked = git_tracked()
        folder = os.path.join(ROOT, RESULTS)
        untracked = sorted(n for n in os.listdir(folder)
                           if not n.startswith(".") and n != "README.md"
                           and os.path.isfile(os.path.join(folder, n)) and n not in tracked)
        if untracked:
            print("SKIP: %d results file(s) git does not track (%s%s): add and commit them, "
                  "then `make results`" % (len(untracked), ", ".join(untracked[:3]),
                                            ", ..." if len(untracked) > 3 else ""))
            return 77
        try:
            with open(argv[2], encoding="utf-8") as f:
                old = f.read()
        except OSError as err:
            print("FAIL: %s: %s (run `make results`)" % (argv[2], err))
            return 1
        if old != page:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), page.splitlines(True),
                                                       argv[2], "regenerated", n=1))
            print("FAIL: %s is stale: run `make results` and commit it" % argv[2])
            return 1
        print("PASS: %s is current (%d results files)" % (argv[2], len(entries)))
        return 0
    if len(argv) == 1:
        sys.stdout.write(page)
        return 0
    sys.stderr.write("usage: results_index.py [--write FILE | --check FILE]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
