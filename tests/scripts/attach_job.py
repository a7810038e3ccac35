"""(tests) A job that knows nothing of ddptui, watched by `ddptui attach`: plain DDP on gloo
under torchrun, with PyTorch's debug server started the way a user adds it (one line, after
init_process_group; `port=0` only so that jobs side by side do not share the front page's
default port, which attach never reads). Run it with TORCH_FR_BUFFER_SIZE set.

It trains a small model, a step every STEP_S; after STEPS_BEFORE_READY steps rank 0 writes
``--ready``. When the file ``--hang`` appears, rank 1 stops in `stall_here` (in `time.sleep`,
on the line marked below) before its next step, so rank 0 waits inside that step's gradient
all_reduce, which rank 1 never issues; the job's timeout is long, so it hangs until killed.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.debug import start_debug_server
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--ready", required=True)
p.add_argument("--hang", required=True)
a = p.parse_args()
STEP_S = 0.05
STEPS_BEFORE_READY = 5

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
start_debug_server(port=0)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def stall_here() -> None:
    time.sleep(3600)  # STALL: rank 1 is here while the job hangs


step = 0
while True:
    if rank == 1 and os.path.exists(a.hang):
        stall_here()
    loss = model(torch.randn(32, 64)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    step += 1
    if rank == 0 and step == STEPS_BEFORE_READY:
        with open(a.ready, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(STEP_S)
