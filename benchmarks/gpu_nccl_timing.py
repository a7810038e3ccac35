#!/usr/bin/env python
"""PyTorch's own timing of NCCL collectives, measured on one GPU (NCCL at world 1): what timing
DDP's buckets without a Python comm hook costs, and what PyTorch hands over.

Sides, each a DDP replica of the same model on the same batches, taking turns in every order
(P1's way: `--block` steps a turn, the turn's end synchronised, medians of per-turn times):

  A plain      DDP on the default process group, NCCL timing off
  T timed      DDP on a group made with TORCH_NCCL_ENABLE_TIMING=1 (NCCL's start event per
               collective), nothing registered
  H hooked     DDP on a timed group with ProcessGroupNCCL's on-completion hook registered
               (`_register_on_completion_hook`: WorkInfo on the hook thread, the GIL taken)
  B py-hook    DDP on the default group with PyTorch's Python allreduce_hook (what a Python
               comm hook per bucket costs)

and, once each: what registering the hook printed or warned (Python warnings and the process's
own stderr); WorkInfo's fields as this build gives them; how long after a collective's GPU end
the hook is called (the watchdog's poll); whether `_enable_collectives_timing()` turns timing
on for a group made without the variable; the Flight Recorder dump (`_dump_nccl_trace`): its
size, entries, fields, the time to take it, and its `pg_status` (the last enqueued, started and
completed sequence numbers the hang naming needs).

    python benchmarks/gpu_nccl_timing.py --out $OUT/nccl-timing.json    # on a GPU, < 1 minute
"""
from __future__ import annotations

import argparse
import collections
import copy
import itertools
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import warnings

from _common import ROOT

sys.path.insert(0, ROOT)


