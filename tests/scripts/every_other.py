"""(tests) A layer used in some steps only: `extra` runs twice at iterations 0, 4, 8..., once at
2, 6, 10... and not at all at odd ones (before the first Linear, whose input then needs no
gradient: that layer's backward hooks fire fewer times there). Plain DDP
(find_unused_parameters), nothing of ddptui.

    --iters N   optimizer steps (default 24)
"""
import argparse

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
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net(), find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(1024, 64, generator=g), torch.randint(0, 10, (1024,), generator=g)
for it in range(a.iters):
    opt.zero_grad()
    times = 0 if it % 2 else (2 if it % 4 == 0 else 1)
    F.cross_entropy(model(x, times), y).backward()
    opt.step()
dist.destroy_process_group()
