# SPDX-License-Identifier: Apache-2.0
"""Adds to the multigpu results (JSON and Markdown) what only the logs hold:
NCCL's word on registration per all-reduce run of bench/multigpu_bench
(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG: "IPC register buffer" when NCCL
registered a buffer for zero-copy to the peer, "IPC reuse buffer" when a
collective reused that registration), and the PyTorch MemPool runs
(torch_nccl_mem_pool*, already in the JSON) as lines of the Markdown.

usage: python3 multigpu_summary.py RESULTS.json RESULTS.md BENCH_LOG
"""
import json
import re
import sys


def main():
    jp, mp, log = sys.argv[1:4]
    runs, cur = {}, None
    for line in open(log, errors="replace"):
        m = re.match(r"multigpu_bench: all-reduce (\S+) (\S+)", line)
        if m:
            cur = m.group(1) + " " + m.group(2)
            runs[cur] = [0, 0]
            continue
        if cur and "IPC register buffer" in line:
            runs[cur][0] += 1
        if cur and "IPC reuse buffer" in line:
            runs[cur][1] += 1
    r = json.load(open(jp))
    r["nccl_ipc_registrations"] = {k: {"registered": v[0], "reused": v[1]} for k, v in runs.items()}
    json.dump(r, open(jp, "w"), indent=1)
    with open(mp, "a") as f:
        f.write("\nNCCL's own log (NCCL_DEBUG_SUBSYS=REG), per all-reduce run: buffers it registered "
                "for zero-copy IPC to the peer, and collectives that reused a registration:\n\n"
                "| run | registered | reused |\n|---|---:|---:|\n")
        for k, v in runs.items():
            f.write("| %s | %d | %d |\n" % (k, v[0], v[1]))
        p = r.get("torch_nccl_mem_pool") or {}
        if "register_mem_pool" in p:
            f.write("\nPyTorch: tensors from gpumem.torch.nccl_mem_pool() (a MemPool of gpumem segments) "
                    "registered with ProcessGroupNCCL.register_mem_pool: %s; %d MiB per rank, 2 ranks: "
                    "all_gather_into_tensor %.1f GB/s (the same on PyTorch's allocator, unregistered: "
                    "%.1f), all_reduce %.1f (%.1f); results correct: %s.\n"
                    % (p["register_mem_pool"], p.get("mib", 0), p.get("pool_allgather_busbw_GBps", 0),
                       p.get("plain_allgather_busbw_GBps", 0), p.get("pool_allreduce_busbw_GBps", 0),
                       p.get("plain_allreduce_busbw_GBps", 0),
                       "yes" if p.get("pool_allgather_correct") and p.get("pool_allreduce_correct") else "NO"))
        q = r.get("torch_nccl_mem_pool_under_enable") or {}
        if "nccl_mem_pool" in q:
            f.write("Under gpumem.torch.enable() (gpumem as PyTorch's allocator), making that MemPool: %s\n"
                    % q["nccl_mem_pool"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
