"""(tests) A tiny language model whose output layer shares the token embedding's weight (GPT-2's
weight tying: lm_head.weight is wte.weight), and whose rank 0 alone evaluates every few
iterations, the usual way: model.eval(), a forward through the DDP module, model.train().
Each rank prints its loss every iteration, and a line on stderr at its end. Plain DDP, nothing
of ddptui (run it under `ddptui run --auto`).

    --iters N   optimizer steps (default 24)
    --every K   rank 0 evaluates before iterations 0, K, 2K... (default 0: never)
    --how H     no_grad: under torch.no_grad(); grad: with autograd on and no backward (the
                same module called again before any backward); both (default): in turn
"""
import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(x)))


class TinyLM(nn.Module):
    def __init__(self, vocab=1024, d=128, n=3):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--every", type=int, default=0)
p.add_argument("--how", choices=("no_grad", "grad", "both"), default="both")
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(TinyLM())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
idx = torch.randint(0, 1024, (8, 65), generator=g)
held_out = torch.randint(0, 1024, (2, 64), generator=g)
for it in range(a.iters):
    if a.every and rank == 0 and it % a.every == 0:
        model.eval()
        if a.how == "grad" or (a.how == "both" and it // a.every % 2):
            model(held_out).sum().item()
        else:
            with torch.no_grad():
                model(held_out).sum().item()
        model.train()
    opt.zero_grad()
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    print(f"iter {it}: loss {loss.item():.4f} on rank {rank}")  # (as training scripts print theirs)
print(f"rank {rank} says goodbye", file=sys.stderr)
dist.destroy_process_group()
