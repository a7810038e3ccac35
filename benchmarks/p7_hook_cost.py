#!/usr/bin/env python
"""P7 — host cost of the CUDA hook path per layer per step, on the training thread.

On a GPU, what ddptui's hooks cost the host shows once steps are short (~1 ms for xlarge on
8 GPUs or in bf16): the host then launches kernels no faster than it runs hooks. This
measures that cost without a GPU: the real layer hooks (ranks.builtin.strategies.attach_layer_hooks),
the real Recorder and CudaClock, with the CUDA calls replaced by stand-ins of the same Python
shape as torch.cuda's (torch.cuda.Event is a Python subclass of a C class whose `record` goes
through a Python method that may look up the current stream; torch.cuda.current_stream is a
Python function that builds a Python Stream object; the stand-ins keep those layers and put a
builtin call where torch calls into C).

Figure: (instrumented step - plain step) / layers, median over steps, on a model of 40 small
blocks (Linear 16x16 + ReLU, batch 1: compute is small next to the hooks), the instrumented and
plain replicas taking turns. Printed side by side with the hook path as it was before the
per-mark changes (`--vs REV`, default the last commit that had it), loaded from git. From the
per-layer figure, an estimate of P1 on an 8-GPU xlarge step of ~1 ms, if the host is the
critical path. The resolution of each step (on the sender thread in the workers) is timed
apart. Goal: <= 3 µs per layer per step on the training thread.

    python benchmarks/p7_hook_cost.py [--steps 400] [--vs REV]
"""
from __future__ import annotations

import argparse
import copy
import itertools
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, result_line

sys.path.insert(0, ROOT)

OLD_REV = "ce340ac"  # the hook path before: a Python Stream per mark, bwd_end marked thrice


def stand_in_cuda():
    """A torch.cuda stand-in with torch.cuda's Python layers and builtins for its C calls."""
    import operator

    class _CudaEventBase:  # the C class: its record is a C function
        record = staticmethod(operator.is_)
        query = staticmethod(bool)

        def elapsed_time(self, other):
            return 0.5

    class Event(_CudaEventBase):
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            pass

        def record(self, stream=None):  # torch.cuda.Event.record's shape
            if stream is None:
                stream = current_stream()
            super().record(self, stream)

        def query(self):
            return True

        def synchronize(self):
            pass

    class _CudaStreamBase:
        def __init__(self, *a, **kw):
            pass

    class Stream(_CudaStreamBase):
        def __new__(cls, device=None, priority=0, **kwargs):  # torch.cuda.Stream's shape
            if device is None or ("stream_id" in kwargs and "device_index" in kwargs):
                return super().__new__(cls)
            with _device(device):
                return super().__new__(cls)

    class _device:  # torch.cuda.device's shape: exchange the current device
        def __init__(self, d):
            self.idx = _get_device_index(d)

        def __enter__(self):
            self.prev = operator.index(0)

        def __exit__(self, *a):
            operator.index(self.prev)
            return False

    def _get_device_index(device, optional=False):
        if isinstance(device, str):
            return int(device.split(":")[-1]) if ":" in device else 0
        return 0 if device is None else getattr(device, "index", device) or 0

    def _lazy_init():
        return None

    def current_stream(device=None):  # torch.cuda.current_stream's shape
        _lazy_init()
        data = (0, _get_device_index(device, optional=True), 1)
        return Stream(stream_id=data[0], device_index=data[1], device_type=data[2])

    ns = type("cuda", (), {})()
    ns.Event, ns.Stream, ns.current_stream = Event, Stream, current_stream
    ns._raw_current_stream = (0, 0, 1).__mul__  # torch._C._cuda_getCurrentStream's place: a builtin call, a tuple
    return ns


