"""Data parallelism written by hand, as the naive-vs-DDP lesson teaches it: no DDP wrapper,
nothing of ddptui in the script. See it with

    ddptui run --auto --nproc-per-node 2 -- examples/train_by_hand.py --how naive
    ddptui run --auto --nproc-per-node 2 -- examples/train_by_hand.py --how interleaved

--how naive: loss.backward() completely, then a blocking dist.all_reduce of every parameter's
gradient (nothing overlaps: communication and computation are separate phases).
--how interleaved: each parameter's post-accumulate-grad hook fires an asynchronous all_reduce
as soon as its gradient is ready, while the backward goes on; the works are waited on before
the optimizer's step (part of the communication hidden behind the backward).
The seeds' MLP (784 → 2048 → 2048 → 1024 → 512 → 10, "medium"), synthetic data, fine on a CPU.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--how", choices=("naive", "interleaved"), default="naive")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch-size", type=int, default=512, help="the global batch, split over the ranks")
a = p.parse_args()
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")
torch.manual_seed(42)  # every rank the same weights
widths = [784, 2048, 2048, 1024, 512, 10]
layers = []
for n_in, n_out in zip(widths, widths[1:]):
    layers += [nn.Linear(n_in, n_out), nn.ReLU()]
model = nn.Sequential(*layers[:-1]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

works = []
if a.how == "interleaved":
    def reduce(param):
        works.append((dist.all_reduce(param.grad, async_op=True), param))
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(reduce)

g = torch.Generator().manual_seed(0)
for step in range(a.steps):
    x = torch.randn(a.batch_size, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (a.batch_size,), generator=g)
    chunk = a.batch_size // world  # this rank's shard of the batch
    x, y = x[rank * chunk:(rank + 1) * chunk].to(dev), y[rank * chunk:(rank + 1) * chunk].to(dev)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    if a.how == "naive":
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
    else:
        for work, param in works:
            work.wait()
            param.grad /= world
        works.clear()
    opt.step()
dist.destroy_process_group()
