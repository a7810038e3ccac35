"""(tests) An FSDP2 transformer (fully_shard per block, then the root), as torchtitan's
training loop does: token embedding, N blocks of attention + MLP, a norm and an output
layer; AdamW. Plain FSDP2, nothing of ddptui.

    --iters N       optimizer steps (default 24)
    --prefetch      explicit forward/backward prefetching (set_modules_to_forward_prefetch)
    --mixed         mixed precision (bf16 parameters, fp32 reduce)
    --accum K       gradient accumulation: K micro-steps, set_requires_gradient_sync on the last
    --blocks N      transformer blocks (default 4)
    --clip X        clip_grad_norm_ to X before the optimizer (as torchtitan does: on FSDP2's
                    sharded DTensor gradients, the norm is all_reduced by a functional collective)
    --compile       each block compiled before it is sharded (torchtitan's way), backend
                    --backend (default inductor); rank 0 prints `GRAPH_BREAKS n` and `GRAPHS n`
                    at the end (torch._dynamo's counts)
    --stall-at N    at iteration N, rank 1 sleeps --sleep seconds between its forward and its
                    backward (rank 0 waits inside FSDP2's collective of the backward)
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self, d: int, heads: int = 4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, blocks: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.layers:
            x = b(x)
        return self.out(self.norm(x))


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--prefetch", action="store_true")
p.add_argument("--mixed", action="store_true")
p.add_argument("--accum", type=int, default=1)
p.add_argument("--blocks", type=int, default=4)
p.add_argument("--clip", type=float, default=None)
p.add_argument("--stall-at", type=int, default=-1)
p.add_argument("--sleep", type=float, default=6.0)
p.add_argument("--compile", action="store_true")
p.add_argument("--backend", default="inductor")
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = Transformer(blocks=a.blocks)
kw = {}
if a.mixed:
    kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
if a.compile:
    for i, b in enumerate(model.layers):
        model.layers[i] = torch.compile(b, backend=a.backend)
for b in model.layers:
    fully_shard(b, **kw)
fully_shard(model, **kw)
if a.prefetch:
    blocks = list(model.layers)
    for i, b in enumerate(blocks[:-1]):
        b.set_modules_to_forward_prefetch([blocks[i + 1]])
    for i, b in enumerate(blocks[1:], 1):
        b.set_modules_to_backward_prefetch([blocks[i - 1]])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
x = torch.randint(0, 512, (8, 64), generator=g)
for it in range(a.iters):
    for m in range(a.accum):
        if a.accum > 1:
            model.set_requires_gradient_sync(m == a.accum - 1)
        logits = model(x)
        if rank == 1 and it == a.stall_at and m == a.accum - 1:
            import time
            time.sleep(a.sleep)
        F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    if a.clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
    opt.step()
    opt.zero_grad()
    if rank == 0 and it % 8 == 0:
        print(f"iter {it}")
if a.compile and rank == 0:
    from torch._dynamo.utils import counters
    print(f"GRAPH_BREAKS {sum(counters['graph_break'].values())}")
    print(f"GRAPHS {counters['stats']['unique_graphs']}")
dist.destroy_process_group()
