"""(tests) A pipeline, as torch.distributed.pipelining's docs write one: nothing of ddptui. A
stack of MLP blocks split into one stage a rank (or two a rank for the looped schedules),
each stage a `PipelineStage`, a schedule run on microbatches, the optimizer stepping each
iteration.

    --schedule S    gpipe | 1f1b | interleaved1f1b | loopedbfs | interleavedzb | zbv | dualpipev
                    (default 1f1b)
    --microbatches M  microbatches a step (default 4)
    --iters N       optimizer steps (default 12)
    --blocks B      MLP blocks in all (default 6), split evenly among the stages
    --slow-stage K  the stage K's blocks each run twice (an unbalanced pipeline)
    --hang-stage K  stage K's forward of the third microbatch of iteration --hang-at (default
                    4) never ends (a hung stage: its neighbour waits in a receive)
    --dp D          pp x dp: the world as (pipeline, data-parallel) on a DeviceMesh, each
                    stage's module replicated over "dp" (--dp-wrap ddp, default, or fsdp)
    --tp T          pp x dp x tp: each block's Linears tensor-parallel over "tp" (up column-,
                    down row-wise), FSDP2 over "dp"
    --width W       the blocks' width (default 256)
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining as pp

p = argparse.ArgumentParser()
p.add_argument("--schedule", default="1f1b",
               choices=("gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev"))
p.add_argument("--microbatches", type=int, default=4)
p.add_argument("--iters", type=int, default=12)
p.add_argument("--blocks", type=int, default=6)
p.add_argument("--width", type=int, default=256)
p.add_argument("--slow-stage", type=int, default=-1)
p.add_argument("--hang-stage", type=int, default=-1)
p.add_argument("--hang-at", type=int, default=4)
p.add_argument("--dp", type=int, default=1)
p.add_argument("--tp", type=int, default=1)
p.add_argument("--dp-wrap", choices=("ddp", "fsdp"), default="ddp")
a = p.parse_args()

dist.init_process_group("gloo")
grank, gworld = dist.get_rank(), dist.get_world_size()
pp_group = dp_group = mesh = None
if a.tp > 1:  # pp x dp x tp, as torchtitan composes them: FSDP2 over "dp", tensor parallel over "tp"
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (gworld // (a.dp * a.tp), a.dp, a.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    rank, world = mesh["pp"].get_local_rank(), gworld // (a.dp * a.tp)
    replica = mesh["dp"].get_local_rank()
    a.dp_wrap = "fsdp"
elif a.dp > 1:  # pp x dp on a DeviceMesh, as torchtitan composes them: a stage's replicas on "dp"
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (gworld // a.dp, a.dp), mesh_dim_names=("pp", "dp"))
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    rank, world = mesh["pp"].get_local_rank(), gworld // a.dp
    replica = mesh["dp"].get_local_rank()
else:
    rank, world, replica = grank, gworld, 0
multi = a.schedule in ("interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev")
per_rank = 2 if multi else 1
n_stages = world * per_rank


class Block(nn.Module):
    def __init__(self, width: int, repeat: int = 1):
        super().__init__()
        self.up, self.down, self.repeat = nn.Linear(width, 2 * width), nn.Linear(2 * width, width), repeat

    def forward(self, x):
        for _ in range(self.repeat):  # (a slow stage's blocks run twice: forward and backward)
            x = x + self.down(F.relu(self.up(x)))
        return x


class Head(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        return self.out(x)


def stage_ids() -> list[int]:
    """This rank's stage indices: one, or two for the looped schedules (ZBV: a V, rank r
    holding stages r and 2 * world - 1 - r)."""
    if not multi:
        return [rank]
    if a.schedule in ("zbv", "dualpipev"):
        return [rank, n_stages - 1 - rank]
    return [rank, rank + world]


torch.manual_seed(0)
per_stage = max(1, a.blocks // n_stages)
stages, mods = [], []
for s in stage_ids():
    torch.manual_seed(s)
    blocks = [Block(a.width, 2 if s == a.slow_stage else 1) for _ in range(per_stage)]
    if s == n_stages - 1:
        blocks.append(Head(a.width))
    m = nn.Sequential(*blocks)
    if a.tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        for blk in blocks:
            if isinstance(blk, Block):
                parallelize_module(blk, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if a.dp > 1 and a.dp_wrap == "ddp" and a.tp == 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        m = DDP(m, process_group=dp_group)
    elif a.dp > 1:
        from torch.distributed.fsdp import fully_shard
        for blk in m:
            fully_shard(blk, mesh=mesh["dp"])
        fully_shard(m, mesh=mesh["dp"])
    if s == a.hang_stage:  # (its forward of the third microbatch of iteration --hang-at never ends)
        seen = [0]

        def hang(mod, args, n=seen):
            n[0] += 1
            if n[0] == a.hang_at * a.microbatches + 3:
                import time
                time.sleep(3600)
        m.register_forward_pre_hook(hang)
    mods.append(m)
    stages.append(pp.PipelineStage(m, s, n_stages, torch.device("cpu"), group=pp_group))


def loss_fn(out, target):
    return F.cross_entropy(out, target)


kinds = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B,
         "interleaved1f1b": pp.ScheduleInterleaved1F1B, "loopedbfs": pp.ScheduleLoopedBFS,
         "interleavedzb": pp.ScheduleInterleavedZeroBubble, "zbv": pp.ScheduleZBVZeroBubble,
         "dualpipev": getattr(pp, "ScheduleDualPipeV", None)}
cls = kinds[a.schedule]
sched = cls(stages if multi else stages[0], a.microbatches, loss_fn=loss_fn)
opt = torch.optim.SGD([q for m in mods for q in m.parameters()], lr=0.01)
g = torch.Generator().manual_seed(1 + replica)  # (each replica its own samples)
batch = 16 * a.microbatches
x, y = torch.randn(batch, a.width, generator=g), torch.randint(0, 10, (batch,), generator=g)
first = 0 in stage_ids()
last = n_stages - 1 in stage_ids()
for it in range(a.iters):
    opt.zero_grad()
    args = (x,) if first else ()
    kw = {"target": y} if last else {}
    sched.step(*args, **kw)
    opt.step()
dist.destroy_process_group()
