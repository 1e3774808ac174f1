# SPDX-License-Identifier: Apache-2.0
"""PyTorch training under a gpumem broker (`gpumem broker`, docs/broker.md).

A small GPT-2-like model (transformers' GPT2LMHeadModel from a config, nothing
downloaded; a small hand-written causal transformer when transformers cannot
be imported) trains STEPS steps of AdamW on fixed random tokens with fixed
seeds and deterministic algorithms, twice, each in a fresh process with
gpumem as PyTorch's allocator (gpumem.torch.enable()):

  broker  GPUMEM_BROKER names a broker this script starts (`gpumem broker
          --config FILE`) whose tenant for this user has a quota (--quota)
  local   no broker: the pool makes its pages with the driver

and compares the losses bit for bit.  Then a third process trains the same
model under a broker whose quota is too small (--small-quota): it must fail
with a clean out-of-memory error (torch.OutOfMemoryError, or a RuntimeError
naming the quota), not crash, and CUDA must still work in it afterwards.
The tenant's peak comes from the broker's own books (its stats_file, written
when it stops).

Prints one JSON object (also to --out), keys prefixed torch_.  Exit status 0
when the runs went through (the figures say whether the goals are met), 0
with torch_skipped set when PyTorch or CUDA is missing, 1 on a failure.

usage: python3 broker_torch.py [--out FILE] [--cli PATH] [--steps 20]
       [--quota 8GiB] [--small-quota 256MiB] [--layers 4] [--batch 8]
       [--seq 256] [--run-timeout 75] [--budget SECONDS]
The gpumem CLI: --cli, else $GPUMEM_CLI, else build/gpumem of this checkout.
The Python package: python/ of this checkout is put on PYTHONPATH; the
library: $GPUMEM_LIBRARY, else build/libgpumem.so of this checkout.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TENANT = "torch"


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError("not a size: %r (e.g. 4GiB, 256MiB)" % text)
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# ---- the training process ---------------------------------------------------------


def build_model(torch, layers, seq):
    """GPT-2 from transformers (from its config), else a hand-written one."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        kw = dict(n_layer=layers, n_embd=512, n_head=8, n_positions=max(256, seq),
                  vocab_size=50257)
        try:
            cfg = GPT2Config(attn_implementation="eager", **kw)
        except TypeError:
            cfg = GPT2Config(**kw)
        try:
            cfg._attn_implementation = "eager"  # its backward is deterministic
        except Exception:  # noqa: BLE001 - older/newer transformers
            pass
        model = GPT2LMHeadModel(cfg)

        def loss_of(x):
            return model(input_ids=x, labels=x).loss
        return model, loss_of, cfg.vocab_size, "transformers.GPT2LMHeadModel"
    except Exception as e:  # noqa: BLE001 - any import or build failure: the fallback
        why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")

    nn = torch.nn
    F = torch.nn.functional
    vocab, dim, heads = 50257, 512, 8

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc = nn.Linear(dim, 4 * dim)
            self.out = nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / float(c // heads) ** 0.5
            mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(max(256, seq), dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)

        def forward(self, x):
            h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            for blk in self.blocks:
                h = blk(h)
            return self.ln(h) @ self.tok.weight.t()  # tied head

    model = TinyGPT()

    def loss_of(x):
        logits = model(x)
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
    return model, loss_of, vocab, "hand-written (transformers unavailable: %s)" % why


def train(a):
    """One training run in this process; prints one JSON line last."""
    res = {"mode": a.mode}
    import torch
    import gpumem
    import gpumem.torch
    gpumem.torch.enable()  # before anything touches CUDA
    res["gpumem_library"] = gpumem.library_path()
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    # Deterministic kernels wherever PyTorch has them (warn_only: an op
    # without one warns instead of failing; the loss comparison tells).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    phase = "model"
    losses, times = [], []
    model = opt = loss_of = batches = loss = x = None
    failed = False
    try:
        model, loss_of, vocab, kind = build_model(torch, a.layers, a.seq)
        res["model"] = kind
        res["params"] = sum(p.numel() for p in model.parameters())
        model = model.cuda()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator(device="cpu").manual_seed(42)
        batches = [torch.randint(0, vocab, (a.batch, a.seq), generator=gen) for _ in range(4)]
        for step in range(a.steps):
            phase = "step %d" % step
            x = batches[step % len(batches)].cuda()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = loss_of(x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            loss = x = None
        phase = "done"
    except Exception as e:  # noqa: BLE001 - the over-quota run reports what PyTorch raised
        if not a.expect_oom:
            raise
        failed = True
        msg = str(e)
        oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        res.update(error_phase=phase, error_type="%s.%s" % (type(e).__module__, type(e).__name__),
                   error_message=" | ".join(msg.splitlines())[:800],
                   error_is_torch_oom=isinstance(e, oom_type),
                   error_is_runtime_error=isinstance(e, RuntimeError),
                   error_names_quota="quota" in msg.lower(),
                   gpumem_is_out_of_memory=bool(gpumem.is_out_of_memory(e)))
    if failed:
        # The exception (and its frames) is gone: let go of what the run
        # held, then check that CUDA still works in this process.
        model = opt = loss_of = batches = loss = x = None
        import gc
        gc.collect()
        try:
            torch.cuda.empty_cache()
            y = torch.arange(1000, device="cuda", dtype=torch.float32)
            res["cuda_works_after"] = float(y.sum().item()) == 499500.0
        except Exception as e2:  # noqa: BLE001
            res["cuda_works_after"] = False
            res["after_error"] = str(e2).splitlines()[0][:300] if str(e2) else type(e2).__name__
    res["phase"] = phase
    res["losses"] = [repr(v) for v in losses]
    res["losses_hex"] = [float.hex(v) for v in losses]
    res["step_times_s"] = times
    if times:
        tail = times[4:] if len(times) > 4 else times
        res["median_step_s"] = statistics.median(tail)
    s = gpumem.torch.memory_stats(0)
    res["reserved_peak"] = s.get("reserved_peak")
    res["allocated_peak"] = s.get("allocated_peak")
    res["torch"] = torch.__version__
    res["cuda"] = torch.version.cuda
    res["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(res), flush=True)
    return 0


# ---- the coordinator ----------------------------------------------------------------


class Broker:
    """`gpumem broker --config FILE` in a process of its own."""

    def __init__(self, cli, workdir, name, quota, device, backend="cuda"):
        self.name = name
        self.sock = os.path.join(workdir, name + ".sock")
        self.stats = os.path.join(workdir, name + ".json")
        self.conf = os.path.join(workdir, name + ".conf")
        self.log = os.path.join(workdir, name + ".log")
        with open(self.conf, "w") as f:
            f.write("# broker_torch.py\nsocket = %s\nbackend = %s\ndevice = %d\nstats_file = %s\n"
                    "reclaim_ms = 200\n[tenant %s]\nusers = %d\nquota = %d\n"
                    % (self.sock, backend, device, self.stats, TENANT, os.geteuid(), quota))
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen([cli, "broker", "--config", self.conf], stdout=self.logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # It writes its stats file once it listens.
        end = time.monotonic() + 60
        while not (os.path.exists(self.stats) and os.path.exists(self.sock)):
            if self.proc.poll() is not None:
                raise RuntimeError("the broker exited with status %s before it listened: %s"
                                   % (self.proc.returncode, self.log_tail()))
            if time.monotonic() > end:
                self.proc.kill()
                raise RuntimeError("the broker did not listen in 60 s: " + self.log_tail())
            time.sleep(0.02)

    def log_tail(self):
        try:
            with open(self.log) as f:
                return " | ".join(f.read().splitlines()[-6:])
        except OSError:
            return "(no log)"

    def stop(self):
        """SIGTERM; its tenant row as it wrote it when it stopped (or None), and its status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        row = None
        try:
            with open(self.stats) as f:
                for t in json.load(f).get("tenants", []):
                    if t.get("name") == TENANT:
                        row = t
        except (OSError, ValueError):
            pass
        return row, self.proc.returncode


def run_train(args, mode, env, timeout, expect_oom=False):
    """A training process; its JSON (None), a short description of a
    failure (None), and its exit status."""
    if timeout < 20:
        return None, "not run: %d s left of --budget" % max(timeout, 0), None
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "train", "--mode", mode,
           "--steps", str(args.steps), "--layers", str(args.layers), "--batch", str(args.batch),
           "--seq", str(args.seq)]
    if expect_oom:
        cmd.append("--expect-oom")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-400:]
        if isinstance(tail, bytes):
            tail = tail.decode(errors="replace")
        return None, "timed out after %d s: %s" % (timeout, tail), None
    wall = time.monotonic() - t0
    out = None
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            out = json.loads(line)
            break
        except ValueError:
            continue
    if out is not None:
        out["wall_s"] = wall
        out["returncode"] = p.returncode
    if p.returncode != 0 or out is None:
        why = "exit status %d: %s" % (p.returncode, " | ".join(p.stderr.strip().splitlines()[-5:]))
        return out, why, p.returncode
    return out, None, p.returncode


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def finish(res, out_path, status):
    print(json.dumps(res, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--cli", default=os.environ.get("GPUMEM_CLI"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--quota", type=parse_bytes, default=parse_bytes("8GiB"))
    ap.add_argument("--small-quota", type=parse_bytes, default=parse_bytes("256MiB"))
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--run-timeout", type=int, default=75)
    ap.add_argument("--budget", type=int, default=0,
                    help="seconds for everything (0: no limit): a run gets what is left")
    ap.add_argument("--broker-backend", default="cuda", choices=("cuda", "sim"),
                    help="the brokers' backend (sim: to test this script's plumbing only)")
    ap.add_argument("--role")
    ap.add_argument("--mode")
    ap.add_argument("--expect-oom", action="store_true")
    a = ap.parse_args()
    if a.role == "train":
        return train(a)

    res = {"torch_date": time.strftime("%Y-%m-%d"), "torch_command": " ".join(sys.argv),
           "torch_commit": os.environ.get("GM_COMMIT", "unknown")}
    # PyTorch with CUDA, or a clean skip.
    try:
        import torch
    except ImportError as e:
        res["torch_skipped"] = "PyTorch is not installed (%s)" % e
        print("broker_torch.py: skipped: " + res["torch_skipped"], file=sys.stderr)
        return finish(res, a.out, 0)
    if not torch.cuda.is_available():
        res["torch_skipped"] = "PyTorch %s sees no CUDA device" % torch.__version__
        print("broker_torch.py: skipped: " + res["torch_skipped"], file=sys.stderr)
        return finish(res, a.out, 0)
    res.update(torch_version=torch.__version__, torch_cuda=torch.version.cuda, torch_gpu=gpu_name())
    del torch  # the parent never touches the GPU

    cli = a.cli or os.path.join(ROOT, "build", "gpumem")
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        res["torch_error"] = ("no gpumem CLI at %s: give --cli PATH or GPUMEM_CLI (the gpumem "
                              "binary of the build)" % cli)
        print("broker_torch.py: " + res["torch_error"], file=sys.stderr)
        return finish(res, a.out, 1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not env.get("GPUMEM_LIBRARY"):
        lib = os.path.join(os.path.dirname(os.path.abspath(cli)), "libgpumem.so")
        if os.path.exists(lib):
            env["GPUMEM_LIBRARY"] = lib
    env["GPUMEM_BACKEND"] = "cuda"
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env.pop("GPUMEM_BROKER", None)
    env.pop("GPUMEM_LIMIT", None)
    res.update(torch_cli=cli, torch_library=env.get("GPUMEM_LIBRARY"), torch_steps=a.steps,
               torch_layers=a.layers, torch_batch=a.batch, torch_seq=a.seq,
               torch_quota_bytes=a.quota, torch_small_quota_bytes=a.small_quota)

    started = time.monotonic()

    def run_timeout():
        if a.budget <= 0:
            return a.run_timeout
        return int(min(a.run_timeout, a.budget - (time.monotonic() - started) - 5))

    work = tempfile.mkdtemp(prefix="gmbt.", dir="/tmp")
    errors = []
    try:
        # 1. under the broker
        runs = {}
        try:
            b = Broker(cli, work, "torch", a.quota, a.device, a.broker_backend)
        except (OSError, RuntimeError) as e:
            b = None
            errors.append("broker: %s" % e)
        if b:
            benv = dict(env, GPUMEM_BROKER=b.sock)
            out, why, _ = run_train(a, "broker", benv, run_timeout())
            row, st = b.stop()
            runs["broker"] = out
            if why:
                errors.append("the run under the broker failed: " + why)
            if st != 0:
                errors.append("the broker exited with status %s: %s" % (st, b.log_tail()))
            if row:
                res["torch_tenant_peak_bytes"] = row.get("peak")
                res["torch_tenant_used_after_bytes"] = row.get("used")
                res["torch_tenant_refusals"] = row.get("refusals")
                res["torch_peak_within_quota"] = (row.get("peak") or 0) <= a.quota
            else:
                errors.append("the broker's stats file has no row for tenant %s" % TENANT)
        # 2. without it
        out, why, _ = run_train(a, "local", env, run_timeout())
        runs["local"] = out
        if why:
            errors.append("the run without the broker failed: " + why)
        for mode in ("broker", "local"):
            r = runs.get(mode) or {}
            res["torch_losses_%s" % mode] = r.get("losses")
            res["torch_step_ms_%s" % mode] = [1e3 * t for t in r.get("step_times_s", [])]
            res["torch_median_step_ms_%s" % mode] = (1e3 * r["median_step_s"]
                                                      if "median_step_s" in r else None)
            res["torch_reserved_peak_%s" % mode] = r.get("reserved_peak")
            res["torch_model"] = res.get("torch_model") or r.get("model")
        lb, ll = res.get("torch_losses_broker"), res.get("torch_losses_local")
        res["torch_losses_identical"] = bool(lb) and lb == ll and len(lb) == a.steps
        if lb and ll and lb != ll:
            res["torch_first_differing_step"] = next(
                (i for i, (x, y) in enumerate(zip(lb, ll)) if x != y), min(len(lb), len(ll)))
        if res.get("torch_median_step_ms_broker") and res.get("torch_median_step_ms_local"):
            res["torch_step_time_ratio"] = (res["torch_median_step_ms_broker"]
                                            / res["torch_median_step_ms_local"])
        # 3. a quota too small for the model
        try:
            b = Broker(cli, work, "small", a.small_quota, a.device, a.broker_backend)
        except (OSError, RuntimeError) as e:
            b = None
            errors.append("broker (small quota): %s" % e)
        if b:
            out, why, rc = run_train(a, "broker", dict(env, GPUMEM_BROKER=b.sock), run_timeout(),
                                     expect_oom=True)
            row, st = b.stop()
            o = out or {}
            res["torch_over_quota_phase"] = o.get("error_phase") or o.get("phase")
            res["torch_over_quota_exception"] = o.get("error_type")
            res["torch_over_quota_message"] = o.get("error_message")
            res["torch_over_quota_cuda_works_after"] = o.get("cuda_works_after")
            res["torch_over_quota_returncode"] = rc
            res["torch_over_quota_tenant_peak_bytes"] = row.get("peak") if row else None
            clean = (out is not None and rc == 0 and o.get("error_type") is not None
                     and (o.get("error_is_torch_oom") or (o.get("error_is_runtime_error")
                                                          and o.get("error_names_quota"))))
            res["torch_over_quota_error"] = bool(clean)
            if why and out is None:
                res["torch_over_quota_note"] = why
            if out is not None and o.get("error_type") is None:
                res["torch_over_quota_note"] = ("the run went through: quota %d bytes was not too "
                                                "small for the model" % a.small_quota)
            if st != 0:
                errors.append("the small-quota broker exited with status %s: %s"
                              % (st, b.log_tail()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["torch_errors"] = errors
    for e in errors:
        print("broker_torch.py: FAILED " + e, file=sys.stderr)
    return finish(res, a.out, 1 if errors else 0)


if __name__ == "__main__":
    sys.exit(main())
