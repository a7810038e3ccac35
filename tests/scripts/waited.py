"""(tests) A layer that waits for a collective inside itself, as tensor parallelism's row-wise
layers do: its forward all_reduces its output with a functional collective and uses the result
at once (the wait), then computes on; DDP over the model syncs the gradients. Nothing of
ddptui (run it under `ddptui run --auto`).

    --iters N   optimizer steps (default 6)
    --cuda      on the GPU with NCCL (each rank its LOCAL_RANK's device; the GPU pass)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=6)
p.add_argument("--cuda", action="store_true")
a = p.parse_args()
if a.cuda:
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
else:
    dev = torch.device("cpu")
    dist.init_process_group("gloo")


class RowParallel(nn.Module):
    """A linear layer whose output is summed over the ranks before the next layer needs it."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        y = funcol.all_reduce(self.fc(x), "sum", dist.group.WORLD)
        return F.relu(y * 1.0) + 0.5 * y  # (the result used at once: the wait is here)


torch.manual_seed(0)
d = 256
model = DDP(nn.Sequential(nn.Linear(d, d), RowParallel(d), nn.Linear(d, 8)).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, d, device=dev), torch.randint(0, 8, (64,), device=dev)
for _ in range(a.iters):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
if a.cuda:
    torch.cuda.synchronize()
dist.destroy_process_group()
