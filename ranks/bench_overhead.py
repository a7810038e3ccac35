"""Worker of benchmark P1 (instrumentation overhead); run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m ranks.bench_overhead \\
        --model medium --batch-size 1024 --steps 40 --out times.json

Two replicas of the same initial model train side by side in the same processes, on the
same batches, alternating step by step (ABBA order, so neither always goes first):

  instrumented  the real strategy from ranks.strategies (layer hooks, per-parameter or DDP
                comm hook, Recorder on the real clock), plus what the real worker does after
                each step: Recorder.poll() (slots -> spans) and the spans frame encoding
                (wire.encode_spans + wire.pack, done on the emitter's thread in a real run;
                here on the training thread, so the figure is an upper bound)
  plain         the same computation with no hook at all: DDP with its built-in AllReduce
                (or, for naive/interleaved, the same all_reduce calls without timing)
  profiled      a third replica of the plain side, each of its steps run under torch.profiler
                (CPU activity; on CUDA CPU + CUDA, with input shapes, as `ddptui verify` runs
                it): the profiler is started before the ranks line up and stopped after the
                timed step, so its start-up and post-processing are not in the figure, only
                what recording costs while the step runs

The three sides take turns in every order (all six permutations in rotation), so none is
always first or always follows the same side.

Each step is timed on the host by the wall clock (CUDA: synchronised at the step's end, on
both sides) and by the CPU time of the rank process (all threads: training, autograd, gloo). Before
every timed step the ranks line up with one small all_reduce, as the real worker does.
Rank 0 writes every rank's step times as JSON; the benchmark script does the statistics.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import time
from datetime import timedelta

from . import spec


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ranks.bench_overhead")
    p.add_argument("--model", default="medium", choices=spec.MODELS)
    p.add_argument("--strategy", default="ddp", choices=("ddp", "naive", "interleaved"))
    p.add_argument("--batch-size", type=int, default=1024, help="global batch, split across ranks")
    p.add_argument("--steps", type=int, default=40, help="timed steps of each side")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each side first")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    return p.parse_args(argv)


class Plain:
    """The uninstrumented side: same model, same optimizer, no hooks anywhere."""

    def __init__(self, strategy: str, base, device, lr: float, world: int):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from .strategies import PlainSGD

        self.strategy = strategy
        self.world = world
        self.module = copy.deepcopy(base).to(device)
        self.params = list(self.module.parameters())
        kw = {"device_ids": [device.index]} if device.type == "cuda" else {}
        self.model = DDP(self.module, **kw) if strategy == "ddp" else self.module
        self.opt = PlainSGD(self.params, lr=lr)  # the same optimizer as the strategies
        self.futs: list = []
        if strategy == "interleaved":
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p) -> None:  # interleaved needs its hook to communicate at all
        import torch.distributed as dist
        p.grad.div_(self.world)
        self.futs.append(dist.all_reduce(p.grad, async_op=True).get_future())

    def step(self, x, y) -> None:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        self.opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        if self.strategy == "naive":
            for p in self.params:
                p.grad.div_(self.world)
                dist.all_reduce(p.grad)
        elif self.strategy == "interleaved":
            torch.futures.wait_all(self.futs)
            self.futs = []
        self.opt.step()


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    from . import wire
    from .instrument import CpuClock, CudaClock, Recorder
    from .models import build_model, make_dataset
    from .strategies import STRATEGY_CLASSES, DDPStrategy

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {world} ranks")
    use_cuda = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "cuda" and not use_cuda:
        raise SystemExit("--device cuda but torch sees no CUDA device")
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=120), **kw)
    ctl_group = dist.new_group(backend="gloo") if backend != "gloo" else None

    lr = 0.01
    base = build_model(args.model, seed=42)
    n_layers = len(spec.MODEL_WIDTHS[args.model]) - 1
    clock = CudaClock(device) if use_cuda else CpuClock()
    rec = Recorder(clock, n_layers)
    instr = STRATEGY_CLASSES[args.strategy](base, rec, device, lr, world)
    instr.prepare()
    plain = Plain(args.strategy, base, device, lr, world)
    profiled = Plain(args.strategy, base, device, lr, world)
    del base
    n_batches = 4
    X, Y = make_dataset(args.batch_size * n_batches, seed=42, device=device)
    local = args.batch_size // world
    ctl = torch.zeros(1)
    spans = 0

    def batch(k):
        s0 = (k % n_batches) * args.batch_size + rank * local
        return X[s0:s0 + local], Y[s0:s0 + local]

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)
        dist.all_reduce(ctl, group=ctl_group)  # line the ranks up, outside the timed step

    def run_instr(k, xb, yb) -> tuple[float, float]:
        nonlocal spans
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        rec.begin(instr.name, k)
        instr.step(xb, yb)
        rec.end()
        if use_cuda:
            torch.cuda.synchronize(device)
        for strategy, step, b, kinds, idxs, t0s, t1s, iss in rec.poll():
            wire.pack(wire.encode_spans(rank, strategy, step, b, kinds, idxs, t0s, t1s, iss))
            spans += len(kinds)
        if isinstance(instr, DDPStrategy):
            instr.take_layout_change()
        return time.perf_counter() - t0, time.process_time() - c0

    def run_plain(k, xb, yb) -> tuple[float, float]:
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        plain.step(xb, yb)
        if use_cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, time.process_time() - c0

    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])

    def run_profiled(k, xb, yb) -> tuple[float, float]:
        prof = profile(activities=acts, record_shapes=True)
        prof.start()
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        profiled.step(xb, yb)
        if use_cuda:
            torch.cuda.synchronize(device)
        out = time.perf_counter() - t0, time.process_time() - c0
        prof.stop()
        return out

    sides = {"i": run_instr, "p": run_plain, "q": run_profiled}
    orders = list(itertools.permutations("ipq"))
    times: dict[str, list] = {s: [] for s in sides}
    cpus: dict[str, list] = {s: [] for s in sides}  # CPU time of the rank process (all threads)
    for k in range(args.warmup + args.steps):
        xb, yb = batch(k)
        got = {s: sides[s](k, xb, yb) for s in orders[k % len(orders)]}
        if k >= args.warmup:
            for s, (t, c) in got.items():
                times[s].append(t)
                cpus[s].append(c)
    mine = {"rank": rank, "instrumented_s": times["i"], "plain_s": times["p"],
            "instrumented_cpu_s": cpus["i"], "plain_cpu_s": cpus["p"],
            "profiled_s": times["q"], "profiled_cpu_s": cpus["q"],
            "spans": spans, "threads": torch.get_num_threads()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=ctl_group)
    if rank == 0:
        doc = {"model": args.model, "strategy": args.strategy, "world": world,
               "batch": args.batch_size, "device": str(device), "backend": backend,
               "torch": torch.__version__, "warmup": args.warmup, "ranks": everyone}
        with open(args.out, "w") as f:
            json.dump(doc, f)
    dist.barrier(group=ctl_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
