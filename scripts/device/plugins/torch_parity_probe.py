# SPDX-License-Identifier: Apache-2.0
"""What a PyTorch user keeps and loses under gpumem.torch.enable(): each
feature of the parity matrix (docs/python.md) tried in a fresh process, once
with PyTorch's own allocator and once with gpumem plugged in, and recorded
as "works" or "fails: <first line of the error>".  A probe that crashes the
process (a fault, an abort) is recorded as such.  Writes one JSON object:
{"rows": {name: {"default": …, "native": …, "pluggable": …}}, "torch": …,
"gpu": …}: "default" is PyTorch's own allocator, the others
gpumem.torch.enable(allocator=...).

usage: python3 torch_parity_probe.py --out FILE [--only NAME,...]
           [--allocators default,native,pluggable]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

PROBES = {
    "memory_allocated": """
        x = torch.empty(1 << 20, device="cuda")
        assert torch.cuda.memory_allocated() >= 4 << 20
        torch.cuda.max_memory_allocated(); torch.cuda.memory_reserved()
    """,
    "memory_stats": """
        x = torch.empty(1 << 20, device="cuda")
        s = torch.cuda.memory_stats(); assert s["allocated_bytes.all.current"] >= 4 << 20
    """,
    "memory_summary": """
        x = torch.empty(1 << 20, device="cuda")
        assert "Allocated" in torch.cuda.memory_summary() or len(torch.cuda.memory_summary()) > 0
    """,
    "memory_snapshot": """
        x = torch.empty(1 << 20, device="cuda")
        torch.cuda.memory._snapshot()
    """,
    "empty_cache": """
        x = torch.empty(1 << 24, device="cuda"); del x
        torch.cuda.empty_cache()
    """,
    "set_per_process_memory_fraction": """
        torch.cuda.set_per_process_memory_fraction(0.01)
        try:
            torch.empty(1 << 33, device="cuda", dtype=torch.uint8)
            raise SystemExit("an allocation over the fraction succeeded")
        except torch.cuda.OutOfMemoryError:
            pass
        except RuntimeError as e:
            if "out of memory" not in str(e): raise
    """,
    "oom_exception_type": """
        try:
            torch.empty(1 << 50, device="cuda", dtype=torch.uint8)
            raise SystemExit("a 1 PiB allocation succeeded")
        except torch.cuda.OutOfMemoryError:
            pass
    """,
    "oom_observer": """
        seen = []
        torch.cuda.init()
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
        try:
            torch.empty(1 << 50, device="cuda", dtype=torch.uint8)
        except torch.cuda.OutOfMemoryError:
            pass
        assert len(seen) == 1 and seen[0][0] == 0, seen
    """,
    "cudnn_benchmark": """
        torch.backends.cudnn.benchmark = True
        m = torch.nn.Conv2d(3, 16, 3).cuda(); x = torch.randn(8, 3, 64, 64, device="cuda")
        m(x).sum().backward(); torch.cuda.synchronize()
    """,
    "graph_pool_kept": """
        # Memory a graph captured (its output and the intermediate freed
        # inside the capture) must not be handed to tensors made after it.
        x = torch.randn(1 << 20, device="cuda")
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): y = (x * 2).sin() + 1
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            t = x * 2
            y = t.sin() + 1
            del t
        others = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(8)]
        x.copy_(torch.linspace(0, 1, 1 << 20, device="cuda")); g.replay(); torch.cuda.synchronize()
        assert torch.allclose(y, (x * 2).sin() + 1)
        assert all(bool((o == 7.0).all()) for o in others)
        del g, y; torch.cuda.synchronize(); torch.cuda.empty_cache()
    """,
    "cuda_graph": """
        x = torch.randn(1024, 1024, device="cuda")
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): y = x @ x
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x @ x
        x.copy_(torch.ones_like(x)); g.replay(); torch.cuda.synchronize()
        assert float(y[0, 0]) == 1024.0
    """,
    "make_graphed_callables": """
        m = torch.nn.Linear(64, 64).cuda(); x = torch.randn(8, 64, device="cuda", requires_grad=True)
        gm = torch.cuda.make_graphed_callables(m, (x,))
        gm(x).sum().backward(); torch.cuda.synchronize()
    """,
    "compile_reduce_overhead": """
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda()
        f = torch.compile(m, mode="reduce-overhead")
        for i in range(6):
            x = torch.randn(8, 64, device="cuda"); y = f(x)
            assert torch.allclose(y, m(x), atol=1e-5), i
        torch.cuda.synchronize()
    """,
    "compile_default": """
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).cuda()
        f = torch.compile(m)
        x = torch.randn(8, 64, device="cuda")
        for _ in range(3): y = f(x)
        torch.cuda.synchronize()
    """,
    "mem_pool": """
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(1 << 20, device="cuda")
        del x
    """,
    "mem_pool_context_frees": """
        # A free made inside a use_mem_pool context, of a tensor from outside
        # it, gives the memory back at once (not at the context's end).
        x = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            before = torch.cuda.memory_allocated()
            del x
            assert torch.cuda.memory_allocated() <= before - (1 << 28)
            import gpumem.torch
            if gpumem.torch.is_enabled():
                import gpumem
                assert gpumem.stats(0)["allocated"] < 1 << 28, gpumem.stats(0)["allocated"]
            y = torch.empty(1 << 20, device="cuda")
        del y, pool
    """,
    "amp": """
        m = torch.nn.Linear(256, 256).cuda(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = m(torch.randn(32, 256, device="cuda")).float().sum()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); torch.cuda.synchronize()
    """,
    "activation_checkpointing": """
        from torch.utils.checkpoint import checkpoint
        m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
        x = torch.randn(32, 256, device="cuda", requires_grad=True)
        checkpoint(m, x, use_reentrant=False).sum().backward(); torch.cuda.synchronize()
    """,
    "pin_memory": """
        t = torch.randn(1 << 20).pin_memory(); assert t.is_pinned()
        d = t.to("cuda", non_blocking=True); torch.cuda.synchronize()
        assert torch.equal(d.cpu(), t)
    """,
    "record_stream": """
        s = torch.cuda.Stream(); x = torch.empty(1 << 20, device="cuda")
        with torch.cuda.stream(s): x.add_(1)
        x.record_stream(s); del x; torch.cuda.synchronize()
    """,
    "multiprocessing_cuda_tensor": """
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn"); q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q,)); p.start()
        t = q.get(timeout=30); v = float(t.sum()); del t
        p.join(60); assert v == 1024.0, v
    """,
    "multiprocessing_shareable": """
        # GPUMEM_TORCH_SHAREABLE=1 (PROBE_ENV): the same as the row above.
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn"); q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q,)); p.start()
        t = q.get(timeout=30); v = float(t.sum()); del t
        p.join(60); assert v == 1024.0, v
    """,
    "multiprocessing_producer_exits": """
        # The consumer keeps using (reading and writing) the tensor after the
        # producer process has exited.
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn"); q = ctx.Queue(); ack = ctx.Event()
        p = ctx.Process(target=_child_exits, args=(q, ack)); p.start()
        t = q.get(timeout=30); ack.set(); p.join(60)
        assert p.exitcode == 0, p.exitcode
        torch.cuda.synchronize()
        assert float(t.sum()) == 1024.0
        t.add_(1); torch.cuda.synchronize(); assert float(t.sum()) == 2048.0
        del t
    """,
    "multiprocessing_shared_writes": """
        # The memory is shared, not copied: the consumer writes through a view
        # at an offset in a bigger tensor and the producer sees the writes.
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn"); q = ctx.Queue(); back = ctx.Queue()
        p = ctx.Process(target=_child_writes, args=(q, back)); p.start()
        big, view = q.get(timeout=30)
        assert float(view.sum()) == 3000.0, float(view.sum())
        view.fill_(5); torch.cuda.synchronize(); back.put(1)
        r = q.get(timeout=30); del big, view
        p.join(60); assert r == "ok", r
    """,
}

# Environment of a row's processes (set before gpumem.torch.enable()).
PROBE_ENV = {
    "multiprocessing_shareable": {"GPUMEM_TORCH_SHAREABLE": "1"},
    "multiprocessing_producer_exits": {"GPUMEM_TORCH_SHAREABLE": "1"},
    "multiprocessing_shared_writes": {"GPUMEM_TORCH_SHAREABLE": "1MiB"},
}

CHILD_HELPERS = """
def _child(q):
    import torch
    t = torch.ones(1024, device="cuda")
    q.put(t)
    import time; time.sleep(3)


