"""(tests) Two DDP modules in one model, as DLRM does: a bottom and a top MLP each wrapped in
DistributedDataParallel, one more collective between them (an all_reduce of a statistic), one
optimizer over both. Plain DDP, nothing of ddptui.

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
        self.bot_l = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU())
        self.top_l = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                   nn.Linear(128, 10))

    def forward(self, x):
        z = self.bot_l(x)
        s = z.detach().mean().reshape(1)
        dist.all_reduce(s)  # (a collective of the script's own, between the two DDPs)
        return self.top_l(z)


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = Net()
net.bot_l = DDP(net.bot_l, bucket_cap_mb=0.05)
net.top_l = DDP(net.top_l, bucket_cap_mb=0.05)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(4096, 32, generator=g), torch.randint(0, 10, (4096,), generator=g)
for it in range(a.iters):
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
dist.destroy_process_group()
