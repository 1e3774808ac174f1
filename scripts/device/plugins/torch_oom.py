# SPDX-License-Identifier: Apache-2.0
"""What an out-of-memory error looks like with gpumem as PyTorch's allocator,
whether CUDA still works afterwards, and gpumem.max_batch_size on a real
model.  Run with GPUMEM_LIMIT set (e.g. 2GiB).  Prints one JSON object.
GPUMEM_TORCH_OOM=null makes the allocator return NULL instead of throwing:
run that in a separate process (PyTorch does not check the pointer).
"""
import json
import os
import sys

import torch
import gpumem
import gpumem.torch

gpumem.torch.enable()
res = {"mode": os.environ.get("GPUMEM_TORCH_OOM", "throw"), "limit": os.environ.get("GPUMEM_LIMIT")}
try:
    x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    res["exception"] = None
    res["data_ptr"] = x.data_ptr()
    del x
except Exception as e:  # noqa: BLE001 — reporting what PyTorch raises
    res["exception"] = type(e).__module__ + "." + type(e).__name__
    res["message"] = str(e).splitlines()[0][:300]
    res["is_torch_oom"] = isinstance(e, torch.cuda.OutOfMemoryError)
    res["is_runtime_error"] = isinstance(e, RuntimeError)
    res["gpumem_is_out_of_memory"] = gpumem.is_out_of_memory(e)
    del e
try:
    y = torch.arange(1000, device="cuda", dtype=torch.float32)
    res["cuda_works_after"] = float(y.sum().item()) == 499500.0
except Exception as e:  # noqa: BLE001
    res["cuda_works_after"] = False
    res["after_error"] = str(e)[:300]

if res["mode"] != "null":
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()

    def step(b):
        x = torch.randn(b, 4096, device="cuda")
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    before = gpumem.torch.memory_stats(0)["reserved"]
    try:
        res["max_batch_size"] = gpumem.max_batch_size(step, 1, 1 << 22)
    except Exception as e:  # noqa: BLE001
        res["max_batch_size_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    after = gpumem.torch.memory_stats(0)
    res.update(reserved_before_probe=before, reserved_after_probe=after["reserved"],
               allocated_after_probe=after["allocated"])
print(json.dumps(res))
