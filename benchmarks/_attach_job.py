"""(benchmarks/attach_cost.py's job) Plain DDP on gloo under torchrun with PyTorch's debug server
started the way a user adds it: steps back to back, no sleep, each step's end (monotonic ns,
CLOCK_MONOTONIC, the same clock on every process of the host) and its CPU time appended by
rank 0 to --times as it goes; rank 0 writes --ready once warm. It runs until killed.

    --width W   the MLP's width (4 Linear layers of W): the step's length (256: a few ms,
                host-bound; 2048: ~100 ms)
    --batch B   the rank's batch (default 32)
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.debug import start_debug_server
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--ready", required=True)
p.add_argument("--times", required=True)
p.add_argument("--width", type=int, default=256)
p.add_argument("--batch", type=int, default=32)
a = p.parse_args()
dist.init_process_group("gloo")
start_debug_server(port=0)
rank = dist.get_rank()
torch.manual_seed(0)
w = a.width
model = DDP(nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w),
                          nn.ReLU(), nn.Linear(w, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x = torch.randn(a.batch, w)
out = open(a.times, "a", buffering=1) if rank == 0 else None
step = 0
while True:
    t0, c0 = time.monotonic_ns(), time.thread_time_ns()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if out is not None:
        out.write(f"{time.monotonic_ns()} {time.monotonic_ns() - t0} {time.thread_time_ns() - c0}\n")
        if step == 20:
            with open(a.ready, "w") as f:
                f.write(str(os.getpid()))
