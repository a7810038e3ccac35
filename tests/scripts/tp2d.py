"""(tests) torchtitan's 2D layout on 4 CPU ranks: a (dp, tp) = (2, 2) device mesh, tensor
parallelism inside each block on `tp` (ColwiseParallel then RowwiseParallel: the block's
output all-reduced over `tp` in the forward, its input's gradient in the backward), FSDP2 on
`dp` (fully_shard per block, then the root), AdamW. Plain PyTorch, nothing of ddptui.

    --iters N       optimizer steps (default 8)
    --blocks N      blocks (default 2)
    --dim D         model width (default 64)
    --hsdp          a 3D mesh (dp_replicate, dp_shard, tp) = (2, 1, 2): FSDP2 as HSDP
                    (replicated on dp_replicate, sharded on dp_shard)
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class Model(nn.Module):
    def __init__(self, d: int, blocks: int, vocab: int = 128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(blocks))
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.layers:
            x = b(x)
        return self.out(x)


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=8)
p.add_argument("--blocks", type=int, default=2)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--hsdp", action="store_true")
a = p.parse_args()
if a.hsdp:
    mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    dp = mesh["dp_replicate", "dp_shard"]
else:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"]
torch.manual_seed(0)
model = Model(a.dim, a.blocks)
for b in model.layers:
    parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(b, mesh=dp)
fully_shard(model, mesh=dp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(dp.get_local_rank() if not a.hsdp else mesh.get_coordinate()[0])
x = torch.randint(0, 128, (8, 32), generator=g)
for _ in range(a.iters):
    opt.zero_grad()
    logits = model(x)
    F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    opt.step()
