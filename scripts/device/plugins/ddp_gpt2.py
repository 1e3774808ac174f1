# SPDX-License-Identifier: Apache-2.0
"""GPT-2 (transformers, from its config: nothing downloaded) trained with
DistributedDataParallel over NCCL on two GPUs of this machine, one process a
GPU, with PyTorch's own CUDA allocator or with gpumem as each rank's
allocator (--allocator gpumem: gpumem.torch.enable() in every rank before
CUDA starts; GPUMEM_NCCL=1 so pages are made the way NCCL's own allocator
makes them).  Same seeds, same data (each rank its own fixed batches), so
the two runs must give the same losses bit for bit.  Rank 0 writes one JSON
object: the losses (the mean over ranks, exact float reprs), step times.

usage: python3 ddp_gpt2.py --allocator default|gpumem --out FILE
       [--steps 12] [--batch 4] [--seq 256] [--layers 4]
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def rank_main(rank, a, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    if a.allocator == "gpumem":
        os.environ["GPUMEM_NCCL"] = "1"
        import gpumem.torch
        gpumem.torch.enable()  # before anything touches CUDA
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = GPT2Config(n_layer=a.layers, n_positions=max(1024, a.seq))
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001 — older/newer transformers
        pass
    model = DDP(GPT2LMHeadModel(cfg).cuda(rank), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(42 + rank)
    batches = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen) for _ in range(3)]
    losses, times = [], []
    for step in range(a.steps):
        x = batches[step % len(batches)].cuda(rank)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.detach().clone()
        dist.all_reduce(loss)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append((loss / world).item())
    res = {"allocator": a.allocator, "steps": a.steps, "layers": a.layers, "world": world,
           "losses": [repr(v) for v in losses], "step_times_s": times,
           "median_step_s": statistics.median(times[2:]),
           "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "gpu": torch.cuda.get_device_name(rank)}
    if a.allocator == "gpumem":
        s = gpumem.torch.memory_stats(rank)
        res.update(gpumem_reserved_peak=s["reserved_peak"], gpumem_allocated_peak=s["allocated_peak"])
    dist.destroy_process_group()
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print("%s: %d steps on %d GPUs, median step %.2f ms, last loss %s"
              % (a.allocator, a.steps, world, 1e3 * res["median_step_s"], res["losses"][-1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=("default", "gpumem"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--port", type=int, default=29531)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a, 2), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
