# SPDX-License-Identifier: Apache-2.0
"""PyTorch's registration path for allocator-owned memory, on two GPUs:
tensors from gpumem.torch.nccl_mem_pool() (a torch.cuda.MemPool whose
segments are gpumem registrable segments) registered with NCCL through
ProcessGroupNCCL.register_mem_pool, then all_reduce and all_gather on them,
checked and timed next to the same collectives on tensors of PyTorch's own
allocator (not registered).  --enable also plugs gpumem in as PyTorch's
allocator first, to record what PyTorch says then.  Rank 0 writes one JSON
object.  Run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG to see NCCL's word
on each registration.

usage: python3 nccl_mempool.py --out FILE [--enable] [--mib 256]
"""
import argparse
import json
import os
import statistics
import sys
import time


def timed(fn, reps=10):
    import torch
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rank_main(rank, a, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    os.environ["GPUMEM_NCCL"] = "1"
    import gpumem.torch
    if a.enable:
        gpumem.torch.enable()
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda", rank))
    n = a.mib * (1 << 20) // 4
    res = {"enable": a.enable, "mib": a.mib, "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpu": torch.cuda.get_device_name(rank)}
    try:
        pool = gpumem.torch.nccl_mem_pool()
    except Exception as e:  # noqa: BLE001 — PyTorch's refusal is the result
        res["nccl_mem_pool"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        dist.destroy_process_group()
        if rank == 0:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
            print("nccl_mempool%s: %s" % (" (enable)" if a.enable else "", json.dumps(res)))
        return
    res["nccl_mem_pool"] = "ok"
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((n,), float(rank + 1), device="cuda")
        g = torch.empty((world * n,), device="cuda")
    try:
        backend.register_mem_pool(pool)
        res["register_mem_pool"] = "ok"
    except Exception as e:  # noqa: BLE001 — what PyTorch says is the result
        res["register_mem_pool"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
    s = gpumem.torch.memory_stats(rank)
    res["registrable_segments_bytes"] = s.get("registrable_reserved")

    def ar():
        x.fill_(float(rank + 1))
        dist.all_reduce(x)

    def ag():
        dist.all_gather_into_tensor(g, x)
    t_ar = timed(ar)
    res["pool_allreduce_correct"] = bool((x == float(sum(range(1, world + 1)))).all().item())
    t_ag = timed(ag)
    res["pool_allgather_correct"] = bool(all(
        (g[r * n:(r + 1) * n] == x[0]).all().item() for r in range(world)))
    bytes_ = n * 4
    res["pool_allreduce_busbw_GBps"] = bytes_ / t_ar / 1e9 * 2 * (world - 1) / world
    res["pool_allgather_busbw_GBps"] = world * bytes_ / t_ag / 1e9 * (world - 1) / world
    # The same on tensors of the current allocator (not registered).
    y = torch.full((n,), float(rank + 1), device="cuda")
    h = torch.empty((world * n,), device="cuda")

    def ar2():
        y.fill_(float(rank + 1))
        dist.all_reduce(y)
    res["plain_allreduce_busbw_GBps"] = bytes_ / timed(ar2) / 1e9 * 2 * (world - 1) / world
    res["plain_allgather_busbw_GBps"] = world * bytes_ / timed(lambda: dist.all_gather_into_tensor(h, y)) / 1e9 \
        * (world - 1) / world
    if res["register_mem_pool"] == "ok":
        try:
            backend.deregister_mem_pool(pool)
        except Exception as e:  # noqa: BLE001
            res["deregister_mem_pool"] = str(e).splitlines()[0][:200]
    del x, g
    dist.destroy_process_group()
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print("nccl_mempool%s: %s" % (" (enable)" if a.enable else "", json.dumps(res)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--enable", action="store_true")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--port", type=int, default=29541)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a, 2), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
