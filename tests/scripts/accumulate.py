"""(tests) Gradient accumulation: --micro M micro-steps per optimizer step, the gradient
synchronised on the last one only, by setting `model.require_backward_grad_sync` (nanoGPT's
way) or by `model.no_sync()`. Plain DDP, nothing of ddptui.

    --iters N   optimizer steps (default 24)
    --how H     flag, no_sync, or both (default): one way, or each in turn
"""
import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--micro", type=int, default=3)
p.add_argument("--how", choices=("flag", "no_sync", "both"), default="both")
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)
for it in range(a.iters):
    for micro in range(a.micro):
        last = micro == a.micro - 1
        if a.how == "no_sync" or (a.how == "both" and it % 2):
            ctx = contextlib.nullcontext() if last else model.no_sync()
        else:
            model.require_backward_grad_sync = last
            ctx = contextlib.nullcontext()
        with ctx:
            (F.cross_entropy(model(x), y) / a.micro).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
