"""(tests) A training loop whose rank 0 alone evaluates every few iterations, the usual way:
model.eval(), a forward through the DDP module under torch.no_grad(), model.train(). Plain
DDP, nothing of ddptui (run it under `ddptui run --auto`).

    --iters N   optimizer iterations (default 24)
    --every K   rank 0 evaluates before iterations 0, K, 2K... (default 3)
    --how H     no_grad: under torch.no_grad(); grad: with autograd on and no backward (the
                same module called again before any backward); both (default): in turn
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--every", type=int, default=3)
p.add_argument("--how", choices=("no_grad", "grad", "both"), default="both")
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(1024, 64, generator=g), torch.randint(0, 10, (1024,), generator=g)
xe = torch.randn(64, 64, generator=g)
for it in range(a.iters):
    if rank == 0 and it % a.every == 0:
        model.eval()
        if a.how == "grad" or (a.how == "both" and it // a.every % 2):
            model(xe).sum().item()
        else:
            with torch.no_grad():
                model(xe).sum().item()
        model.train()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
