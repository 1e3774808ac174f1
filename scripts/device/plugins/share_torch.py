# SPDX-License-Identifier: Apache-2.0
"""gpumem.share with real PyTorch (and CuPy when installed) on a GPU: one
process publishes weights made of many tensors in one shareable buffer; a
second process opens them as tensors and as a CuPy array with no copy, checks
them, and tries to write through the read-only import; then the exporter is
killed with SIGKILL and the importer checks that its tensors still read
right.  Prints one JSON object (also to --out).

usage: python3 share_torch.py [--out FILE] [--tensors 500] [--mib 2048]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def exporter(path, n, mib):
    import torch
    import gpumem.share as share
    torch.cuda.init()
    per = (mib << 20) // n // 2  # float16 elements per tensor
    buf = share.Buffer(n * per * 2)
    views = [buf.as_tensor(torch.float16, (per,), offset=i * per * 2) for i in range(n)]
    for i, v in enumerate(views):
        v.fill_(float(i % 1000))
    torch.cuda.synchronize()
    srv = share.Server(path)
    t0 = time.monotonic()
    srv.publish("weights", buf, read_only=True)
    print(json.dumps({"ready": True, "t_publish": t0, "per": per}), flush=True)
    time.sleep(3600)  # killed by the parent


def importer(path, n, per, t_publish):
    import torch
    import gpumem.share as share
    out = {}
    cli = share.Client(path)
    imp = cli.open("weights")
    ts = [imp.as_tensor(torch.float16, (per,), offset=i * per * 2) for i in range(n)]
    ok = all(float(t[0].item()) == float(i % 1000) and float(t[-1].item()) == float(i % 1000)
             for i, t in enumerate(ts))
    out["open_and_check_s"] = time.monotonic() - t_publish
    out["tensors_ok"] = ok
    out["read_only"] = imp.read_only
    try:
        import cupy
        a = cupy.asarray(imp)
        out["cupy_ok"] = int(a[0]) == int(ts[0].view(torch.uint8)[0].item())
    except ImportError:
        out["cupy_ok"] = None
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        out["cupy_ok"] = False
        out["cupy_error"] = str(e).splitlines()[0][:200]
    print(json.dumps(out), flush=True)
    line = sys.stdin.readline()  # the exporter is dead now
    torch.cuda.synchronize()
    out2 = {"after_exporter_killed_ok": all(float(t[0].item()) == float(i % 1000)
                                            for i, t in enumerate(ts))}
    del ts
    imp.release()
    cli.close()
    out2["released"] = True
    print(json.dumps(out2), flush=True)
    assert line


def write_ro(path):
    """In a process of its own: a write through the read-only import."""
    import torch
    import gpumem.share as share
    cli = share.Client(path)
    imp = cli.open("weights")
    t = imp.as_tensor(torch.uint8, (16,))
    try:
        t.fill_(7)
        torch.cuda.synchronize()
        res = {"readonly_write": "succeeded"}
    except Exception as e:  # an illegal-address fault poisons this context
        res = {"readonly_write": "failed", "error": str(e).splitlines()[0][:200]}
    print(json.dumps(res), flush=True)
    os._exit(0)


def _gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--tensors", type=int, default=500)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--role")
    ap.add_argument("--path")
    ap.add_argument("--per", type=int)
    ap.add_argument("--t0", type=float)
    a = ap.parse_args()
    if a.role == "exporter":
        return exporter(a.path, a.tensors, a.mib)
    if a.role == "importer":
        return importer(a.path, a.tensors, a.per, a.t0)
    if a.role == "write_ro":
        return write_ro(a.path)
    path = os.path.join(tempfile.gettempdir(), "gm-share-torch-%d.sock" % os.getpid())
    me = [sys.executable, os.path.abspath(__file__), "--path", path, "--tensors", str(a.tensors)]
    ex = subprocess.Popen(me + ["--role", "exporter", "--mib", str(a.mib)], stdout=subprocess.PIPE,
                          text=True)
    ready = json.loads(ex.stdout.readline())
    res = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
           "commit": os.environ.get("GM_COMMIT", "unknown"), "gpu": _gpu_name(),
           "tensors": a.tensors, "mib": a.mib}
    im = subprocess.Popen(me + ["--role", "importer", "--per", str(ready["per"]), "--t0",
                                str(ready["t_publish"])], stdout=subprocess.PIPE,
                          stdin=subprocess.PIPE, text=True)
    res.update(json.loads(im.stdout.readline()))
    ro = subprocess.run(me + ["--role", "write_ro"], capture_output=True, text=True, timeout=120)
    try:
        res.update(json.loads(ro.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        res["readonly_write"] = "unknown: " + ro.stderr[-300:]
    ex.send_signal(signal.SIGKILL)
    ex.wait()
    im.stdin.write("go\n")
    im.stdin.flush()
    res.update(json.loads(im.stdout.readline()))
    im.wait(timeout=120)
    res["importer_rc"] = im.returncode
    res["readonly_enforced"] = res.get("readonly_write") == "failed"
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["tensors_ok"] and res["after_exporter_killed_ok"] and im.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