def _load(rev: str, path: str, name: str, d: str, own: dict | None = None):
    """`path` as it was at `rev`, as a module named `name`; `own`: relative imports of modules
    loaded from `rev` too (module -> its name), the others from this checkout's ranks."""
    src = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for mod, as_name in (own or {}).items():
        src = src.replace(f"from .{mod} import", f"from {as_name} import")
    for a, b in (("from .clock", "from ranks.clock"), ("from .wire", "from ranks.wire"),
                 ("from . import spec", "from ranks import spec"), ("from .spec", "from ranks.spec"),
                 ("from .instrument import", "from ranks.core.instrument import")):
        src = src.replace(a, b)
    file = os.path.join(d, f"{name}.py")
    with open(file, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_old(rev: str):
    """(instrument, strategies) as they were at `rev`, as modules, with the ranks' spec of
    then (the longest sampling period; None if git cannot)."""
    tag = "".join(c for c in rev if c.isalnum())
    with tempfile.TemporaryDirectory(prefix="ddptui-p7-") as d:  # (the modules are loaded by then)
        try:
            _load(rev, "ranks/spec.py", f"spec_{tag}", d)
            own = {"spec": f"spec_{tag}"}
            out = []
            for room, name in (("core", "instrument"), ("builtin", "strategies")):
                try:  # (ranks/ in rooms since the Flight Recorder's session; flat before)
                    out.append(_load(rev, f"ranks/{room}/{name}.py", f"{name}_{tag}", d, own))
                except (OSError, subprocess.CalledProcessError):
                    out.append(_load(rev, f"ranks/{name}.py", f"{name}_{tag}", d, own))
            return tuple(out)
        except (OSError, subprocess.CalledProcessError):
            return None


def noop_hooks(model) -> None:
    """The same hooks as the current attach_layer_hooks, doing nothing: what PyTorch's dispatch
    of them costs, the floor of any hook-based timing of these layers."""
    blocks = list(model.children())

    def forward(x):
        for block in blocks:
            x = block(x)
        if x.grad_fn is not None:
            x.grad_fn.register_prehook(lambda g: None)
        return x

    model.forward = forward
    for block in blocks:
        next(block.parameters()).register_post_accumulate_grad_hook(lambda p: None)


def measure(instrument, strategies, steps: int, layers: int, width: int, cuda: bool = False):
    """(ddptui's cost, the no-op hooks' cost) per layer per step in µs (medians of differences
    to a plain replica), and the median resolution time per step in µs."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    attach_layer_hooks = strategies.attach_layer_hooks
    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    base = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])
    plain = copy.deepcopy(base).to(dev)
    floor = copy.deepcopy(base).to(dev)
    noop_hooks(floor)
    timed = copy.deepcopy(base).to(dev)
    if cuda:  # the real CUDA calls: host time only (nothing waits for the GPU in a step)
        clock = instrument.CudaClock(dev)
    else:
        clock = instrument.CudaClock("cuda:0", torch_cuda=stand_in_cuda(), host_ns=time.monotonic_ns)
    rec = instrument.Recorder(clock, layers)
    attach_layer_hooks(timed, rec)
    x = torch.randn(1, width, device=dev)
    y = torch.zeros(1, dtype=torch.long, device=dev)
    lazy = "lazy" in instrument.Recorder.poll.__code__.co_varnames
    resolve = []

    def step(m):
        t0 = time.perf_counter_ns()
        F.cross_entropy(m(x), y).backward()
        return time.perf_counter_ns() - t0

    def step_timed():
        t0 = time.perf_counter_ns()
        rec.begin("ddp", 0)
        F.cross_entropy(timed(x), y).backward()
        rec.end()
        items = rec.poll(lazy=True) if lazy else rec.poll()
        t1 = time.perf_counter_ns()
        if lazy:  # what the sender thread does
            for it in items:
                it()
        resolve.append((time.perf_counter_ns() - t1) / 1000)
        return t1 - t0

    sides = [lambda: step(plain), lambda: step(floor), step_timed]
    for k in range(20):
        for f in sides:
            f()
    if cuda:
        torch.cuda.synchronize()
    import gc
    gc.collect()
    gc.disable()  # a collection lands on any side at random: noise, not its cost
    got: list[list[float]] = [[], [], []]
    orders = list(itertools.permutations(range(3)))
    for k in range(steps):
        for i in orders[k % len(orders)]:
            got[i].append(sides[i]())
        if cuda and k % 50 == 49:  # keep the GPU's queue short: launches must not block
            torch.cuda.synchronize()
    gc.enable()
    p0 = statistics.median(got[0])
    per_layer = [(statistics.median(g) - p0) / layers / 1000 for g in got[1:]]
    return per_layer[1], per_layer[0], statistics.median(resolve), p0 / 1000


def floor_side(model, x, y):
    """A step that makes the calls a recorded step makes, doing nothing: the model's forward
    replaced by a loop over its blocks, a hook on the first block's weight, and four calls
    around the step (begin, backward_starts, end, poll). What any per-step recording from
    Python costs before it records anything."""
    import torch.nn.functional as F
    blocks = list(model.children())

    def forward(x):
        for block in blocks:
            x = block(x)
        return x
    model.forward = forward
    next(blocks[0].parameters()).register_post_accumulate_grad_hook(lambda p: None)

    class Nothing:
        def begin(self, strategy, step):
            pass

        def backward_starts(self):
            pass

        def end(self):
            pass

        def poll(self, lazy=False):
            return ()
    rec = Nothing()

    def one() -> int:
        t0 = time.perf_counter_ns()
        rec.begin("ddp", 0)
        loss = F.cross_entropy(model(x), y)
        rec.backward_starts()
        loss.backward()
        rec.end()
        rec.poll(lazy=True)
        return time.perf_counter_ns() - t0
    return one


def measure_sampled(instrument, strategies, steps: int, layers: int, width: int, cuda: bool = False,
                    warmup: int = 512):
    """The host share of the step with the layer marks as a run makes them (the Recorder's
    own period, LAYER_SHARE), plain and instrumented replicas taking turns step by step, with
    a third doing ddptui's calls empty (`floor_side`): ((every - 1) x the extra time of a step
    whose layers are not marked + the median extra time of a marked one) / every / the median
    plain step. A step's extra is its time less the plain step next to it; for the steps whose
    layers are not marked, the median over runs of POLL_BATCH such steps in a row of their
    mean (the Recorder hands them over by that many: one poll of the run does the work).
    Medians: a preemption lands on either side at random. Returns (share %, every, unmarked
    extra µs, marked extra µs, plain step µs, the empty calls' extra µs)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    base = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])
    plain, timed, empty = copy.deepcopy(base).to(dev), copy.deepcopy(base).to(dev), copy.deepcopy(base).to(dev)
    if cuda:
        clock = instrument.CudaClock(dev)
    else:
        clock = instrument.CudaClock("cuda:0", torch_cuda=stand_in_cuda(), host_ns=time.monotonic_ns)
    rec = instrument.Recorder(clock, layers)
    strategies.attach_layer_hooks(timed, rec, "ddp")
    x = torch.randn(1, width, device=dev)
    y = torch.zeros(1, dtype=torch.long, device=dev)
    floor = floor_side(empty, x, y)
    k = [0]

    def one(m, timed_side: bool) -> int:
        t0 = time.perf_counter_ns()
        if timed_side:
            rec.begin("ddp", k[0])
        loss = F.cross_entropy(m(x), y)
        if timed_side:
            rec.backward_starts()  # (as the strategies' step does)
        loss.backward()
        if not timed_side:
            return time.perf_counter_ns() - t0
        rec.end()
        items = rec.poll(lazy=True)
        k[0] += 1
        t1 = time.perf_counter_ns()
        for it in items:  # what the sender thread does in a run (not timed: not this thread's);
            it()  # its marks go back to the clock's pool, as they do in a run
        return t1 - t0

    for _ in range(warmup):  # warm-up: the period settles (from what its marked steps are seen to take)
        one(plain, False); one(timed, True); floor()
    import gc
    gc.collect()
    gc.disable()
    plain_ns, marked, runs, run, empty_ns = [], [], [], [], []
    batch = getattr(instrument, "POLL_BATCH", 1)
    orders = list(itertools.permutations(range(3)))
    for j in range(steps):
        layers_marked = k[0] % rec.layer_every("ddp") == 0
        got = [0, 0, 0]
        for i in orders[j % len(orders)]:
            got[i] = floor() if i == 2 else one(timed if i else plain, i == 1)
        p, t = got[0], got[1]
        plain_ns.append(p)
        empty_ns.append(got[2] - p)
        if layers_marked:
            marked.append(t - p)
            run = []
        else:
            run.append(t - p)
            if len(run) == batch:
                runs.append(statistics.fmean(run))
                run = []
        if cuda and j % 50 == 49:
            torch.cuda.synchronize()
    gc.enable()
    every = rec.layer_every("ddp")
    un = statistics.median(runs) / 1000 if runs else 0.0
    mk = statistics.median(marked) / 1000 if marked else un
    p0 = statistics.median(plain_ns) / 1000
    share = 100.0 * ((every - 1) * un + mk) / every / p0
    return share, every, un, mk, p0, statistics.median(empty_ns) / 1000


def measure_handoff(steps: int, step_us: int = 1000, work_us: int = 20):
    """Handing a step to the sender thread, on the training thread: queue.Queue.put_nowait
    (what the sinks used: a lock, and a wake-up of the waiting sender every step) against
    ranks.core.emitter.Handoff's (a deque append; the sender looks every few ms), in turn, a
    consumer doing `work_us` of Python per item and `step_us` of busy compute between puts.
    Returns {name: (median µs, mean µs)}."""
    import queue
    import threading
    from ranks.core.emitter import Handoff
    pc = time.perf_counter_ns

    def busy(us):
        t = pc()
        while pc() - t < us * 1000:
            pass

    def side(q):
        def consume():
            while q.get() is not None:
                busy(work_us)
        th = threading.Thread(target=consume, daemon=True)
        th.start()
        got = []
        for _ in range(steps):
            busy(step_us)
            t = pc()
            q.put_nowait(1)
            got.append(pc() - t)
        q.put(None)
        th.join(5)
        return got

    out: dict = {"queue.Queue": [], "Handoff": []}
    for _ in range(2):
        out["queue.Queue"] += side(queue.Queue(maxsize=256))
        out["Handoff"] += side(Handoff(256))
    return {k: (statistics.median(v) / 1000, statistics.fmean(v) / 1000) for k, v in out.items()}


MODEL_LAYERS = {"xlarge": 8, "deep40": 40}
SESSION_REV = "69205d5"  # the hook path before the H100 redesign (h100-model's "before")


def measure_h100_model(instrument, strategies, model: str, steps: int, every: int | None = None,
                       path: str = "comm-hook") -> dict:
    """The host time ddptui would take on the first H100 a step of `model` (its layers, its DDP
    buckets, its step length there: benchmarks/h100_costs.json), every figure of the model
    either measured here or charged at the H100's cost:

    - ddptui's own Python on this CPU: an instrumented step (the real Recorder, CudaClock and
      layer hooks on a torch.cuda stand-in that counts its calls: tests/cuda_cost.py) less a
      plain one, in turn, median;
    - each CUDA call the step made (counted by the stand-in) at what the H100 charges for it,
      less this CPU's part of a mark (already in the first figure);
    - each hook PyTorch dispatched at the H100's dispatch in place of this CPU's (a no-op
      hook's, in the first figure: this CPU's slower dispatch is taken out, a faster one topped
      up); the marks are node post hooks after the reducer's, as under DDP (`move_after`);
    - each bucket's Python comm hook at its measured cost (DDP calling Python, over its C++
      AllReduce; benchmarks/gpu_cost.py); or, `path` "flight-recorder" (NCCL's own timing, no
      comm hook): the group's sequence number read once a step (the Flight Recorder's dumps
      are the sender thread's), and where the layers are marked on a sample of steps only,
      each bucket's ready hook dispatched and its one mark (every step marked: none, each
      bucket ready at its block's mark);
    and the period the Recorder chose for its layer marks, the step's length on the device
    being the H100's (in a run the sender thread takes it from the resolved steps). Returns
    the figures, `share_pct` the host time over the H100's step."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from tests.cuda_cost import charge, counted_cuda, h100
    costs = h100()
    layers, buckets = MODEL_LAYERS[model], int(costs["buckets"][model])
    step_ns = costs["steps_ms"][model] * 1e6
    cuda = counted_cuda()
    clock = instrument.CudaClock("cuda:0", torch_cuda=cuda, host_ns=time.monotonic_ns,
                                 hook_lag_ns=int(costs["hook_dispatch"] * 1000))
    rec = instrument.Recorder(clock, layers, every=every)
    if hasattr(rec, "_dev_ns"):  # the step's length on the device: the H100's (in a run the
        class _Device(dict):  # sender thread writes it from resolved steps; here the stand-in's
            def get(self, key, default=None):  # events have no length to give)
                return step_ns

            def __setitem__(self, key, value):
                pass
        rec._dev_ns = _Device()
    torch.manual_seed(0)
    width = 16
    base = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])
    plain, timed, floor = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    # DDP's buckets: each one's AllReduce issued from the hook of the weight that completes it
    # (the reducer's, registered before the layer marks), spread over the backward, the last in
    # the first block's: what ddptui's comm hook does around each (its issue and end marks)
    blocks = list(timed.children())
    at = sorted({round((layers - 1) * (1 - j / max(buckets - 1, 1))) for j in range(buckets)},
                reverse=True)
    fr = path == "flight-recorder"
    if fr:  # (its spans resolved from a Flight Recorder whose every collective lasted 0.1 ms)
        import pickle

        from ranks.core.flightrec import FlightTimes

        def dump():
            n = k[0] * len(at) + len(at)
            return pickle.dumps({"entries": [{"record_id": q, "process_group": ("0", ""), "collective_seq_id": q,
                                              "state": "completed", "duration_ms": 0.1} for q in range(max(1, n - 400), n + 1)]})
        rec.fr = FlightTimes(dump, interval_s=0.0)
        seq = [0]
    buckets = len(at)
    ready = None
    if not fr:
        for b, i in enumerate(at):
            def issue(p, b=b):
                cur = rec.cur
                if cur is None:
                    return
                slot = rec.comm_issue(b)
                rec.comm_done(cur, slot)
            next(blocks[i].parameters()).register_post_accumulate_grad_hook(issue)
    marks = strategies.attach_layer_hooks(timed, rec, "ddp")
    if hasattr(marks, "move_after"):  # (as under DDP: the marks after the reducer's node hooks)
        marks.move_after()
    if fr and hasattr(strategies.BucketReady, "enable"):  # (DDPStrategy's: the ready hooks
        ready = strategies.BucketReady(rec, "0", active=not marks.on)  # only while sampled)
        ready.set([(b, next(blocks[i].parameters())) for b, i in enumerate(at)])

        def switch(on):
            marks.set(on)
            ready.enable(not on)
        rec.switches["ddp"] = switch
    elif fr:  # (the code before: a ready hook a bucket on every step)
        for b, i in enumerate(at):
            def issue(p, b=b):
                if rec.cur is not None:
                    rec.comm_issue_fr(b, "0")
            next(blocks[i].parameters()).register_post_accumulate_grad_hook(issue)

    def seal(n):  # (DDPStrategy.step: the group's sequence number after the backward)
        if ready is None:
            rec.comm_seal("0", n)
        else:
            rec.comm_seal("0", n, list(at) if marks.on else None)
    noop_hooks(floor)
    x, y = torch.randn(1, width), torch.zeros(1, dtype=torch.long)
    import timeit
    free_mark_us = min(timeit.repeat(lambda: clock.release(clock.mark()), number=5000, repeat=5)) / 5000 * 1e6
    k = [0]
    info = {"hooks": 0, "marked": 0, "bucket_hooks": 0}

    def one(m, side: int) -> int:
        t0 = time.perf_counter_ns()
        if side == 1:
            rec._mark_ns = costs["event_record"] * 1000  # (one mark as the H100's host times it)
            rec.begin("ddp", k[0])
            marked = rec.cur.layers
        loss = F.cross_entropy(m(x), y)
        if side == 1:
            rec.backward_starts()
        loss.backward()
        if side != 1:
            return time.perf_counter_ns() - t0
        if fr:
            seq[0] += buckets
            seal(seq[0])
            info["bucket_hooks"] += buckets if ready is None or ready.active else 0
        rec.opt_begin()
        try:
            rec.opt_end(last=True)
        except TypeError:  # (the code before: no shared end)
            rec.opt_end()
        rec.end()
        items = rec.poll(lazy=True)
        t1 = time.perf_counter_ns()
        k[0] += 1
        info["hooks"] += (layers + 1) if marked else 1
        info["marked"] += bool(marked)
        for it in items:  # (the sender thread's part: counted apart)
            it()
        return t1 - t0

    for _ in range(300):
        one(plain, 0); one(timed, 1); one(floor, 2)
    import gc
    gc.collect()
    gc.disable()
    info["hooks"] = info["marked"] = info["bucket_hooks"] = 0
    k0 = k[0]
    before = dict(cuda.calls)
    diffs, floors = [], []
    orders = list(itertools.permutations(range(3)))
    for j in range(steps):
        got = [0, 0, 0]
        for i in orders[j % len(orders)]:
            got[i] = one((plain, timed, floor)[i], i)
        diffs.append(got[1] - got[0])
        floors.append(got[2] - got[0])
    gc.enable()
    n = k[0] - k0
    after = dict(cuda.calls)
    per = {c: (after.get(c, 0) - before.get(c, 0)) / n for c in set(after) | set(before)}
    # resolution alone, as the sender thread does it: this CPU's Python and the H100's calls
    rec2_items = []
    for _ in range(20):
        rec.begin("ddp", k[0]); k[0] += 1
        loss = F.cross_entropy(timed(x), y); rec.backward_starts(); loss.backward()
        if fr:
            seq[0] += buckets
            seal(seq[0])
        rec.opt_begin(); rec.end()
        rec2_items += rec.poll(wait=True, lazy=True)
    e0 = cuda.calls["elapsed_time"]
    t = time.perf_counter_ns()
    for it in rec2_items:
        it()
    res_py_us = (time.perf_counter_ns() - t) / len(rec2_items) / 1000
    res_calls = (cuda.calls["elapsed_time"] - e0) / len(rec2_items)
    own_us = statistics.median(diffs) / 1000
    # this CPU's dispatch a hook: the floor model's hooks (a post-accumulate hook a block and
    # the loss's pre-hook) less the plain step, each
    floor_us = max(0.0, statistics.median(floors) / 1000 / (layers + 1))
    hooks = info["hooks"] / n
    charged = charge(per, costs, mark_overhead_us=free_mark_us)  # (elapsed_time: the sender's)
    if fr:  # the ready hooks where registered (their marks are counted records), the
        hooks += info["bucket_hooks"] / n  # sequence number a step
        comm = costs.get("seq_read", 1.0)
    else:
        comm = buckets * costs["comm_hook"]
    # each hook dispatched at the H100's cost in place of this CPU's (in own_us), either way
    dispatch = hooks * (costs["hook_dispatch"] - floor_us)
    host = own_us + charged + dispatch + comm
    return {"model": model, "layers": layers, "buckets": buckets, "step_ms": step_ns / 1e6, "path": path,
            "every": rec.layer_every("ddp"), "marked_frac": info["marked"] / n,
            "own_us": own_us, "charged_us": charged, "dispatch_us": dispatch, "comm_hook_us": comm,
            "host_us": host, "share_pct": 100 * host / (step_ns / 1000), "calls": per,
            "resolve_us": res_py_us + res_calls * costs["elapsed_time"], "resolve_calls": res_calls,
            "free_mark_us": free_mark_us, "cpu_dispatch_us": floor_us,
            "bucket_hooks": info["bucket_hooks"] / n, "hooks": hooks}


def costs_comm_hook() -> float:
    from tests.cuda_cost import h100
    return h100()["comm_hook"]


def h100_model_main(a) -> int:
    """--device h100-model: the host share the first H100 would show, now and before."""
    import torch
    torch.set_num_threads(1)
    from ranks.core import instrument
    from ranks.builtin import strategies
    steps = 60 if a.quick else a.steps
    old = load_old(a.share_vs or SESSION_REV)
    rows = []
    fr_rows = []
    for model in ("xlarge", "deep40"):
        now = [measure_h100_model(instrument, strategies, model, steps) for _ in range(1 if a.quick else 3)]
        got = sorted(now, key=lambda r: r["host_us"])[len(now) // 2]  # (the median run)
        if hasattr(instrument.Recorder, "comm_issue_fr"):  # NCCL's own timing (the default on NCCL)
            nf = [measure_h100_model(instrument, strategies, model, steps, path="flight-recorder")
                  for _ in range(1 if a.quick else 3)]
            fr_rows.append(sorted(nf, key=lambda r: r["host_us"])[len(nf) // 2])
        then = measure_h100_model(*old, model, steps) if old is not None else None
        # the code before with every layer marked too (--layer-every 1): the same coverage
        then1 = measure_h100_model(*old, model, steps, every=1) if old is not None else None
        rows.append((got, then, then1))
    print(f"P7 on the H100 cost model (what the first H100 measured a CUDA call, a hook's dispatch "
          f"and a step to take; benchmarks/h100_costs.json), ddptui's host time on the training "
          f"thread a step, torch {torch.__version__}, {steps} steps"
          + (" (SMOKE: --quick)" if a.quick else ""))
    for got, then, then1 in rows:
        c = got["calls"]
        print(f"  {got['model']:7s} {got['layers']:2d} layers, {got['buckets']:2d} buckets, a "
              f"{got['step_ms']:.1f} ms step: layers marked 1 step in {got['every']} "
              f"({100 * got['marked_frac']:.0f} % of steps); host {got['host_us']:.0f} µs = "
              f"{got['share_pct']:.2f} % (ddptui's Python here {got['own_us']:.0f}, CUDA calls "
              f"{got['charged_us']:.0f}: {c.get('record', 0):.1f} records, "
              f"{c.get('current_stream', 0):.1f} stream look-ups, {c.get('query', 0):.1f} queries; "
              f"hook dispatch {got['dispatch_us']:.0f}; Python comm hooks {got['comm_hook_us']:.0f}, "
              f"as measured); resolving a step on the sender thread {got['resolve_us']:.0f} µs "
              f"({got['resolve_calls']:.0f} elapsed_time calls)")
        if then is not None:
            print(f"          before ({a.share_vs or SESSION_REV}): layers marked 1 step in "
                  f"{then['every']}; host {then['host_us']:.0f} µs = {then['share_pct']:.2f} %; "
                  f"resolving {then['resolve_us']:.0f} µs ({then['resolve_calls']:.0f} calls); "
                  f"with every layer marked as now (--layer-every 1): host {then1['host_us']:.0f} µs = "
                  f"{then1['share_pct']:.2f} %, {then1['calls'].get('record', 0):.1f} records, "
                  f"{then1['calls'].get('current_stream', 0):.1f} stream look-ups, "
                  f"{then1['calls'].get('query', 0):.1f} queries a step; resolving "
                  f"{then1['resolve_us']:.0f} µs ({then1['resolve_calls']:.0f} calls)")
    hooks_pts = max(r[0]["comm_hook_us"] / (r[0]["step_ms"] * 10) for r in rows)
    print(f"  (of which the Python comm hooks, {costs_comm_hook():.1f} µs a bucket as an H200 "
          f"measured it: up to {hooks_pts:.2f} points)")
    from tests.cuda_cost import h100
    costs = h100()
    for got in fr_rows:
        c = got["calls"]
        # the floor of any timing of every layer by CUDA events from Python hooks: the step's
        # records and hooks at the H100's cost, with no Python of ddptui's at all
        floor = c.get("record", 0) * costs["event_record"] + got["hooks"] * costs["hook_dispatch"]
        print(f"  {got['model']:7s} with NCCL's own timing (no comm hook; the default on NCCL): layers "
              f"marked 1 step in {got['every']}; host {got['host_us']:.0f} µs = {got['share_pct']:.2f} % "
              f"(ddptui's Python here {got['own_us']:.0f}, CUDA calls {got['charged_us']:.0f}: "
              f"{c.get('record', 0):.1f} records; hook dispatch {got['dispatch_us']:.0f}; the sequence "
              f"number {got['comm_hook_us']:.0f}); resolving {got['resolve_us']:.0f} µs on the sender thread; "
              f"the floor (its {c.get('record', 0):.0f} records and {got['hooks']:.0f} hooks at the H100's cost, "
              f"no Python of ddptui's): {floor:.0f} µs = {100 * floor / (got['step_ms'] * 1000):.2f} %; this "
              f"CPU's hook dispatch {got['cpu_dispatch_us']:.2f} µs (the H100's host: "
              f"{costs['hook_dispatch']:.2f}; a busy VM's is higher, and ddptui's Python with it)")
    pick = fr_rows if fr_rows else [r[0] for r in rows]
    worst = max(r["share_pct"] for r in pick)
    every = max(r["every"] for r in pick)
    tag = "SMOKE" if a.quick else ("OK" if worst <= 1.0 and every == 1 else "MISS")
    print(f"P7 h100_model share_pct={worst:.2f} goal<=1 {tag} (every layer on every step: "
          f"{'yes' if every == 1 else 'no'}; {'NCCL' + chr(39) + 's own timing' if fr_rows else 'the comm hook'})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--quick", action="store_true",
                   help="30 steps, 1 round, 64 sampled steps after 64 of warm-up (CI: that it runs, not a figure)")
    p.add_argument("--vs", default=OLD_REV, help="git revision of the hook path to compare with")
    p.add_argument("--share-vs", default=None, metavar="REV",
                   help="also measure the host share with the hook path of REV, in turn with this one")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "h100-model"),
                   help="cuda: the real CUDA events and stream (the GPU pass), not stand-ins; "
                        "h100-model: on this CPU, the host share the first H100 would show at "
                        "xlarge's and deep40's steps, every CUDA call charged at its cost there")
    a = p.parse_args(argv)
    if a.device == "h100-model":
        return h100_model_main(a)
    steps = 30 if a.quick else a.steps
    rounds = 1 if a.quick else 3
    sampled_steps = 64 if a.quick else 1536
    warmup = 64 if a.quick else 512  # (the sampled steps': --quick's period need not settle)
    if a.device == "cuda" and not a.quick:  # (the GPU pass: within 45 s; the first ran past 60)
        steps, rounds, sampled_steps = min(steps, 200), 2, 512
    import torch
    torch.set_num_threads(1)
    from ranks.core import instrument
    from ranks.builtin import strategies
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("p7_hook_cost: --device cuda, but CUDA is not available here", file=sys.stderr)
        return 2
    layers, width = 40, 16
    old = None if a.quick else load_old(a.vs)  # (--quick: that it runs; no comparison)
    # one mark (record + give back), the unit of the hook path's cost
    import timeit
    clk = (instrument.CudaClock(torch.device("cuda", 0)) if cuda else
           instrument.CudaClock("cuda:0", torch_cuda=stand_in_cuda(), host_ns=time.monotonic_ns))
    marks = 2000 if a.quick else 20000
    mark_us = min(timeit.repeat(lambda: clk.release(clk.mark()), number=marks, repeat=5)) / marks * 1e6
    rows = []
    for rnd in range(rounds):  # new and old in turn
        rows.append(("now", *measure(instrument, strategies, steps, layers, width, cuda)))
        if old is not None:
            rows.append((a.vs, *measure(*old, steps, layers, width, cuda)))
    how = "real CUDA events" if cuda else "CUDA calls by stand-ins of torch.cuda's Python shape"
    print(f"P7 host cost of the hook path: {layers} blocks (Linear {width}x{width} + ReLU), batch 1, "
          f"{how}, {steps} steps x {rounds} rounds, torch {torch.__version__}; one mark {mark_us:.2f} µs")
    now = statistics.median(r[1] for r in rows if r[0] == "now")
    floor = statistics.median(r[2] for r in rows if r[0] == "now")
    res = statistics.median(r[3] for r in rows if r[0] == "now")
    plain_us = statistics.median(r[4] for r in rows if r[0] == "now")
    print(f"  now:        {now:6.2f} µs per layer per step on the training thread "
          f"(rounds: {', '.join(f'{r[1]:.2f}' for r in rows if r[0] == 'now')}); "
          f"resolving a step on the sender thread: {res:.0f} µs")
    print(f"  of which PyTorch's dispatch of the same hooks doing nothing: {floor:.2f} µs "
          f"(a post-accumulate-grad hook per layer, one node pre-hook a step); ddptui's own "
          f"work: {now - floor:.2f} µs")
    if old is not None:
        before = statistics.median(r[1] for r in rows if r[0] == a.vs)
        print(f"  at {a.vs}:    {before:6.2f} µs per layer per step, resolution included "
              f"(rounds: {', '.join(f'{r[1]:.2f}' for r in rows if r[0] == a.vs)}); "
              f"now / then = {now / before:.2f}")
    # the share of the step: ddptui's host time on the training thread over the step's length,
    # here (a step of tiny layers: the worst case) and at the lengths of real steps
    per_step = now * layers
    print(f"  host share of the step: {per_step:.0f} µs a step = {100 * per_step / plain_us:.1f} % of "
          f"this {plain_us:.0f} µs step of {layers} tiny layers; at {layers} layers a step of 10 ms: "
          f"{per_step / 100:.2f} %, 100 ms: {per_step / 1000:.3f} % (goal <= 1 %)")
    # xlarge on 8 GPUs: 8 layers and ~4 DDP buckets (an issue mark and an end mark each)
    est = 8 * now + 4 * 2 * mark_us
    print(f"  estimate: xlarge (8 layers, ~4 DDP buckets) adds ~{est:.0f} µs of host time per "
          f"step: P1 at a 1 ms step <= {1 + est / 1000:.3f} if the host is the critical path "
          f"(goal on GPU 1.01; measured by the GPU pass); a share of {est / 10:.2f} % of that step")
    if hasattr(instrument, "LAYER_SHARE"):  # layer marks on a sample of steps
        old_s = load_old(a.share_vs) if a.share_vs else None
        got, got_old = [], []
        for _ in range(rounds):  # (with --share-vs: the two in turn)
            got.append(measure_sampled(instrument, strategies, sampled_steps, layers, width, cuda, warmup))
            if old_s is not None:
                got_old.append(measure_sampled(*old_s, sampled_steps, layers, width, cuda, warmup))
        share = statistics.median(g[0] for g in got)
        every, un, mk, p0 = got[-1][1], statistics.median(g[2] for g in got), \
            statistics.median(g[3] for g in got), statistics.median(g[4] for g in got)
        nothing = statistics.median(g[5] for g in got)
        print(f"  with layer marks on a sample of steps (as a run makes them): layers marked 1 step in "
              f"{every}; a step without layer marks {un:.1f} µs more than plain (the same calls doing "
              f"nothing: {nothing:.1f} µs, {100 * nothing / p0:.2f} % of the step), a marked one {mk:.0f} µs; "
              f"host share of this {p0:.0f} µs step {share:.2f} % (rounds: "
              f"{', '.join(f'{g[0]:.2f}' for g in got)}); the share is 1 % from steps of "
              f"{((every - 1) * un + mk) / every / 0.01 / 1000:.1f} ms")
        if got_old:
            print(f"  at {a.share_vs}, in turn: a step without layer marks "
                  f"{statistics.median(g[2] for g in got_old):.1f} µs more than plain, a marked one "
                  f"{statistics.median(g[3] for g in got_old):.0f} µs (1 step in {got_old[-1][1]}); share "
                  f"{statistics.median(g[0] for g in got_old):.2f} % (rounds: "
                  f"{', '.join(f'{g[0]:.2f}' for g in got_old)})")
        print(result_line("P7", "sampled_share", "pct_of_step", share, "<=", 100 * instrument.LAYER_SHARE))
    ho = measure_handoff(100 if a.quick else 1500)
    print("  handing a step to the sender thread (a waiting sender, 1 ms steps): " + "; ".join(
        f"{k} median {m:.2f} µs, mean {mu:.2f} µs" for k, (m, mu) in ho.items()))
    print(f"P7 own_cost us_per_layer_above_dispatch={now - floor:.3f} goal<=2 "
          f"{'OK' if now - floor <= 2 else 'MISS'}")
    print(result_line("P7", "hook_cost", "us_per_layer", now, "<=", 3.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
