# SPDX-License-Identifier: Apache-2.0
"""PyTorch sleep and wake with gpumem: a model's weights offloaded to host
memory and restored (gpumem.offload / gpumem.restore, docs/offload.md).

Three processes, each fresh (the coordinator never touches the GPU):

  gpumem  gpumem is PyTorch's allocator (gpumem.torch.enable()).  A model of
          LAYERS x Linear(DIM, DIM) fp32 (16 x 8192 x 8192: 4.3 GB of
          parameters) is built on the GPU under `with gpumem.tag("weights")`,
          from fixed seeds; a fixed input runs through it and the output is
          kept.  Sleep: gpumem.offload("weights"), timed (sleep_s; the first
          offload of the process, so its pinned memory is registered then).
          torch.cuda.mem_get_info before and after gives the device memory
          given back (freed_fraction = freed / model bytes).  While the model
          sleeps, a second process (hog, PyTorch's own allocator) allocates
          the device's free memory less a margin, more than was free before
          the offload, writes every byte and exits: the memory really went
          back to the device.  Wake: gpumem.restore("weights"), timed
          (wake_s).  The input runs again: sleep_wake_identical = torch.equal
          of the two outputs, params_identical = every parameter's bits the
          same (an exact integer sum of its 32-bit words).  Then WARM more
          sleep/wake cycles (the host pool holds the pinned memory): the
          medians sleep_warm_s, wake_warm_s, and the output checked again.
  naive   the peer, since torch_memory_saver is not installed: PyTorch's own
          allocator, the same model and input; sleep copies each parameter
          into freshly pinned CPU memory (torch.empty(pin_memory=True),
          copy_(non_blocking=True)), points the parameter at it and empties
          PyTorch's cache (the device memory goes back); wake allocates on
          the GPU and copies back.  naive_sleep_s / naive_wake_s (first
          cycle: pinning cold), naive_sleep_warm_s / naive_wake_warm_s
          (PyTorch's pinned-memory cache warm), naive_freed_fraction,
          naive_identical.
  hog     (started by the gpumem process) see above.

Rates are 1e9 bytes of parameters per second (sleep_GBps, wake_GBps, ...).
Prints one JSON object (also to --out).  Exit status 0 when the runs went
through (the figures say whether the goals are met), 0 with torch_skipped
set when PyTorch or CUDA is missing, 1 on a failure.

usage: python3 offload_torch.py [--out FILE] [--layers 16] [--dim 8192]
       [--batch 64] [--warm 2] [--hog-margin 2GiB] [--device 0]
       [--no-naive] [--run-timeout 240] [--budget SECONDS]
The Python package: python/ of this checkout is put on PYTHONPATH; the
library: $GPUMEM_LIBRARY, else build/libgpumem.so of this checkout.
"""
import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TAG = "weights"
SEED = 1234


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError("not a size: %r (e.g. 2GiB, 512MiB)" % text)
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# ---- what every role shares ------------------------------------------------------------


def deterministic(torch):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def build_model(torch, layers, dim, device):
    """LAYERS x (Linear(dim, dim), Tanh), fp32, made on `device` from SEED:
    weights ~ N(0, 1/dim) so the signal keeps its size through the layers."""
    torch.manual_seed(SEED)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(SEED)
    nn = torch.nn
    mods = []
    for _ in range(layers):
        lin = nn.Linear(dim, dim, device=device)
        with torch.no_grad():
            lin.weight.normal_(0.0, dim ** -0.5)
            lin.bias.normal_(0.0, 0.01)
        mods += [lin, nn.Tanh()]
    model = nn.Sequential(*mods)
    model.eval()
    return model


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_input(torch, batch, dim, device):
    g = torch.Generator(device="cpu").manual_seed(SEED + 1)
    return torch.randn(batch, dim, generator=g).to(device)


def forward(torch, model, x):
    with torch.no_grad():
        return model(x)


def bits_sum(torch, t):
    """An exact, order-free sum of a float32 tensor's 32-bit words."""
    return int(t.detach().contiguous().view(torch.int32).sum(dtype=torch.int64).item())


def param_sums(torch, model):
    return [bits_sum(torch, p) for p in model.parameters()]


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds and seconds > 0 else None


def median(v):
    return statistics.median(v) if v else None


