"""Records torch.profiler (Kineto) traces of a small DDP run on CPU with gloo, one JSON per
rank, as users record theirs (`tensorboard_trace_handler`, `with_modules=True`); with
--plain-out, then a second profile of the same run without module records or stacks.

    torchrun --nproc-per-node 2 tests/kineto_record.py OUT_DIR [--steps N] [--no-modules] [--plain-out DIR]

(tests/kineto_record_colls.py --ddp-out records it too, in the same run: conftest's kineto_traces.)
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def record(out: str, steps: int = 4, modules: bool = True, plain_out: str | None = None) -> None:
    """The DDP run profiled into `out` (then without module records into `plain_out`), on the
    process group already made."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)],
                          nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    def profile(out: str, modules: bool) -> None:
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank{rank}"),
            record_shapes=True, with_modules=modules, with_stack=modules)
        with prof:
            for _ in range(steps + 1):
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                prof.step()

    profile(out, modules)
    if plain_out:
        profile(plain_out, False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--no-modules", action="store_true")
    ap.add_argument("--plain-out", help="then profile again without module records, into this folder")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    record(a.out, a.steps, not a.no_modules, a.plain_out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
