"""(tests) Gradient accumulation: --micro M micro-steps per optimizer step, the gradient
synchronised on the last one only, by setting `model.require_backward_grad_sync` (nanoGPT's
way) or by `model.no_sync()`; and a layer used in some steps only: `extra` runs twice in the
micro-steps of iterations 0, 4, 8..., once at 2, 6, 10... and not at all at odd ones (before
the first Linear, whose input then needs no gradient: that layer's backward hooks fire fewer
times there). Plain DDP (find_unused_parameters), nothing of ddptui.

    --iters N   optimizer steps (default 24)
    --micro M   micro-steps per optimizer step (default 3)
    --how H     flag, no_sync, or both (default): one way, or each in turn, two iterations
                at a time (so that each way meets the steps with and without `extra`)
    --cuda      on the GPU with NCCL (each rank its LOCAL_RANK's device; the GPU pass)
"""
import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.extra = nn.Linear(64, 64)
        self.l1, self.l2, self.l3 = nn.Linear(64, 512), nn.Linear(512, 512), nn.Linear(512, 10)

    def forward(self, x, times):
        for _ in range(times):
            x = torch.tanh(self.extra(x))
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--micro", type=int, default=3)
p.add_argument("--how", choices=("flag", "no_sync", "both"), default="both")
p.add_argument("--cuda", action="store_true")
a = p.parse_args()
dev = torch.device("cpu")
if a.cuda:
    import os
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if a.cuda else "gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net().to(dev), find_unused_parameters=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(512, 64, generator=g).to(dev), torch.randint(0, 10, (512,), generator=g).to(dev)
for it in range(a.iters):
    times = 0 if it % 2 else (2 if it % 4 == 0 else 1)
    for micro in range(a.micro):
        last = micro == a.micro - 1
        if a.how == "no_sync" or (a.how == "both" and it // 2 % 2):
            ctx = contextlib.nullcontext() if last else model.no_sync()
        else:
            model.require_backward_grad_sync = last
            ctx = contextlib.nullcontext()
        with ctx:
            (F.cross_entropy(model(x, times), y) / a.micro).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
