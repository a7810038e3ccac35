"""Worker of benchmark P1 (instrumentation overhead); run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m ranks.builtin.bench_overhead \\
        --model medium --batch-size 1024 --steps 40 --out times.json

Two replicas of the same initial model train side by side in the same processes, on the
same batches, alternating step by step (ABBA order, so neither always goes first):

  instrumented  the real strategy from ranks.builtin.strategies (layer hooks, per-parameter or DDP
                comm hook, Recorder on the real clock), plus what the real worker does after
                each step: Recorder.poll(lazy=True) on the training thread, and the step's
                resolution (slots -> spans) and frame encoding (frames.spans_frame +
                wire.pack) on a sender thread, as the Emitter does
  plain         the same computation with no hook at all: DDP with its built-in AllReduce
                (or, for naive/interleaved, the same all_reduce calls without timing)
  profiled      a third replica of the plain side, each of its steps run under torch.profiler
                (CPU activity; on CUDA CPU + CUDA, with input shapes, as `ddptui verify` runs
                it): the profiler is started before the ranks line up and stopped after the
                timed step, so its start-up and post-processing are not in the figure, only
                what recording costs while the step runs

The three sides take turns in every order (all six permutations in rotation), so none is
always first or always follows the same side.

Each side runs `--block` steps back to back per turn (default 1 on CPU, 8 on CUDA), timed
on the host by the wall clock and by the CPU time of the rank process (all threads:
training, autograd, gloo, sender); a turn's time divided by its steps is one sample. On CUDA
only the turn's end is synchronised: a synchronize after every step would put the host's
per-step work (poll, the layout check) inside the timed interval and let the GPU idle while
the host catches up, which is not how training runs. Before every turn the ranks line up
(device synchronised, one small all_reduce), as the real worker does before each step.
A small `--batch-size` makes the host-bound case: steps as short as the host's own work.
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

from ranks import spec


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ranks.builtin.bench_overhead")
    p.add_argument("--model", default="medium", choices=spec.MODELS)
    p.add_argument("--strategy", default="ddp", choices=("ddp", "naive", "interleaved"))
    p.add_argument("--batch-size", type=int, default=1024, help="global batch, split across ranks")
    p.add_argument("--steps", type=int, default=40, help="timed steps of each side")
    p.add_argument("--warmup", type=int, default=3, help="untimed turns of each side first")
    p.add_argument("--block", type=int, default=0,
                   help="steps back to back per turn (default: 1 on CPU, 8 on CUDA)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    return p.parse_args(argv)


class Plain:
    """The uninstrumented side: same model, same optimizer, no hooks anywhere."""

    def __init__(self, strategy: str, base, device, lr: float, world: int):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from ranks.builtin.strategies import PlainSGD

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

    from ranks import frames, wire
    from ranks.core.clocks import CpuClock, CudaClock
    from ranks.core.recorder import Recorder
    from ranks.builtin.models import build_model, make_dataset
    from ranks.builtin.strategies import STRATEGY_CLASSES, DDPStrategy

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

    block = args.block or (8 if use_cuda else 1)
    import queue
    import threading
    sendq: queue.Queue = queue.Queue()

    def sender():  # the Emitter's job: resolve each step, encode its frame
        nonlocal spans
        while True:
            item = sendq.get()
            if item is None:
                return
            strategy, step, b, kinds, idxs, t0s, t1s, iss = item()
            wire.pack(frames.spans_frame(rank, strategy, step, b, kinds, idxs, t0s, t1s, iss))
            spans += len(kinds)
            sendq.task_done()

    fr_path = isinstance(instr, DDPStrategy) and instr.timing == "flight-recorder"
    tx = threading.Thread(target=sender, daemon=True)
    tx.start()

    def end_turn():
        if use_cuda:
            torch.cuda.synchronize(device)

    def run_instr(k, xb, yb) -> tuple[float, float]:
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        for j in range(block):
            instr.prepare()  # (its gradients zeroed, as the worker does before each step)
            rec.begin(instr.name, k * block + j)
            instr.step(xb, yb)
            rec.end()
            for item in rec.poll(lazy=True):
                sendq.put(item)
            if isinstance(instr, DDPStrategy):
                instr.take_layout_change()
        end_turn()
        for item in rec.poll(wait=True, lazy=True):
            sendq.put(item)
        if not fr_path:
            sendq.join()  # the sender's work is counted in the turn (its CPU time is anyway)
        # (NCCL's own timing: the sender waits for the watchdog to retire the buckets, ~100 ms,
        # a latency, not a cost; its Flight Recorder dumps, the cost, are charged to this side
        # after the run: fr_dump_s)
        return (time.perf_counter() - t0) / block, (time.process_time() - c0) / block

    def run_plain(k, xb, yb) -> tuple[float, float]:
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(block):
            plain.step(xb, yb)
        end_turn()
        return (time.perf_counter() - t0) / block, (time.process_time() - c0) / block

    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])

    def run_profiled(k, xb, yb) -> tuple[float, float]:
        prof = profile(activities=acts, record_shapes=True)
        prof.start()
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(block):
            profiled.step(xb, yb)
        end_turn()
        out = (time.perf_counter() - t0) / block, (time.process_time() - c0) / block
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
            "spans": spans, "threads": torch.get_num_threads(),
            # the period its layers were marked at last (each rank's own: no control collective
            # here; a run's ranks agree on the shortest)
            "layer_every": rec.layer_every(instr.name)}
    sendq.join()
    if isinstance(instr, DDPStrategy):
        mine["comm_timing"] = instr.timing
        mine["comm_timing_why"] = instr.timing_why
    if rec.fr is not None:
        mine["fr"] = rec.fr.stats()
        mine["fr_untimed"] = rec.fr_untimed
        mine["instr_steps"] = (args.warmup + args.steps) * block
    sendq.put(None)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine, group=ctl_group)
    if rank == 0:
        doc = {"model": args.model, "strategy": args.strategy, "world": world,
               "batch": args.batch_size, "device": str(device), "backend": backend,
               "torch": torch.__version__, "warmup": args.warmup, "block": block,
               "ranks": everyone}
        with open(args.out, "w") as f:
            json.dump(doc, f)
    dist.barrier(group=ctl_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
