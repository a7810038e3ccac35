"""(tests) A recommender as DLRM trains it: a bottom MLP and a top MLP, each wrapped in
DistributedDataParallel, and embedding tables sharded across ranks (model parallel) whose
lookups are exchanged with all_to_all between them, forward and backward (an autograd
Function); a loss statistic all_reduced with async_op=True and waited on after the backward.
Plain DDP, nothing of ddptui.

    --iters N          optimizer steps (default 24)
    --bucket-cap-mb X  DDP's bucket size (default PyTorch's)
    --batch N          samples a rank (default 512)
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

D = 64


class AllToAll(torch.autograd.Function):
    """Each rank's lookups for every rank's samples -> every rank's lookups for its own samples."""

    @staticmethod
    def forward(ctx, x):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g.contiguous())
        return out


class DLRM(nn.Module):
    def __init__(self, world: int):
        super().__init__()
        self.world = world
        self.emb = nn.EmbeddingBag(10000, D, mode="sum")  # this rank's shard of the tables
        self.bot_l = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, D), nn.ReLU())
        self.top_l = nn.Sequential(nn.Linear(2 * D, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                                   nn.Linear(64, 1))

    def forward(self, dense, sparse):
        z = self.bot_l(dense)
        # this rank's table looked up for all samples of all ranks, then exchanged
        e = self.emb(sparse.view(-1, 4)).view(self.world, BATCH, D)
        e = AllToAll.apply(e).sum(0)
        return self.top_l(torch.cat([z, e], dim=1)).squeeze(1)


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--bucket-cap-mb", type=float, default=None)
p.add_argument("--batch", type=int, default=512)
a = p.parse_args()
BATCH = a.batch
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = DLRM(world)
cap = {} if a.bucket_cap_mb is None else {"bucket_cap_mb": a.bucket_cap_mb}
net.bot_l = DDP(net.bot_l, **cap)
net.top_l = DDP(net.top_l, **cap)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
dense = torch.randn(BATCH, 16, generator=g)
sparse = torch.randint(0, 10000, (world * BATCH * 4,), generator=g)
y = torch.rand(BATCH, generator=g)
for it in range(a.iters):
    opt.zero_grad()
    loss = F.binary_cross_entropy_with_logits(net(dense, sparse), y)
    loss.backward()
    stat = loss.detach().reshape(1)
    work = dist.all_reduce(stat, async_op=True)
    opt.step()
    work.wait()
    if rank == 0 and it % 8 == 0:
        print(f"iter {it} loss {stat.item() / world:.4f}")
dist.destroy_process_group()
