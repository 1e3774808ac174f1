# SPDX-License-Identifier: Apache-2.0
"""A small PyTorch training loop meant to run under LD_PRELOAD of
libgpumem_preload.so with PyTorch's default allocator (its cudaMalloc calls
go to gpumem).  Prints one JSON object; the caller checks the preload's
GPUMEM_PRELOAD_VERBOSE report on stderr."""
import json

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(4096, 1024, device="cuda")
y = torch.randint(0, 10, (4096,), device="cuda")
losses = []
for _ in range(30):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # a fresh segment: a cudaMalloc
big.fill_(3)
ok_big = int(big[-1].item()) == 3
del big
torch.cuda.empty_cache()  # PyTorch's cudaFree of its segments
print(json.dumps({"loss_first": losses[0], "loss_last": losses[-1], "decreased": losses[-1] < losses[0],
                  "big_ok": ok_big, "torch": torch.__version__}))
