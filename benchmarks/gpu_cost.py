#!/usr/bin/env python
"""Where an instrumented step's extra time goes on a GPU: one process, one rank (NCCL at world 1
on a GPU; gloo on a CPU, `--device cpu`, a smoke run), xlarge, every side a DDP replica of the
same model on the same batches, taking turns in every order (P1's way: `--block` steps back to
back a turn, the turn's end synchronised, medians of per-turn step times):

  A plain        DDP, its built-in C++ AllReduce
  B py-hook      DDP with PyTorch's own Python comm hook (default_hooks.allreduce_hook): what
                 any Python hook per bucket costs (DDP calling Python, dist.all_reduce's
                 wrapper, the future's then())
  C comm         ddptui's DDP strategy and Recorder, its layers not marked (1 step in 128): the
                 comm hook with its issue and end marks, the step's and passes' marks, poll
  D every-layer  the same, every layer of every step marked
  E sender       D, the steps resolved by a sender thread while the next ones run (the
                 worker's way; D resolves after the turn): the GIL taken from the training thread
  F control      A plus the worker's control collective each step (a gloo all_reduce of four
                 int64 and three .item())

and, alone, the unit costs the CUDA cost model charges (benchmarks/h100_costs.json): an event
record (through the C method, as CudaClock does), a query, elapsed_time,
torch.cuda.current_stream, a stream's wait_event, a post-accumulate hook's dispatch; and, for
the plain step, its host time to launch against its time on the GPU (is the host ahead?).

Prints each side's median and its difference to A, split into the parts B-A (a Python hook),
C-B (ddptui's marks and bookkeeping over it), D-C (the layer marks), E-D (the sender thread),
F-A (the control collective); writes `--out` (JSON, h100_costs.json's names with
"how": "measured") for the cost model. <= 2 minutes on an H100 at the defaults.

    python benchmarks/gpu_cost.py --out $OUT/gpu_cost.json          # on a GPU
    python benchmarks/gpu_cost.py --device cpu --quick               # a smoke run, anywhere
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import queue
import statistics
import sys
import threading
import time

from _common import ROOT, free_port

sys.path.insert(0, ROOT)




def unit_costs(torch, device, n: int = 2000) -> dict:
    """µs per call, median of 5 rounds of `n`."""
    import timeit
    tc = torch.cuda
    stream = tc.current_stream(device)
    evs = [tc.Event(enable_timing=True) for _ in range(n)]
    ev_cls = tc.Event
    base = getattr(ev_cls, "__mro__", (ev_cls,))
    record = next((c.__dict__["record"] for c in base[1:] if "record" in c.__dict__), ev_cls.record)
    it = iter(itertools.cycle(evs))

    def rec():
        record(next(it), stream)

    def per(f, k=n):
        return statistics.median(timeit.repeat(f, number=k, repeat=5)) / k * 1e6
    out = {"event_record_us": per(rec)}
    tc.synchronize(device)
    a, b = evs[0], evs[1]
    out["event_query_us"] = per(a.query)
    out["elapsed_time_us"] = per(lambda: a.elapsed_time(b))
    out["current_stream_us"] = per(lambda: tc.current_stream(device))
    out["stream_wait_us"] = per(lambda: stream.wait_event(a))
    # a post-accumulate hook's dispatch: 8 weights' backward with and without a no-op hook
    ws = [torch.zeros(64, device=device, requires_grad=True) for _ in range(8)]
    hooked = [torch.zeros(64, device=device, requires_grad=True) for _ in range(8)]
    for w in hooked:
        w.register_post_accumulate_grad_hook(lambda p: None)

    def bw(params):
        sum((p * 1.0).sum() for p in params).backward()
    plain = per(lambda: bw(ws), 200)
    with_hooks = per(lambda: bw(hooked), 200)
    out["hook_dispatch_us"] = max(0.0, (with_hooks - plain) / 8)
    tc.synchronize(device)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--turns", type=int, default=60, help="timed turns of each side")
    p.add_argument("--block", type=int, default=8, help="steps back to back a turn")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--model", default="xlarge")
    p.add_argument("--quick", action="store_true", help="small and short: that it runs (SMOKE)")
    p.add_argument("--out", default=None, help="write the figures here (JSON)")
    p.add_argument("--nccl-timing", action="store_true",
                   help="instead: PyTorch's own timing of NCCL collectives (TORCH_NCCL_ENABLE_TIMING "
                        "and ProcessGroupNCCL's on-completion hook) on plain DDP, A against G (the "
                        "same with the hook collecting each AllReduce's duration): what timing "
                        "buckets without a Python comm hook would cost, and the durations it gives")
    a = p.parse_args(argv)
    if a.nccl_timing:  # its own benchmark now: four sides, WorkInfo, the hook's delay, the Flight Recorder
        import gpu_nccl_timing
        rest = ["--turns", str(a.turns), "--block", str(a.block), "--batch-size", str(a.batch_size),
                "--model", a.model] + (["--out", a.out] if a.out else [])
        return gpu_nccl_timing.main(rest)
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_cost: no CUDA device here (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    if a.quick:
        a.turns, a.block, a.batch_size = 6, 2, 64
        if a.device == "cpu":
            a.model = "small"
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ranks import spec
    from ranks.core.clocks import CpuClock, CudaClock
    from ranks.builtin.models import build_model, make_dataset
    from ranks.core.recorder import Recorder
    from ranks.builtin.strategies import DDPStrategy, PlainSGD
    t_start = time.monotonic()
    cuda = a.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    kw = {"device_id": device} if cuda else {}
    if cuda:  # NCCL's own timing and a Flight Recorder buffer, as the launcher sets them: the
        # default group timed (ddptui's sides), the plain sides on a group made without timing
        from ddptui.live.launcher import nccl_timing_env
        nccl_timing_env(os.environ)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, **kw)
    ctl_group = dist.new_group(backend="gloo") if cuda else None
    plain_group = None
    if cuda:
        os.environ.pop("TORCH_NCCL_ENABLE_TIMING")
        plain_group = dist.new_group([0])
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    base = build_model(a.model, seed=42)
    n_layers = len(spec.MODEL_WIDTHS[a.model]) - 1
    X, Y = make_dataset(a.batch_size * 2, seed=42, device=device)
    xb, yb = X[:a.batch_size], Y[:a.batch_size]
    ddp_kw = {"device_ids": [0]} if cuda else {}

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    class Plain:
        def __init__(self, hook=None):
            self.module = copy.deepcopy(base).to(device)
            self.ddp = DDP(self.module, process_group=plain_group, **ddp_kw)
            if hook is not None:
                self.ddp.register_comm_hook(None, hook)
            self.opt = PlainSGD(list(self.module.parameters()), lr=0.01)

        def step(self):
            self.opt.zero_grad(set_to_none=False)
            F.cross_entropy(self.ddp(xb), yb).backward()
            self.opt.step()

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ctl = torch.zeros(4, dtype=torch.int64)

    class Control(Plain):
        def step(self):
            dist.all_reduce(ctl, op=dist.ReduceOp.MAX, group=ctl_group)
            int(ctl[0].item()), int(ctl[1].item()), int(ctl[3].item())
            super().step()

    class Ours:
        def __init__(self, every: int, sender: bool, timing: str = "comm-hook"):
            clock = CudaClock(device) if cuda else CpuClock()
            self.rec = Recorder(clock, n_layers, every=every)
            os.environ["DDPTUI_COMM_TIMING"] = timing
            self.s = DDPStrategy(base, self.rec, device, 0.01, 1)
            os.environ.pop("DDPTUI_COMM_TIMING")
            self.s.prepare()
            self.fr = self.s.timing == "flight-recorder"
            self.k = 0
            self.q = queue.Queue() if sender else None
            self.later: list = []
            if sender:
                threading.Thread(target=self._send, daemon=True).start()

        def _send(self):
            while True:
                item = self.q.get()
                item()
                self.q.task_done()

        def step(self):
            s, rec = self.s, self.rec
            s.prepare()
            rec.begin("ddp", self.k)
            self.k += 1
            s.step(xb, yb)
            rec.end()
            items = rec.poll(lazy=True)
            if self.q is not None:
                for it in items:
                    self.q.put(it)
            else:
                self.later += items
            if s.track_buckets:
                s.take_layout_change()

        def end_turn(self):
            rest = self.rec.poll(wait=True, lazy=True)
            if self.q is not None:
                for it in rest:
                    self.q.put(it)
                if not self.fr:  # (NCCL's own timing: the sender waits for the watchdog, a
                    self.q.join()  # latency; its dumps, the cost, are charged after the run)
            else:
                for it in self.later + rest:
                    it()
                self.later = []

    sides = {"A plain": Plain(), "B py-hook": Plain(default_hooks.allreduce_hook),
             "C comm": Ours(spec.MAX_LAYER_EVERY, False), "D every-layer": Ours(1, False),
             "E sender": Ours(1, True), "F control": Control()}
    fr_sides = ()
    if cuda:  # the buckets timed by NCCL itself (the Flight Recorder), no comm hook
        sides["N fr"] = Ours(spec.MAX_LAYER_EVERY, True, "flight-recorder")
        sides["M fr every-layer"] = Ours(1, True, "flight-recorder")
        fr_sides = ("N fr", "M fr every-layer")
        if not sides["N fr"].fr:
            print(f"gpu_cost: the Flight Recorder path is off: {sides['N fr'].s.timing_why}", file=sys.stderr)
    names = list(sides)

    def turn(name) -> float:
        side = sides[name]
        sync()
        t0 = time.perf_counter()
        for _ in range(a.block):
            side.step()
        if hasattr(side, "end_turn"):
            side.end_turn()
        sync()
        return (time.perf_counter() - t0) / a.block * 1e3

    orders = list(itertools.permutations(range(len(names))))
    for k in range(3):  # warm-up: DDP rebuilds its buckets, the allocator settles
        for i in orders[k]:
            turn(names[i])
    got: dict[str, list[float]] = {n: [] for n in names}
    for k in range(a.turns):
        for i in orders[(k * 7) % len(orders)]:
            got[names[i]].append(turn(names[i]))
    for n in fr_sides:  # the sender's last waits, then its dumps charged to the side (ms a step)
        side = sides[n]
        side.q.join()
        st = side.rec.fr.stats() if side.rec.fr is not None else None
        if st:
            steps = (a.turns + 3) * a.block
            per = st["dump_ms"] / steps
            got[n] = [t + per for t in got[n]]
            print(f"  {n}: {st['dumps']} Flight Recorder dumps (every {st.get('interval_s', 0):.2f} s), "
                  f"{st['dump_ms']:.1f} ms of the sender's CPU time in all, "
                  f"{1e3 * per:.1f} µs a step charged; {st['entries']} entries read, "
                  f"{st['missed']} overwritten unread, {side.rec.fr_untimed} buckets untimed"
                  + (f"; failed: {st['failed']}" if st.get("failed") else ""))
            fr, strat = side.rec.fr, side.s
            fr.refresh(force=True)
            seqs = sorted(q for g, q in fr._by_key if g == strat.group)
            print(f"    group {strat.group!r}: the backend's sequence number "
                  f"{strat.pg_backend._get_sequence_number_for_group()}, the Flight Recorder's last "
                  f"{seqs[-1] if seqs else None}; bucket bytes {[n for _, _, n in (strat.layout or [])]}, "
                  f"the recorder's last {[fr._by_key[(strat.group, q)][1] for q in seqs[-len(strat.layout or []):]] if seqs else []}")
    med = {n: statistics.median(v) for n, v in got.items()}
    # is the host ahead of the GPU on the plain step? its launch time against its GPU time
    host_ms, gpu_ms = [], []
    plain = sides["A plain"]
    for _ in range(10 if a.quick else 30):
        sync()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        plain.step()
        host_ms.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            e1.record()
            e1.synchronize()
            gpu_ms.append(e0.elapsed_time(e1))
    wall = time.monotonic() - t_start
    A = med["A plain"]
    units = unit_costs(torch, device) if cuda else {}
    buckets = len(sides["D every-layer"].s.layout or []) or 1
    print(f"gpu_cost: {a.model}, batch {a.batch_size}, {a.device} "
          f"({torch.cuda.get_device_name(device) if cuda else 'CPU'}), torch {torch.__version__}, "
          f"{a.turns} turns of {a.block} steps a side, {buckets} buckets, {wall:.0f} s"
          + (" (SMOKE: --quick)" if a.quick else ""))
    for n in names:
        print(f"  {n:14s} {med[n]:8.3f} ms a step   {1e3 * (med[n] - A):+8.1f} µs vs plain   "
              f"ratio {med[n] / A:.4f}")
    parts = {"a Python comm hook (B-A)": med["B py-hook"] - A,
             "ddptui's comm marks and bookkeeping over it (C-B)": med["C comm"] - med["B py-hook"],
             "every layer marked (D-C)": med["D every-layer"] - med["C comm"],
             "the sender thread resolving alongside (E-D)": med["E sender"] - med["D every-layer"],
             "the control collective (F-A)": med["F control"] - A}
    if "N fr" in med:
        parts["NCCL's own timing instead of the comm hook (N-C)"] = med["N fr"] - med["C comm"]
        parts["every layer marked, NCCL's timing (M-N)"] = med["M fr every-layer"] - med["N fr"]
    print("  where ddptui's extra goes (µs a step; per bucket where it is per bucket):")
    for k, v in parts.items():
        extra = f"  ({1e3 * v / buckets:.1f} µs a bucket)" if "bucket" in k or "hook" in k else ""
        print(f"    {k:52s} {1e3 * v:+8.1f}{extra}")
    h, g = statistics.median(host_ms), (statistics.median(gpu_ms) if gpu_ms else float("nan"))
    print(f"  the plain step: the host launches it in {h:.3f} ms, the GPU runs it in {g:.3f} ms: "
          f"{'the host is ahead (GPU-bound)' if gpu_ms and h < g else 'the host is the critical path'}")
    if units:
        print("  unit costs (µs): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in units.items()))
    doc = {"machine": (torch.cuda.get_device_name(device) if cuda else "CPU") + f", torch {torch.__version__}",
           "model": a.model, "batch": a.batch_size, "buckets": buckets, "turns": a.turns, "block": a.block,
           "sides_ms": med, "parts_us": {k: 1e3 * v for k, v in parts.items()},
           "comm_hook_us": {"value": 1e3 * parts["a Python comm hook (B-A)"] / buckets, "how": "measured"},
           "plain_host_ms": h, "plain_gpu_ms": g if gpu_ms else None, "wall_s": wall, "quick": a.quick}
    for k, v in units.items():
        doc[k] = {"value": v, "how": "measured"}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    dist.destroy_process_group()
    print(f"gpu_cost {'SMOKE' if a.quick else 'done'} wall_s={wall:.0f} goal<=120")
    return 0


if __name__ == "__main__":
    sys.exit(main())
