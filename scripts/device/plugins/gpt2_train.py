# SPDX-License-Identifier: Apache-2.0
"""GPT-2 (transformers, built from its config: nothing downloaded) trained for
a few steps of AdamW on fixed random tokens, with PyTorch's default CUDA
allocator or with gpumem plugged in (--allocator gpumem), deterministically.
Writes one JSON object: losses (exact float reprs), step times, peaks.

usage: python3 gpt2_train.py --allocator default|gpumem --out FILE
       [--steps 20] [--batch 8] [--seq 512] [--layers 12]

Peaks: default: torch.cuda.max_memory_reserved / max_memory_allocated.
gpumem: the pool's reserved_peak, and allocated_peak = the peak of the bytes
PyTorch asked for (a plugged allocator is asked for exact tensor sizes, so
this is the figure comparable to PyTorch's allocated).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=("default", "gpumem"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                    help="llama: a small Llama (hidden 1024, 16 heads, MLP 2816) from its config")
    a = ap.parse_args()

    import torch
    if a.allocator == "gpumem":
        import gpumem
        import gpumem.torch
        gpumem.torch.enable()  # before anything touches CUDA
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    # Eager attention: its backward is deterministic.
    if a.model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=a.layers,
                          num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                          max_position_embeddings=max(1024, a.seq))
        cfg._attn_implementation = "eager"
        model = LlamaForCausalLM(cfg).cuda()
    else:
        try:
            cfg = GPT2Config(n_layer=a.layers, n_positions=max(1024, a.seq), attn_implementation="eager")
        except TypeError:
            cfg = GPT2Config(n_layer=a.layers, n_positions=max(1024, a.seq))
        try:
            cfg._attn_implementation = "eager"
        except Exception:  # noqa: BLE001 — older/newer transformers
            pass
        model = GPT2LMHeadModel(cfg).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(42)
    batches = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen) for _ in range(4)]

    def driver_calls():
        # gpumem's driver calls by kind so far (every call the pool made)
        return dict(gpumem.stats()["backend_calls"]) if a.allocator == "gpumem" else {}

    def device_allocs():
        # PyTorch's own allocator: its cudaMalloc calls so far
        return torch.cuda.memory_stats(0).get("num_device_alloc", 0) if a.allocator != "gpumem" else None

    def allocated_peak():
        if a.allocator == "gpumem":
            return gpumem.torch.memory_stats(0)["allocated_peak"]
        return torch.cuda.max_memory_allocated(0)

    losses, times = [], []
    calls_after = []  # driver calls by kind after each of the first two steps
    dev_allocs_after, peak_after = [], []  # the same for PyTorch's allocator; live peaks
    for step in range(a.steps):
        x = batches[step % len(batches)].cuda(non_blocking=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(out.loss.item())
        del out, x
        if step < 2:
            calls_after.append(driver_calls())
            dev_allocs_after.append(device_allocs())
            peak_after.append(allocated_peak())

    res = {
        "allocator": a.allocator, "model": a.model, "steps": a.steps, "batch": a.batch, "seq": a.seq, "layers": a.layers,
        "losses": [repr(v) for v in losses], "step_times_s": times,
        "median_step_s_5_20": statistics.median(times[4:]) if len(times) > 4 else statistics.median(times),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
    }
    # The live peak after steps 1 and 2 and at the end: growth after the
    # first step is new live data (AdamW's state lives from the first
    # optimizer step on), not churn.
    res.update(allocated_peak_after_steps_1_2_end=peak_after + [allocated_peak()])
    if a.allocator != "gpumem" and len(dev_allocs_after) > 1:
        n_end = device_allocs()
        res.update(device_allocs_after_first_step=n_end - dev_allocs_after[0],
                   device_allocs_after_second_step=n_end - dev_allocs_after[1])
    if a.allocator == "gpumem":
        end = driver_calls()

        def since(c):
            return {k: end[k] - c.get(k, 0) for k in end if end[k] != c.get(k, 0)}
        d1 = since(calls_after[0]) if calls_after else {}
        d2 = since(calls_after[1]) if len(calls_after) > 1 else {}
        res.update(driver_calls_after_first_step=sum(d1.values()),
                   driver_calls_after_first_step_by_kind=d1,
                   stream_syncs_after_first_step=d1.get("stream_sync", 0),
                   driver_calls_after_second_step=sum(d2.values()),
                   driver_calls_after_second_step_by_kind=d2,
                   stream_syncs_after_second_step=d2.get("stream_sync", 0))
        s = gpumem.torch.memory_stats(0)
        res.update(peak_reserved=s["reserved_peak"], peak_allocated=s["allocated_peak"],
                   peak_active=s["active_peak"], gpumem_stats=s, hooks=list(gpumem.torch.hooks()))
        # The empty_cache hook: cached memory goes back to the device.
        torch.cuda.empty_cache()
        after = gpumem.torch.memory_stats(0)
        res.update(after_empty_cache_reserved=after["reserved"], after_empty_cache_allocated=after["allocated"])
    else:
        res.update(peak_reserved=torch.cuda.max_memory_reserved(0),
                   peak_allocated=torch.cuda.max_memory_allocated(0))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("%s: %d steps, median step %.2f ms, peak reserved %.3f GB, peak allocated %.3f GB, last loss %s"
          % (a.allocator, a.steps, 1e3 * res["median_step_s_5_20"], res["peak_reserved"] / 1e9,
             res["peak_allocated"] / 1e9, res["losses"][-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
