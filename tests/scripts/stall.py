"""(tests) A rank that does not arrive: plain DDP training whose script all_reduces a metric
every iteration; at iteration --at, rank 1 sleeps --sleep seconds before entering it (as a
rank stuck in data loading, a checkpoint write or a deadlock would), so rank 0 waits inside
that all_reduce. At iteration --bucket-at, rank 1 sleeps as long between its forward and
its backward: rank 0 waits inside DDP's own bucket AllReduce. Plain DDP, nothing of ddptui.

    --iters N   optimizer steps (default 12)
    --hook-at K at iteration K, before its forward, DDP is given PyTorch's own allreduce comm
                hook (a script that registers one late)
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=12)
p.add_argument("--at", type=int, default=6)
p.add_argument("--sleep", type=float, default=12.0)
p.add_argument("--bucket-at", type=int, default=-1)
p.add_argument("--hook-at", type=int, default=-1)
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 32), torch.randint(0, 10, (256,))
for it in range(a.iters):
    if it == a.hook_at:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    if rank == 1 and it == a.bucket_at:
        time.sleep(a.sleep)
    loss.backward()
    if rank == 1 and it == a.at:
        time.sleep(a.sleep)
    metric = loss.detach().reshape(1)
    dist.all_reduce(metric)
    opt.step()
dist.destroy_process_group()