def _capture_stderr(fn):
    """Run fn with fd 2 sent to a file; return (result or exception, what was written, warnings)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp, warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        os.dup2(tmp.fileno(), 2)
        try:
            try:
                got = fn()
            except Exception as e:  # noqa: BLE001 (reported)
                got = e
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
        return got, text, [f"{x.category.__name__}: {x.message}" for x in w]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--model", default="xlarge")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("gpu_nccl_timing: needs a CUDA device and NCCL", file=sys.stderr)
        return 2
    import socket

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ranks.builtin.models import build_model, make_dataset
    from ranks.builtin.strategies import PlainSGD
    doc: dict = {"torch": torch.__version__}
    t_start = time.monotonic()

    def save():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1, default=str)

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
    s.close()
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING", None)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    doc["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"  # read when each group is made
    g_timed = dist.new_group([0])
    g_hooked = dist.new_group([0])
    os.environ.pop("TORCH_NCCL_ENABLE_TIMING")
    g_late = dist.new_group([0])  # timing turned on after, by _enable_collectives_timing()
    be = {n: g._get_backend(device) for n, g in (("default", dist.group.WORLD), ("timed", g_timed),
                                                  ("hooked", g_hooked), ("late", g_late))}
    doc["backend_methods"] = sorted(m for m in dir(be["hooked"]) if m.startswith("_") and not m.startswith("__"))
    infos: collections.deque = collections.deque()
    clock_at_hook: collections.deque = collections.deque()

    def hook(info):  # on the hook thread
        clock_at_hook.append(time.monotonic())
        infos.append(info)

    got, text, warns = _capture_stderr(lambda: be["hooked"]._register_on_completion_hook(hook))
    doc["register"] = {"result": repr(got), "stderr": text.strip()[-2000:], "warnings": warns}
    print(f"register: {got!r}; stderr {text.strip()[:300]!r}; warnings {warns}")
    late_infos: list = []
    got, text, warns = _capture_stderr(lambda: (be["late"]._enable_collectives_timing(),
                                                be["late"]._register_on_completion_hook(late_infos.append)))
    doc["register_late"] = {"result": repr(got), "stderr": text.strip()[-2000:], "warnings": warns}
    print(f"register after _enable_collectives_timing: {got!r}; warnings {warns}")
    t = torch.ones(1 << 20, device=device)
    dist.all_reduce(t, group=g_late)
    torch.cuda.synchronize()
    save()

    base = build_model(a.model, seed=42)
    X, Y = make_dataset(a.batch_size * 2, seed=42, device=device)
    xb, yb = X[:a.batch_size], Y[:a.batch_size]

    class Side:
        def __init__(self, group, hook=None):
            self.module = copy.deepcopy(base).to(device)
            self.ddp = DDP(self.module, device_ids=[0], process_group=group)
            if hook is not None:
                self.ddp.register_comm_hook(None, hook)
            self.opt = PlainSGD(list(self.module.parameters()), lr=0.01)

        def step(self):
            self.opt.zero_grad(set_to_none=False)
            F.cross_entropy(self.ddp(xb), yb).backward()
            self.opt.step()

    sides = {"A plain": Side(None), "T timed": Side(g_timed), "H hooked": Side(g_hooked),
             "B py-hook": Side(None, default_hooks.allreduce_hook)}
    names = list(sides)

    def turn(name) -> float:
        side = sides[name]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.block):
            side.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.block * 1e3

    orders = list(itertools.permutations(range(len(names))))
    for k in range(3):
        for i in orders[k]:
            turn(names[i])
    got_ms: dict = {n: [] for n in names}
    for k in range(a.turns):
        for i in orders[(k * 7) % len(orders)]:
            got_ms[names[i]].append(turn(names[i]))
    med = {n: statistics.median(v) for n, v in got_ms.items()}
    A = med["A plain"]
    doc["sides_ms"] = med
    doc["sides_quartiles_ms"] = {n: (sorted(v)[len(v) // 4], sorted(v)[3 * len(v) // 4]) for n, v in got_ms.items()}
    print(f"gpu_nccl_timing: {a.model}, batch {a.batch_size}, {torch.cuda.get_device_name(device)}, "
          f"torch {torch.__version__}, NCCL {doc['nccl_version']}, {a.turns} turns of {a.block}")
    for n in names:
        print(f"  {n:10s} {med[n]:8.3f} ms a step   {1e3 * (med[n] - A):+8.1f} µs vs plain   ratio {med[n] / A:.4f}")
    save()

    # WorkInfo as this build gives it, and the hook's delay after the GPU's end
    time.sleep(0.3)
    buckets_per_step = None
    if infos:
        i0 = infos[-1]
        doc["workinfo"] = {f: repr(getattr(i0, f, "ABSENT")) for f in
                           ("op_type", "seq", "time_started", "time_finished", "active_duration")}
        doc["workinfo_dir"] = [f for f in dir(i0) if not f.startswith("__")]
        print(f"  WorkInfo: {doc['workinfo']}")
        seqs = [int(getattr(x, "seq", -1)) for x in infos]
        doc["hook_seqs_head_tail"] = (seqs[:12], seqs[-12:])
        doc["hook_calls"] = len(infos)
        d = [x.active_duration.total_seconds() * 1e3 for x in infos]
        doc["durations_ms"] = {"median": statistics.median(d), "max": max(d), "n": len(d)}
    infos.clear()
    clock_at_hook.clear()
    delays = []
    side = sides["H hooked"]
    for _ in range(20):
        n0 = len(infos)
        side.step()
        torch.cuda.synchronize()
        t_done = time.monotonic()
        deadline = t_done + 1.0
        while len(infos) == n0 and time.monotonic() < deadline:
            time.sleep(0.0002)
        if len(infos) > n0:
            delays.append((clock_at_hook[n0] - t_done) * 1e3)
            buckets_per_step = len(infos) - n0
        time.sleep(0.013)  # land at another phase of the watchdog's poll
    if delays:
        doc["hook_delay_after_sync_ms"] = {"median": statistics.median(delays), "max": max(delays),
                                           "min": min(delays), "n": len(delays)}
        print(f"  the hook's first call after the step's sync: median {statistics.median(delays):.1f} ms, "
              f"max {max(delays):.1f} ms ({buckets_per_step} hook calls that step, more may follow)")
    time.sleep(0.3)
    doc["late_hook_calls"] = len(late_infos)
    print(f"  the group timed by _enable_collectives_timing(): {len(late_infos)} hook call(s)")
    save()

    # the Flight Recorder
    c10d = torch._C._distributed_c10d
    for fn_name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, fn_name, None)
        if fn is None:
            doc[fn_name] = "ABSENT"
            continue
        try:
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                raw = fn(True, False, False) if fn_name == "_dump_nccl_trace" else fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            d = pickle.loads(raw)
            t_load = (time.perf_counter() - t0) * 1e3
            entries = d.get("entries", [])
            e_last = entries[-1] if entries else {}
            doc[fn_name] = {"bytes": len(raw), "dump_ms_median": statistics.median(ts), "unpickle_ms": t_load,
                            "keys": sorted(d), "entries": len(entries), "version": d.get("version"),
                            "entry_last": {k: v for k, v in e_last.items() if k != "frames"},
                            "pg_status": d.get("pg_status"), "pg_config": d.get("pg_config")}
            print(f"  {fn_name}: {len(raw)} B, {len(entries)} entries, dump {statistics.median(ts):.2f} ms, "
                  f"unpickle {t_load:.2f} ms; pg_status {d.get('pg_status')}")
            print(f"    last entry: {doc[fn_name]['entry_last']}")
        except Exception as e:  # noqa: BLE001 (reported)
            doc[fn_name] = f"FAILED {type(e).__name__}: {e}"
            print(f"  {fn_name}: FAILED {type(e).__name__}: {e}")
        save()
    for fn_name in ("_dump_nccl_trace_json",):
        fn = getattr(c10d, fn_name, None)
        if fn is not None:
            try:
                t0 = time.perf_counter()
                js = fn(True, True)
                doc[fn_name] = {"chars": len(js), "ms": (time.perf_counter() - t0) * 1e3}
            except Exception as e:  # noqa: BLE001
                doc[fn_name] = f"FAILED {type(e).__name__}: {e}"
    doc["wall_s"] = time.monotonic() - t_start
    save()
    print(f"gpu_nccl_timing done wall_s={doc['wall_s']:.0f}")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
