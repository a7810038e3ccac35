"""DDP on a device mesh's group, the process group made by init_device_mesh (no backend named:
dist.get_backend() says "undefined"); a small MLP, a few steps."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=6)
a = p.parse_args()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)), process_group=mesh.get_group("dp"))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
for _ in range(a.iters):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
