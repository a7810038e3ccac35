"""(tests) Data parallelism written by hand, as the course teaches it: no DDP, no FSDP, nothing
of ddptui. A 7-layer MLP (Linear + ReLU), each rank its own half of the batch.

    --how loop      the naive form: loss.backward() completely, then a loop over every
                    parameter, a blocking dist.all_reduce(param.grad) and an average
    --how hook      the interleaved form: each parameter's post-accumulate-grad hook fires an
                    all_reduce(p.grad, async_op=True) while the backward goes on; the works are
                    waited on before opt.step()
    --how bucket    a hand-rolled bucketed engine: after the backward the gradients are
                    flattened into one buffer, one all_reduce, copied back (the tensor is no
                    parameter's gradient)
    --how none      no collective at all (each rank trains alone); run as one process, no
                    process group is made
    --iters N       optimizer steps (default 24)
    --eval-every K  rank 0 evaluates the model under no_grad before every K-th iteration
                    (default 0: never)
    --micro M       gradient accumulation: M forwards and backwards (each on its own part of
                    the rank's batch) before the gradients are reduced and the optimizer steps
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--how", choices=("loop", "hook", "bucket", "none"), default="loop")
p.add_argument("--iters", type=int, default=24)
p.add_argument("--eval-every", type=int, default=0)
p.add_argument("--micro", type=int, default=1)
a = p.parse_args()
if a.how == "none" and int(__import__("os").environ.get("WORLD_SIZE", "1")) == 1:
    rank, world = 0, 1  # (alone: no process group at all)
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
widths = [256, 512, 512, 512, 256, 256, 128, 10]
layers = []
for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
    layers.append(nn.Linear(n_in, n_out))
    if i < len(widths) - 2:
        layers.append(nn.ReLU())
model = nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
works = []
if a.how == "hook":
    def reduce(param):
        works.append((dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True), param))
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(reduce)
g = torch.Generator().manual_seed(1)
x_all, y_all = torch.randn(1024, widths[0], generator=g), torch.randint(0, 10, (1024,), generator=g)
chunk = len(x_all) // world
x, y = x_all[rank * chunk:(rank + 1) * chunk], y_all[rank * chunk:(rank + 1) * chunk]
for it in range(a.iters):
    if a.eval_every and rank == 0 and it % a.eval_every == 0:
        with torch.no_grad():
            model(x[:64])
    opt.zero_grad()
    part = len(x) // a.micro
    for m in range(a.micro):
        loss = F.cross_entropy(model(x[m * part:(m + 1) * part]), y[m * part:(m + 1) * part]) / a.micro
        loss.backward()
    if a.how == "loop":
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad /= world
    elif a.how == "hook":
        for work, param in works:
            work.wait()
            param.grad /= world
        works.clear()
    elif a.how == "bucket":
        grads = [q.grad for q in model.parameters()]
        flat = torch.cat([t.reshape(-1) for t in grads])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for t in grads:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
    opt.step()
if dist.is_initialized():
    dist.destroy_process_group()
