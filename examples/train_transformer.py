"""A small transformer encoder trained with DDP on synthetic token sequences, timed by
ddptui.instrument (its layers: embed, layers.0..N-1, norm, head).

    ddptui run --nproc-per-node 2 -- examples/train_transformer.py --steps 20
    torchrun --nproc-per-node 2 examples/train_transformer.py --steps 20   # per-rank files

Pure torch, CPU-friendly (gloo without CUDA). --autocast runs the forward under bf16
autocast (CPU) / fp16 (CUDA).
"""
import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ddptui  # noqa: E402


class Encoder(nn.Module):
    def __init__(self, vocab=1000, d=128, heads=4, n_layers=4, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
            for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(1))


def setup(seed=0):
    """Process group, model, optimizer and this rank's synthetic batch."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(seed)
    return rank, device


def batch(rank, device, n=16, seq=64, vocab=1000):
    g = torch.Generator().manual_seed(rank)
    return (torch.randint(0, vocab, (n, seq), generator=g).to(device),
            torch.randint(0, 10, (n,), generator=g).to(device))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--layers", type=int, default=4, help="encoder layers")
    p.add_argument("--autocast", action="store_true")
    a = p.parse_args()
    rank, device = setup()
    model = DDP(Encoder(n_layers=a.layers).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = ddptui.instrument(model, optimizer=opt, batch=a.batch_size)
    x, y = batch(rank, device, n=a.batch_size // dist.get_world_size())
    amp = (torch.autocast(device.type, dtype=torch.bfloat16 if device.type == "cpu" else torch.float16)
           if a.autocast else contextlib.nullcontext())
    for _ in range(a.steps):
        with handle.step():
            opt.zero_grad()
            with amp:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    handle.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
