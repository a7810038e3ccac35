"""A pipeline, as torch.distributed.pipelining's docs write one: nothing of ddptui in the
script. The seeds' MLP widths as residual blocks, split into one stage a rank (two a rank for
the looped and V schedules), a schedule run on microbatches, the optimizer stepping each
iteration. See it with

    ddptui run --auto --nproc-per-node 2 -- examples/train_pipeline.py --schedule gpipe
    ddptui run --auto --nproc-per-node 2 -- examples/train_pipeline.py --schedule 1f1b --microbatches 8
    ddptui run --auto --nproc-per-node 4 -- examples/train_pipeline.py --dp 2   # pp 2 x dp 2

--schedule: gpipe, 1f1b (one stage a rank), interleaved1f1b, loopedbfs, zbv (two a rank).
--microbatches: more microbatches, a smaller bubble ((p - 1) / (m + p - 1) for GPipe and 1F1B).
--slow-stage K: stage K's blocks run twice (an unbalanced pipeline: the bubble waits for it).
--dp D: pp x dp, each stage's module replicated by DDP over the mesh's dp dimension.
Synthetic data, fine on a CPU (gloo) or on GPUs (NCCL).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as pp

p = argparse.ArgumentParser()
p.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "zbv"))
p.add_argument("--microbatches", type=int, default=4)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch-size", type=int, default=256, help="the pipeline's batch, split into microbatches")
p.add_argument("--blocks", type=int, default=8)
p.add_argument("--width", type=int, default=512)
p.add_argument("--slow-stage", type=int, default=-1)
p.add_argument("--dp", type=int, default=1, help="pp x dp: each stage replicated by DDP over a mesh's dp dimension")
a = p.parse_args()
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
grank, gworld = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", grank % torch.cuda.device_count()) if cuda else torch.device("cpu")
pp_group = dp_group = None
rank, world, replica = grank, gworld, 0
if a.dp > 1:  # a DeviceMesh ("pp", "dp"), as torchtitan composes them
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(dev.type, (gworld // a.dp, a.dp), mesh_dim_names=("pp", "dp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    rank, world, replica = mesh["pp"].get_local_rank(), gworld // a.dp, mesh["dp"].get_local_rank()
multi = a.schedule in ("interleaved1f1b", "loopedbfs", "zbv")
n_stages = world * (2 if multi else 1)
mine = ([rank, n_stages - 1 - rank] if a.schedule == "zbv" else [rank, rank + world]) if multi else [rank]


class Block(nn.Module):
    def __init__(self, width: int, repeat: int = 1):
        super().__init__()
        self.up, self.down, self.repeat = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), repeat

    def forward(self, x):
        for _ in range(self.repeat):
            x = x + self.down(F.gelu(self.up(x)))
        return x


stages, params = [], []
for s in mine:
    torch.manual_seed(s)
    mods = [Block(a.width, 2 if s == a.slow_stage else 1) for _ in range(max(1, a.blocks // n_stages))]
    if s == n_stages - 1:
        mods.append(nn.Linear(a.width, 10))
    m = nn.Sequential(*mods).to(dev)
    if dp_group is not None:
        m = nn.parallel.DistributedDataParallel(m, process_group=dp_group)
    params += list(m.parameters())
    stages.append(pp.PipelineStage(m, s, n_stages, dev, group=pp_group))
kinds = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B, "interleaved1f1b": pp.ScheduleInterleaved1F1B,
         "loopedbfs": pp.ScheduleLoopedBFS, "zbv": pp.ScheduleZBVZeroBubble}
sched = kinds[a.schedule](stages if multi else stages[0], a.microbatches, loss_fn=F.cross_entropy)
opt = torch.optim.AdamW(params, lr=1e-3)
g = torch.Generator().manual_seed(1 + replica)  # (each replica its own samples)
x = torch.randn(a.batch_size, a.width, generator=g).to(dev)
y = torch.randint(0, 10, (a.batch_size,), generator=g).to(dev)
for step in range(a.steps):
    opt.zero_grad()
    sched.step(*((x,) if 0 in mine else ()), **({"target": y} if n_stages - 1 in mine else {}))
    opt.step()
dist.destroy_process_group()
