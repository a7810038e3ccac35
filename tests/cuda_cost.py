"""The CUDA cost model: a stand-in for `torch.cuda` of torch.cuda's Python shape (torch.cuda.Event
a Python subclass of a C class, torch.cuda.current_stream a Python function building a Stream)
whose C calls charge the host what the first H100 measured them to cost
(benchmarks/h100_costs.json), by spinning, and count themselves. With it, ddptui's CUDA path
(CudaClock, Recorder, the layer hooks) runs on a CPU at the host cost it has on that GPU:
`benchmarks/p7_hook_cost.py --device h100-model` and the tests that hold ddptui to its share of
a GPU step.

`charged_cuda(costs)`: costs in µs by call (`record`, `query`, `elapsed_time`,
`current_stream`, `wait`); `h100()`: the measured, derived and assumed figures by name;
`free_cuda()`: the same shape charging nothing (P7's CPU figure)."""
from __future__ import annotations

import json
import operator
import os
import time
from collections import Counter

COSTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                     "h100_costs.json")


def h100() -> dict[str, float]:
    """The first H100's figures: {name: value} (µs; steps_ms and buckets by model)."""
    with open(COSTS) as f:
        doc = json.load(f)
    out: dict = {}
    for k, v in doc.items():
        if isinstance(v, dict) and "value" in v:
            out[k[:-3] if k.endswith("_us") else k] = float(v["value"])
        elif isinstance(v, dict):
            out[k] = {m: x for m, x in v.items() if m not in ("how", "source")}
    return out


def _spinner(us: float):
    """A call that holds the host for `us` µs (0: a builtin call, nothing more)."""
    if us <= 0:
        return None
    ns = int(us * 1000)
    pc = time.perf_counter_ns

    def spin():
        t = pc() + ns
        while pc() < t:
            pass
    return spin


def charged_cuda(costs: dict[str, float] | None = None):
    """A torch.cuda stand-in whose C calls charge `costs` (µs) and are counted in `.calls`."""
    costs = costs or {}
    calls: Counter = Counter()
    rec_spin = _spinner(costs.get("record", 0.0))
    query_spin = _spinner(costs.get("query", 0.0))
    el_spin = _spinner(costs.get("elapsed_time", 0.0))
    cur_spin = _spinner(costs.get("current_stream", 0.0))
    wait_spin = _spinner(costs.get("wait", 0.0))
    clock = [0]

    class _CudaEventBase:  # the C class
        __slots__ = ("t",)

        def record(self, stream):  # (its C record: CudaClock calls this one directly)
            calls["record"] += 1
            clock[0] += 1000
            self.t = clock[0]
            if rec_spin is not None:
                rec_spin()

        def query(self):
            calls["query"] += 1
            if query_spin is not None:
                query_spin()
            return True

        def elapsed_time(self, other):
            calls["elapsed_time"] += 1
            if el_spin is not None:
                el_spin()
            return (other.t - self.t) / 1e6

        def synchronize(self):
            calls["synchronize"] += 1

    class Event(_CudaEventBase):
        __slots__ = ()

        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            calls["event_create"] += 1
            self.t = 0

        def record(self, stream=None):  # torch.cuda.Event.record's shape
            if stream is None:
                stream = current_stream()
            super().record(stream)

    class _CudaStreamBase:
        def __init__(self, *a, **kw):
            pass

        def wait_event(self, ev):
            calls["wait"] += 1
            if wait_spin is not None:
                wait_spin()

        def wait_stream(self, other):
            calls["wait"] += 1
            if wait_spin is not None:
                wait_spin()

    class Stream(_CudaStreamBase):
        def __new__(cls, device=None, priority=0, **kwargs):  # torch.cuda.Stream's shape
            return super().__new__(cls)

    def current_stream(device=None):  # torch.cuda.current_stream's shape
        calls["current_stream"] += 1
        if cur_spin is not None:
            cur_spin()
        return Stream(stream_id=0, device_index=0, device_type=1)

    class _Ctx:
        def __init__(self, s):
            pass

        def __enter__(self):
            return None

        def __exit__(self, *a):
            return False

    ns = type("cuda", (), {})()
    ns.Event, ns.Stream, ns.current_stream, ns.stream = Event, Stream, current_stream, _Ctx
    ns._raw_current_stream = (0, 0, 1).__mul__  # torch._C._cuda_getCurrentStream's place: a builtin, a tuple
    ns.calls = calls
    ns.costs = dict(costs)
    operator.index(0)
    return ns


def free_cuda():
    """The same shape, charging nothing: what ddptui's own Python costs around the calls."""
    return charged_cuda({})


def h100_cuda(mark_overhead_us: float = 0.0):
    """Charged as the first H100: a record costs what one mark measured there, less
    `mark_overhead_us` (this CPU's own part of a mark: the pool's pop and push, the call)."""
    c = h100()
    return charged_cuda({"record": max(0.0, c["event_record"] - mark_overhead_us),
                         "query": c["event_query"], "elapsed_time": c["elapsed_time"],
                         "current_stream": c["current_stream"], "wait": c["stream_wait"]})
