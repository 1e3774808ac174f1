# SPDX-License-Identifier: Apache-2.0
"""One training run for the PyTorch parity figures: GPT-2 (transformers, from
its config) or ViT-B/16 (timm) on fixed random data, deterministic, with
PyTorch's allocator or gpumem (native or pluggable), eagerly or with the
whole training step (forward, backward, AdamW) captured once in a CUDA graph
and replayed.  Writes one JSON object: losses (exact float reprs), step
times in ms, the median of the steps after warm-up, the allocator used.

usage: python3 torch_parity_train.py --allocator default|native|pluggable
       --model gpt2|gpt2-plain|vit --out FILE [--graph | --capturable] [--steps 30] [--warmup 5]
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def PlainGPT2(torch, layers, d=768, heads=12, vocab=50257, ctx=1024):
    """GPT-2 small's architecture in plain PyTorch (learned positions, pre-norm
    blocks, GELU MLP, tied head, no dropout): what transformers' GPT-2 computes,
    without the host-to-device copies its forward makes, which a CUDA graph
    capture refuses."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) * (1.0 / (d // heads) ** 0.5)
            att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).triu(1), persistent=False)
            self.register_buffer("pos", torch.arange(ctx), persistent=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(self.pos[: idx.size(1)])
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.ln(x) @ self.wte.weight.t()

    return GPT2()


def build(a, torch):
    if a.model == "gpt2-plain":
        model = PlainGPT2(torch, a.layers).cuda()
        g = torch.Generator(device="cpu").manual_seed(7)
        data = torch.randint(0, 50257, (a.batch, a.seq), generator=g).cuda()

        def loss_fn(x):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     x[:, 1:].reshape(-1))
    elif a.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=a.layers, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg._attn_implementation = "eager"
        model = GPT2LMHeadModel(cfg).cuda()
        g = torch.Generator(device="cpu").manual_seed(7)
        data = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g).cuda()

        def loss_fn(x):
            return model(input_ids=x, labels=x).loss
    else:
        import timm
        model = timm.create_model("vit_base_patch16_224", num_classes=1000, drop_rate=0.0,
                                  drop_path_rate=0.0).cuda()
        g = torch.Generator(device="cpu").manual_seed(7)
        data = torch.randn(a.batch, 3, 224, 224, generator=g).cuda()
        target = torch.randint(0, 1000, (a.batch,), generator=g).cuda()

        def loss_fn(x):
            return torch.nn.functional.cross_entropy(model(x), target)
    return model, data, loss_fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=("default", "native", "pluggable"), required=True)
    ap.add_argument("--model", choices=("gpt2", "gpt2-plain", "vit"), default="gpt2")
    ap.add_argument("--out", required=True)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--capturable", action="store_true",
                    help="AdamW(capturable=True) in an eager run too (the graph run's optimizer), "
                         "so that its losses are comparable with the graph run's bit for bit")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    a = ap.parse_args()
    a.batch = a.batch or (64 if a.model == "vit" else 8)

    if a.allocator != "default":
        import gpumem.torch
        gpumem.torch.enable(allocator=a.allocator)
    import torch
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model, data, loss_fn = build(a, torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=a.graph or a.capturable)
    losses, times = [], []

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(data)
        loss.backward()
        opt.step()
        return loss

    if a.graph:
        # Warm-up on a side stream, then capture one whole step; each later
        # step is a replay.  The warm-up steps count as steps (their losses
        # are recorded) so that the loss sequence matches the eager run's.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                t0 = time.perf_counter()
                loss = step()
                losses.append(repr(float(loss)))
                times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=False)
        with torch.cuda.graph(graph):
            static_loss = step()
        # The capture did not run the step: replay it as step 4.
        for i in range(3, a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(repr(float(static_loss)))
    else:
        for i in range(a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(repr(float(loss)))

    kind = a.allocator
    if a.allocator != "default":
        import gpumem.torch
        kind = gpumem.torch.allocator_kind()
    res = {"model": a.model, "allocator": kind, "graph": a.graph, "batch": a.batch,
           "losses": losses, "step_ms": times,
           "median_step_ms": statistics.median(times[a.warmup:]),
           "max_memory_allocated": torch.cuda.max_memory_allocated() if kind != "pluggable" else None,
           "max_memory_reserved": torch.cuda.max_memory_reserved() if kind != "pluggable" else None}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("%s %s graph=%s median %.2f ms, loss[-1] %s" % (a.model, kind, a.graph, res["median_step_ms"],
                                                        losses[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
