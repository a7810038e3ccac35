"""Records torch.profiler (Kineto) traces of a 2-rank CPU run (gloo) whose collectives are
not only gradient AllReduces, one JSON per rank (`tensorboard_trace_handler`, module records
and Python stacks, as users record theirs).

    torchrun --nproc-per-node 2 tests/kineto_record_colls.py OUT_DIR [--steps N] [--fsdp] [--fsdp-out DIR]

Default: a model whose `Exchange` layer all_to_alls its activations in the forward and their
gradients in the backward; after the backward one flat all_reduce of the gradients, an
all_gather_into_tensor and a reduce_scatter_tensor; after the optimizer a broadcast and a
barrier. Every collective is synchronous (issue order is the order gloo runs them).
--fsdp: a small FSDP2 transformer (fully_shard per block, then the root), AdamW.
--fsdp-out DIR: the default into OUT_DIR, then the FSDP2 transformer into DIR (one run, both).
--ddp-out DIR [--ddp-plain-out DIR]: then tests/kineto_record.py's DDP run into DIR (and without
module records into the other), in the same run (conftest's kineto_traces: one launch for both
test modules).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

D = 64


class _A2A(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g.contiguous())
        return out


class Exchange(nn.Module):
    def forward(self, x):
        return x + _A2A.apply(x)


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 128, d: int = D, blocks: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(blocks))
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.layers:
            x = b(x)
        return self.out(x)


def make_step(fsdp: bool, rank: int, world: int):
    """One training step of the FSDP2 transformer or of the model with explicit collectives."""
    torch.manual_seed(0)
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        model = Transformer()
        for b in model.layers:
            fully_shard(b)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(rank))

        def step() -> None:
            logits = model(x)
            F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
            opt.step()
            opt.zero_grad()
        return step
    model = nn.Sequential(nn.Linear(D, D), Exchange(), nn.Linear(D, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, D), torch.randint(0, 10, (8,))
    shard = torch.zeros(256)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat)
        gathered = torch.empty(world * shard.numel())
        dist.all_gather_into_tensor(gathered, shard)
        part = torch.empty(shard.numel())
        dist.reduce_scatter_tensor(part, gathered)
        opt.step()
        dist.broadcast(model[0].weight.data, 0)
        dist.barrier()
    return step


def profiled(out: str, step, steps: int, rank: int) -> None:
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank{rank}"),
        record_shapes=True, with_modules=True, with_stack=True)
    with prof:
        for _ in range(steps + 1):
            step()
            prof.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--fsdp-out", default=None)
    ap.add_argument("--ddp-out", default=None)
    ap.add_argument("--ddp-plain-out", default=None)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    profiled(a.out, make_step(a.fsdp, rank, world), a.steps, rank)
    if a.fsdp_out:
        dist.barrier()
        profiled(a.fsdp_out, make_step(True, rank, world), a.steps, rank)
    if a.ddp_out:
        import kineto_record  # (beside this script)
        dist.barrier()
        kineto_record.record(a.ddp_out, plain_out=a.ddp_plain_out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
