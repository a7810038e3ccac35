"""The CUDA cost model: a stand-in for `torch.cuda` of torch.cuda's Python shape (torch.cuda.Event
a Python subclass of a C class, torch.cuda.current_stream a Python function building a Stream)
whose C calls count themselves and cost the host nothing, and what the first H100 measured
each call to cost (benchmarks/h100_costs.json). With it, ddptui's CUDA path (CudaClock,
Recorder, the layer hooks) runs on a CPU, its own Python timed here and each CUDA call it makes
charged at the H100's cost (`charge`): `benchmarks/p7_hook_cost.py --device h100-model`, and
the tests that count what a step costs a GPU's host (tests/test_h100_model.py).

`counted_cuda()`: the stand-in, its calls in `.calls`; `h100()`: the figures by name;
`charge(calls)`: µs a step's calls cost the H100's host."""
from __future__ import annotations

import json
import os
from collections import Counter

COSTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                     "h100_costs.json")

# a counted call -> its figure in h100_costs.json (elapsed_time: the sender thread's, apart)
CHARGED = {"record": "event_record", "query": "event_query", "current_stream": "current_stream",
           "wait": "stream_wait"}


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


def charge(calls: dict, costs: dict | None = None, mark_overhead_us: float = 0.0) -> float:
    """µs the H100's host takes for `calls` ({call: count}) on the training thread: each at its
    measured (or assumed) cost; a record less `mark_overhead_us`, this CPU's own part of a mark
    (the pool's pop and push, the call), timed with the rest of ddptui's Python."""
    costs = costs or h100()
    us = 0.0
    for call, name in CHARGED.items():
        each = costs[name] - (mark_overhead_us if call == "record" else 0.0)
        us += calls.get(call, 0) * max(0.0, each)
    return us


def counted_cuda():
    """A torch.cuda stand-in whose C calls are counted in `.calls` and cost nothing."""
    calls: Counter = Counter()
    clock = [0]

    class _CudaEventBase:  # the C class
        __slots__ = ("t",)

        def record(self, stream):  # (its C record: CudaClock calls this one directly)
            calls["record"] += 1
            clock[0] += 1000
            self.t = clock[0]

        def query(self):
            calls["query"] += 1
            return True

        def elapsed_time(self, other):
            calls["elapsed_time"] += 1
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

        def wait_stream(self, other):
            calls["wait"] += 1

    class Stream(_CudaStreamBase):
        def __new__(cls, device=None, priority=0, **kwargs):  # torch.cuda.Stream's shape
            return super().__new__(cls)

    def current_stream(device=None):  # torch.cuda.current_stream's shape
        calls["current_stream"] += 1
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
    return ns