def emit(res):
    """The role's result: one JSON line, last on stdout."""
    print(json.dumps(res), flush=True)


# ---- role: gpumem ----------------------------------------------------------------------


def run_hog(a, nbytes, device_index, timeout):
    """The second process: allocate nbytes with PyTorch's own allocator, write
    them, exit.  Its JSON (or None) and a failure (or None)."""
    env = dict(os.environ)
    for k in ("GPUMEM_LIBRARY", "LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(k, None)
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "hog", "--device", str(device_index),
           "--hog-bytes", str(nbytes)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "the hog timed out after %d s" % timeout
    out = last_json(p.stdout)
    if p.returncode != 0 or out is None:
        return out, "the hog exited with status %d: %s" % (p.returncode, tail(p.stderr))
    return out, None


def role_gpumem(a):
    import torch
    import gpumem
    import gpumem.torch
    res = {"role": "gpumem", "errors": []}
    phase = "enable"
    try:
        gpumem.torch.enable()  # before anything touches CUDA
        deterministic(torch)
        dev = torch.device("cuda", a.device)
        torch.cuda.set_device(dev)
        res["gpumem_library"] = os.path.basename(gpumem.library_path())
        res["gpumem_version"] = gpumem.version()

        phase = "build"
        t0 = time.perf_counter()
        with gpumem.tag(TAG):
            model = build_model(torch, a.layers, a.dim, dev)
        torch.cuda.synchronize()
        res["build_s"] = time.perf_counter() - t0
        nbytes = model_bytes(model)
        res["model_bytes"] = nbytes
        res["params"] = sum(p.numel() for p in model.parameters())
        x = make_input(torch, a.batch, a.dim, dev)  # not tagged: stays on the device
        y0 = forward(torch, model, x)
        sums0 = param_sums(torch, model)
        res["output_bits_sum"] = bits_sum(torch, y0)
        res["output_abs_max"] = float(y0.abs().max().item())
        info = gpumem.tag_info(TAG, a.device)
        res["tag_resident_bytes"] = info["resident_bytes"]
        res["tag_resident_blocks"] = info["resident_blocks"]
        if info["resident_bytes"] < nbytes:
            res["errors"].append("the tag holds %d bytes, the parameters %d: not every parameter "
                                 "was tagged" % (info["resident_bytes"], nbytes))

        phase = "sleep"
        gc.collect()
        torch.cuda.synchronize()
        free0, total = torch.cuda.mem_get_info(dev)
        s0 = gpumem.stats(a.device)
        t0 = time.perf_counter()
        gpumem.offload(TAG, device=a.device)
        sleep_s = time.perf_counter() - t0
        free1, _ = torch.cuda.mem_get_info(dev)
        s1 = gpumem.stats(a.device)
        info = gpumem.tag_info(TAG, a.device)
        res.update(sleep_s=sleep_s, sleep_GBps=gbps(nbytes, sleep_s), mem_total=total,
                   mem_free_before_offload=free0, mem_free_after_offload=free1,
                   freed_bytes=free1 - free0, freed_fraction=(free1 - free0) / nbytes,
                   reserved_before_offload=s0["reserved"], reserved_after_offload=s1["reserved"],
                   freed_fraction_reserved=(s0["reserved"] - s1["reserved"]) / nbytes,
                   host_reserved_after_offload=s1["host_reserved"],
                   tag_offloaded_bytes=info["offloaded_bytes"],
                   tag_resident_after_offload=info["resident_bytes"])

        phase = "hog"
        hog_bytes = max(0, free1 - a.hog_margin)
        res["hog_bytes_asked"] = hog_bytes
        res["hog_exceeds_free_before_offload"] = hog_bytes > free0
        hog, why = run_hog(a, hog_bytes, a.device, a.hog_timeout)
        if hog:
            res.update({"hog_" + k: v for k, v in hog.items() if k != "role"})
        res["hog_ok"] = bool(hog and hog.get("ok") and why is None)
        if why:
            res["errors"].append(why)
        res["mem_free_after_hog"] = torch.cuda.mem_get_info(dev)[0]

        phase = "wake"
        t0 = time.perf_counter()
        gpumem.restore(TAG, device=a.device)
        wake_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        res.update(wake_s=wake_s, wake_GBps=gbps(nbytes, wake_s),
                   mem_free_after_restore=torch.cuda.mem_get_info(dev)[0])
        y1 = forward(torch, model, x)
        res["sleep_wake_identical"] = bool(torch.equal(y0, y1))
        res["params_identical"] = param_sums(torch, model) == sums0
        del y1

        phase = "warm cycles"
        sl, wk, freed = [], [], []
        for _ in range(a.warm):
            torch.cuda.synchronize()
            f0 = torch.cuda.mem_get_info(dev)[0]
            t0 = time.perf_counter()
            gpumem.offload(TAG, device=a.device)
            t1 = time.perf_counter()
            f1 = torch.cuda.mem_get_info(dev)[0]
            t2 = time.perf_counter()
            gpumem.restore(TAG, device=a.device)
            t3 = time.perf_counter()
            sl.append(t1 - t0)
            wk.append(t3 - t2)
            freed.append((f1 - f0) / nbytes)
        if a.warm:
            y2 = forward(torch, model, x)
            res["warm_identical"] = bool(torch.equal(y0, y2)) and param_sums(torch, model) == sums0
            del y2
        res.update(sleep_warm_runs_s=sl, wake_warm_runs_s=wk, sleep_warm_s=median(sl),
                   wake_warm_s=median(wk), sleep_warm_GBps=gbps(nbytes, median(sl)),
                   wake_warm_GBps=gbps(nbytes, median(wk)), freed_fraction_warm_runs=freed)
        s = gpumem.stats(a.device)
        res["gpumem_stats"] = {k: s.get(k) for k in (
            "offload_count", "restore_count", "offload_bytes_total", "restore_bytes_total", "offloaded",
            "reserved", "reserved_peak", "host_reserved", "host_reserved_peak")}
        info = gpumem.tag_info(TAG, a.device)
        res["tag_info_end"] = {k: info[k] for k in ("resident_bytes", "offloaded_bytes", "offloads",
                                                     "restores")}
        phase = "done"
    except Exception as e:  # noqa: BLE001 - reported, not raised: the figures so far still count
        res["errors"].append("%s: %s: %s" % (phase, type(e).__name__, " | ".join(str(e).splitlines())[:600]))
    res["phase"] = phase
    res["torch"] = torch.__version__
    res["cuda"] = torch.version.cuda
    try:
        res["gpu"] = torch.cuda.get_device_name(a.device)
    except Exception:  # noqa: BLE001
        pass
    emit(res)
    return 0 if phase == "done" else 1


# ---- role: hog -------------------------------------------------------------------------


def role_hog(a):
    import torch
    res = {"role": "hog", "ok": False}
    dev = torch.device("cuda", a.device)
    chunk = 1 << 30
    bufs = []
    left = a.hog_bytes
    t0 = time.perf_counter()
    try:
        while left > 0:
            n = min(chunk, left)
            b = torch.empty(n, dtype=torch.uint8, device=dev)
            b.fill_(1 + len(bufs) % 251)
            bufs.append(b)
            left -= n
        torch.cuda.synchronize()
        res["allocated"] = a.hog_bytes - left
        res["free_while_held"] = torch.cuda.mem_get_info(dev)[0]
        # every chunk holds its value: first and last byte and a strided sample
        ok = True
        for i, b in enumerate(bufs):
            v = 1 + i % 251
            ok = ok and int(b[0].item()) == v and int(b[-1].item()) == v
            # a strided sample (a whole-tensor reduction would need temporary
            # memory the hog has just taken)
            ok = ok and bool(b[::4093].eq(v).all().item())
        res["ok"] = ok
    except Exception as e:  # noqa: BLE001
        res["error"] = "%s: %s" % (type(e).__name__, " | ".join(str(e).splitlines())[:400])
        res["allocated"] = a.hog_bytes - left
    res["s"] = time.perf_counter() - t0
    del bufs
    emit(res)
    return 0 if res["ok"] else 1


# ---- role: naive (PyTorch's own allocator, fresh pinned memory) -------------------------


def naive_sleep(torch, params, dev):
    """Each parameter to freshly pinned CPU memory; its device memory back
    to the driver (empty_cache)."""
    torch.cuda.synchronize(dev)
    cpu = []
    for p in params:
        c = torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
        c.copy_(p.data, non_blocking=True)
        cpu.append(c)
    torch.cuda.synchronize(dev)
    for p, c in zip(params, cpu):
        p.data = c
    del cpu
    torch.cuda.empty_cache()


def naive_wake(torch, params, dev):
    for p in params:
        g = torch.empty(p.shape, dtype=p.dtype, device=dev)
        g.copy_(p.data, non_blocking=True)
        p.data = g
    torch.cuda.synchronize(dev)


def role_naive(a):
    import torch
    res = {"role": "naive", "errors": []}
    phase = "build"
    try:
        deterministic(torch)
        dev = torch.device("cuda", a.device)
        torch.cuda.set_device(dev)
        model = build_model(torch, a.layers, a.dim, dev)
        torch.cuda.synchronize()
        nbytes = model_bytes(model)
        params = list(model.parameters())
        x = make_input(torch, a.batch, a.dim, dev)
        y0 = forward(torch, model, x)
        sums0 = param_sums(torch, model)
        res["output_bits_sum"] = bits_sum(torch, y0)
        res["model_bytes"] = nbytes
        sl, wk, freed = [], [], []
        for k in range(1 + a.warm):
            phase = "cycle %d" % k
            gc.collect()
            torch.cuda.synchronize()
            f0 = torch.cuda.mem_get_info(dev)[0]
            t0 = time.perf_counter()
            naive_sleep(torch, params, dev)
            t1 = time.perf_counter()
            f1 = torch.cuda.mem_get_info(dev)[0]
            t2 = time.perf_counter()
            naive_wake(torch, params, dev)
            t3 = time.perf_counter()
            sl.append(t1 - t0)
            wk.append(t3 - t2)
            freed.append((f1 - f0) / nbytes)
            if k == 0:
                y1 = forward(torch, model, x)
                res["identical"] = bool(torch.equal(y0, y1)) and param_sums(torch, model) == sums0
                del y1
        y2 = forward(torch, model, x)
        res["identical_end"] = bool(torch.equal(y0, y2)) and param_sums(torch, model) == sums0
        res.update(sleep_s=sl[0], wake_s=wk[0], sleep_GBps=gbps(nbytes, sl[0]), wake_GBps=gbps(nbytes, wk[0]),
                   sleep_warm_runs_s=sl[1:], wake_warm_runs_s=wk[1:], sleep_warm_s=median(sl[1:]),
                   wake_warm_s=median(wk[1:]), sleep_warm_GBps=gbps(nbytes, median(sl[1:])),
                   wake_warm_GBps=gbps(nbytes, median(wk[1:])), freed_fraction=freed[0],
                   freed_fraction_runs=freed)
        phase = "done"
    except Exception as e:  # noqa: BLE001
        res["errors"].append("%s: %s: %s" % (phase, type(e).__name__, " | ".join(str(e).splitlines())[:600]))
    res["phase"] = phase
    emit(res)
    return 0 if phase == "done" else 1


# ---- the coordinator -------------------------------------------------------------------


def last_json(stdout):
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            v = json.loads(line)
        except ValueError:
            continue
        if isinstance(v, dict):
            return v
    return None


def tail(text, n=6):
    return " | ".join((text or "").strip().splitlines()[-n:])[-1200:]


def run_role(a, role, env, timeout):
    """A role in a fresh process: its JSON (or None), a failure (or None), stderr's tail."""
    if timeout < 20:
        return None, "%s not run: %d s left of --budget" % (role, max(timeout, 0)), ""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--layers", str(a.layers),
           "--dim", str(a.dim), "--batch", str(a.batch), "--warm", str(a.warm), "--device", str(a.device),
           "--hog-margin", str(a.hog_margin), "--hog-timeout", str(a.hog_timeout)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, "%s timed out after %d s: %s" % (role, timeout, tail(err)), err
    out = last_json(p.stdout)
    if out is not None:
        out["wall_s"] = time.monotonic() - t0
        out["returncode"] = p.returncode
    if p.returncode != 0 or out is None:
        return out, "%s exited with status %d: %s" % (role, p.returncode, tail(p.stderr)), p.stderr
    return out, None, p.stderr


def finish(res, out_path, status):
    print(json.dumps(res, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warm", type=int, default=2, help="sleep/wake cycles after the first")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--hog-margin", type=parse_bytes, default=parse_bytes("2GiB"),
                    help="device memory the hog leaves free (its own context needs some)")
    ap.add_argument("--hog-timeout", type=int, default=90)
    ap.add_argument("--hog-bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-naive", action="store_true", help="skip the naive peer")
    ap.add_argument("--run-timeout", type=int, default=240, help="seconds per process")
    ap.add_argument("--budget", type=int, default=0,
                    help="seconds for everything (0: no limit): a process gets what is left")
    ap.add_argument("--role", choices=("gpumem", "naive", "hog"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "gpumem":
        return role_gpumem(a)
    if a.role == "naive":
        return role_naive(a)
    if a.role == "hog":
        return role_hog(a)

    args = [w for w in sys.argv[1:]]
    if "--out" in args:  # no machine paths in the results
        i = args.index("--out")
        del args[i:i + 2]
    res = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
           "command": " ".join(["scripts/device/plugins/offload_torch.py"] + args),
           "commit": os.environ.get("GM_COMMIT", "unknown"), "tag": TAG, "layers": a.layers, "dim": a.dim,
           "batch": a.batch, "dtype": "float32", "warm_cycles": a.warm, "hog_margin": a.hog_margin}
    try:
        import torch
    except ImportError as e:
        res["torch_skipped"] = "PyTorch is not installed (%s)" % e
        print("offload_torch.py: skipped: " + res["torch_skipped"], file=sys.stderr)
        return finish(res, a.out, 0)
    if not torch.cuda.is_available():
        res["torch_skipped"] = "PyTorch %s sees no CUDA device" % torch.__version__
        print("offload_torch.py: skipped: " + res["torch_skipped"], file=sys.stderr)
        return finish(res, a.out, 0)
    res["torch_version"] = torch.__version__
    del torch  # the coordinator never touches the GPU

    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not env.get("GPUMEM_LIBRARY"):
        lib = os.path.join(ROOT, "build", "libgpumem.so")
        if os.path.exists(lib):
            env["GPUMEM_LIBRARY"] = lib
    env["GPUMEM_BACKEND"] = "cuda"
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    for k in ("GPUMEM_BROKER", "GPUMEM_LIMIT", "GPUMEM_EVICT", "GPUMEM_DEVICE"):
        env.pop(k, None)

    started = time.monotonic()

    def timeout():
        if a.budget <= 0:
            return a.run_timeout
        return int(min(a.run_timeout, a.budget - (time.monotonic() - started) - 5))

    errors = []
    g, why, err = run_role(a, "gpumem", env, timeout())
    if why:
        errors.append(why)
    if g:
        errors += g.pop("errors", [])
        for k, v in g.items():
            if k in ("wall_s", "returncode", "phase"):
                res["gpumem_" + k] = v
            elif k != "role":
                res[k] = v
    if err and (why or not g):
        res["gpumem_stderr_tail"] = tail(err, 20)

    if not a.no_naive:
        nenv = dict(env)
        nenv.pop("GPUMEM_LIBRARY", None)
        n, why, err = run_role(a, "naive", nenv, timeout())
        if why:
            errors.append(why)
        if n:
            errors += ["naive: " + e for e in n.pop("errors", [])]
            for k, v in n.items():
                if k not in ("role",):
                    res["naive_" + k] = v
            if "output_bits_sum" in n and "output_bits_sum" in res:
                # same seeds, same kernels: gpumem's process built the same model
                res["same_output_as_default_allocator"] = n["output_bits_sum"] == res["output_bits_sum"]
    # headline ratios
    for k in ("sleep_s", "wake_s", "sleep_warm_s", "wake_warm_s"):
        if res.get(k) and res.get("naive_" + k):
            res["speedup_vs_naive_" + k[:-2]] = res["naive_" + k] / res[k]
    res["errors"] = errors
    ok = (not errors and res.get("sleep_wake_identical") is True and res.get("params_identical") is True
          and res.get("hog_ok") is True)
    print("offload_torch.py: %s; sleep %.3f s, wake %.3f s (naive %s / %s); identical %s; freed %.3f; "
          "%d error(s)" % ("ok" if ok else "FAILED", res.get("sleep_s") or float("nan"),
                           res.get("wake_s") or float("nan"), res.get("naive_sleep_s"),
                           res.get("naive_wake_s"), res.get("sleep_wake_identical"),
                           res.get("freed_fraction") or float("nan"), len(errors)), file=sys.stderr)
    return finish(res, a.out, 0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
