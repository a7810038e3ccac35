"""(tests) Every public torch.distributed collective, sync and async, and the functional
collectives (torch.distributed._functional_collectives: asynchronous results waited on where
they are used), issued inside a step of a DDP model timed by ddptui.instrument (the script's
own collectives, as real scripts issue metrics, checks and exchanges between the forward and
the backward).

    --iters N   optimizer steps (default 3)
"""
import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ddptui

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=3)
a = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
h = ddptui.instrument(model, optimizer=opt)
x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
t = torch.ones(8)
for it in range(a.iters):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    dist.all_reduce(t.clone())
    dist.all_reduce(t.clone(), async_op=True).wait()
    dist.all_gather([torch.empty(8) for _ in range(world)], t)
    dist.all_gather_into_tensor(torch.empty(8 * world), t)
    dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world))
    dist.all_to_all_single(torch.empty(8), t)
    dist.broadcast(t.clone(), src=0)
    dist.reduce(t.clone(), dst=0)
    dist.gather(t, [torch.empty(8) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(8), [torch.ones(8) for _ in range(world)] if rank == 0 else None, src=0)
    dist.barrier()
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(torch.empty(8), src=0)
    world_pg = dist.group.WORLD
    s = funcol.all_reduce(t * 2, "sum", world_pg)  # waited on where it is used
    s = s + 1
    funcol.all_gather_single(t, 0, world_pg).wait()
    funcol.reduce_scatter_single(torch.ones(16 * world), "sum", 0, list(range(world))).wait()
    funcol.all_to_all_single(t, None, None, world_pg).wait()
    funcol.broadcast(t, 0, world_pg).wait()
    loss.backward()
    opt.step()
h.close()
dist.destroy_process_group()