def _child_exits(q, ack):
    import torch
    t = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    q.put(t)
    ack.wait(60)


def _child_writes(q, back):
    import torch
    big = torch.full((1 << 20,), 3.0, device="cuda")
    torch.cuda.synchronize()
    q.put((big, big[1000:2000]))
    back.get(timeout=60)
    torch.cuda.synchronize()
    want = 3.0 * ((1 << 20) - 1000) + 5.0 * 1000
    ok = bool((big[1000:2000] == 5).all()) and float(big.sum()) == want
    q.put("ok" if ok else "the producer sees %r, not %r" % (float(big.sum()), want))
"""


def run_one(name, allocator, timeout):
    body = textwrap.dedent(PROBES[name])
    code = "import os, sys\n"
    if allocator != "default":
        code += "import gpumem.torch\ngpumem.torch.enable(allocator=%r)\n" % allocator
        code += "assert gpumem.torch.allocator_kind() == %r\n" % allocator
    code += "import torch\n" + CHILD_HELPERS + "\nif __name__ == '__main__':\n"
    code += textwrap.indent(body, "    ") + "\n    print('PROBE-OK')\n"
    # A file, not -c: torch.multiprocessing's spawn re-imports the main module.
    fd, path = tempfile.mkstemp(prefix="probe_%s_" % name, suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(code)
    try:
        env = dict(os.environ, **PROBE_ENV.get(name, {}))
        p = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "fails: timed out after %d s" % timeout
    finally:
        os.unlink(path)
    if p.returncode == 0 and "PROBE-OK" in p.stdout:
        return "works"
    lines = [ln for ln in (p.stderr or "").splitlines() if ln.strip()]
    err = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    if p.returncode < 0:
        return "fails: killed by signal %d (%s)" % (-p.returncode, err.strip()[:200])
    return "fails: %s" % err.strip()[:300]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--allocators", default="default,native,pluggable")
    a = ap.parse_args()
    allocators = a.allocators.split(",")
    names = [n for n in PROBES if not a.only or n in a.only.split(",")]
    import torch
    res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": {}}
    for n in names:
        row = {al: run_one(n, al, a.timeout) for al in allocators}
        res["rows"][n] = row
        print("%-28s %s" % (n, "  ".join("%s: %s" % (al, row[al][:90]) for al in allocators)), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
