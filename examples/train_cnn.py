"""A small conv net trained with DDP on synthetic images, timed by ddptui.instrument.

    ddptui run --nproc-per-node 2 -- examples/train_cnn.py --steps 20
    torchrun --nproc-per-node 2 examples/train_cnn.py --steps 20   # per-rank files in ./runs/

Pure torch, CPU-friendly (gloo without CUDA). --accumulate N runs N-1 micro-steps under
no_sync() before each synchronised one; --fp16-hook registers DDP's fp16 compression hook.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ddptui  # noqa: E402


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList([Block(16, 32), Block(32, 64), Block(64, 64)])
        self.head = nn.Linear(64 * 4 * 4, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for b in self.blocks:
            x = b(x)
        return self.head(x.flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--fp16-hook", action="store_true")
    p.add_argument("--layers", default="auto", help="auto, a depth, or comma-separated module names")
    p.add_argument("--raise-at", type=int, default=-1, help="(tests) rank 1 raises at this step")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(CNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    layers = int(a.layers) if a.layers.isdigit() else a.layers if a.layers == "auto" else a.layers.split(",")
    # batch: the samples of one step (one optimizer step: every micro-step's)
    handle = ddptui.instrument(model, layers=layers, optimizer=opt, batch=a.batch_size * a.accumulate)
    if a.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    g = torch.Generator().manual_seed(rank)
    local = a.batch_size // world
    x = torch.randn(local, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (local,), generator=g)
    for step in range(a.steps):
        if step == a.raise_at and rank == 1:
            raise RuntimeError(f"boom at step {step}")
        opt.zero_grad()
        for micro in range(a.accumulate):
            last = micro == a.accumulate - 1
            with handle.step(), (model.no_sync() if not last else _nothing()):
                loss = F.cross_entropy(model(x), y) / a.accumulate
                loss.backward()
                if last:
                    opt.step()
    handle.close()
    dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
