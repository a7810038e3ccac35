"""A plain DDP job with PyTorch's debug server, to watch with `ddptui attach` (docs/attach.md).

    TORCH_FR_BUFFER_SIZE=2000 torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 examples/train_debug_server.py
    ddptui attach 127.0.0.1:29500

Nothing of ddptui here: one line added to a training script, `start_debug_server()` after
`init_process_group` (its `tabulate` and `jinja2` needed on rank 0), and the Flight Recorder
on (TORCH_FR_BUFFER_SIZE). --stall-at STEP makes the last rank stop before that step (in
`stall`, a long sleep), so the others wait in the step's gradient all_reduce: a hang to name.
Pure torch, CPU-friendly (gloo without CUDA).
"""
import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.debug import start_debug_server
from torch.nn.parallel import DistributedDataParallel as DDP


def stall() -> None:
    time.sleep(24 * 3600)  # the last rank, never arriving at the next all_reduce


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=0, help="steps to train (0: until stopped)")
    p.add_argument("--stall-at", type=int, default=-1, help="the last rank stops before this step")
    p.add_argument("--step-s", type=float, default=0.05, help="a pause after each step (s)")
    a = p.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    start_debug_server()  # every rank's debug server, registered in the job's TCPStore
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while a.steps <= 0 or step < a.steps:
        if step == a.stall_at and rank == world - 1:
            stall()
        loss = model(torch.randn(64, 256, device=device)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        time.sleep(a.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
