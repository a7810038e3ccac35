"""A stand-in for `torch.cuda` that keeps the semantics ddptui's CUDA path depends on, for tests
without a GPU (CudaClock, Recorder, Straggle take it through their `torch_cuda` seam):

- time: one clock for host and GPU (ns), advanced by host reads (`read_ns` each) and by the
  host waiting on the GPU (`synchronize`);
- submission latency (`launch_ns`): what the host enqueues reaches the GPU that much later;
- streams run their work in order: work enqueued on a stream starts when the stream is free
  and the submission has reached the GPU; an event recorded on a stream is stamped when the
  stream reaches it (`launch_ns` after the host recorded it on an idle stream, later behind
  work in flight: an idle stream stamps the HOST's moment, not the end of the work before);
- `compute(ns)`: a kernel on the current stream (the default stream queues the training's
  compute, as torch's default stream does); `wait_stream`, `wait_event` and `stream(s)` (a
  context: the current stream, per thread) as torch.cuda's;
- `Stream(device, priority)` hands out pool streams in turn, as c10's CUDA stream pools do:
  32 of the default (low) priority, the pool a CUDA future's `then` callbacks and the
  backends' internal streams draw from, and 32 of high priority, which nothing else here
  takes;
- the current stream is per thread (the default stream unless a test sets another);
- `elapsed_time` between two events raises, as CUDA's does, while either is not yet stamped
  (an event recorded on a stream that has not reached it);
- `_sleep(cycles)` runs at the SMs' actual clock (`sm_khz`), whatever the nominal
  `clock_rate` says;
- `timeslice=(period_ns, ours_ns)`: another process's context shares the GPU, time-sliced
  (two ranks on one GPU without MPS): this context runs only in the first `ours_ns` of every
  `period_ns`; work and events that reach the GPU outside its slice wait for the next one
  (an event is stamped when this context gets the GPU back, however idle its stream).
"""
from __future__ import annotations

import struct
import threading

POOL = 32


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class SimStream:
    def __init__(self, sim: "SimCuda", name: str):
        self.sim, self.name = sim, name
        self.tail = 0  # when the work enqueued so far is done

    def enqueue(self, dur_ns: int) -> int:
        """Work of dur_ns on this stream, enqueued now; returns when it ends."""
        start = self.sim.slot(max(self.tail, self.sim.now + self.sim.launch_ns))
        self.tail = start + dur_ns
        return self.tail

    def wait_event(self, ev) -> None:  # (an event of SimCuda.Event)
        self.tail = max(self.tail, ev.t)

    def wait_stream(self, other: "SimStream") -> None:
        """What torch.cuda.Stream.wait_stream does: an event recorded on `other` now, waited on."""
        self.tail = max(self.tail, other.tail, self.sim.now + self.sim.launch_ns)

    def __repr__(self) -> str:
        return f"<SimStream {self.name}>"


class SimCuda:
    def __init__(self, read_ns: int = 200, sm_khz: int = 1_200_000, clock_rate_khz: int = 1_980_000,
                 launch_ns: int = 0, timeslice: tuple[int, int] | None = None):
        self.now = 1_000_000_000
        self.timeslice = timeslice
        self.read_ns = read_ns
        self.launch_ns = launch_ns
        self.sm_khz = sm_khz
        self.clock_rate_khz = clock_rate_khz
        self.default = SimStream(self, "default")
        self.low = [SimStream(self, f"low{i}") for i in range(POOL)]
        self.high = [SimStream(self, f"high{i}") for i in range(POOL)]
        self._next = {"low": 0, "high": 0}
        self._tls = threading.local()
        self.records = 0  # events recorded
        self.current_calls = 0  # current_stream() lookups
        self.created = 0
        sim = self

        class Event:
            def __init__(self, enable_timing=True):
                sim.created += 1
                self.t = None

            def record(self, stream=None):
                sim.records += 1
                stream = stream if stream is not None else sim.current_stream(None)
                # stamped when the stream reaches it, the submission latency after the host
                self.t = sim.slot(max(stream.tail, sim.now + sim.launch_ns))

            def query(self):
                return self.t is not None and sim.now >= self.t

            def synchronize(self):
                sim.now = max(sim.now, self.t)

            def elapsed_time(self, other):
                # cudaEventElapsedTime: cudaErrorNotReady while either is not yet stamped
                if self.t is None or other.t is None or sim.now < max(self.t, other.t):
                    raise RuntimeError("CUDA error: device not ready")
                return f32((other.t - self.t) / 1e6)

        self.Event = Event

    def slot(self, t: int) -> int:
        """When this context can run something that reached the GPU at `t` (time-sliced
        with another context: the start of its next slice, if `t` falls outside one)."""
        if self.timeslice is None:
            return t
        period, ours = self.timeslice
        return t if t % period < ours else (t // period + 1) * period

    # -- torch.cuda's names ------------------------------------------------------------
    def host_ns(self) -> int:
        t = self.now
        self.now += self.read_ns
        return t

    def Stream(self, device=None, priority=0):  # noqa: N802 - the torch.cuda name
        kind = "high" if priority < 0 else "low"
        i = self._next[kind]
        self._next[kind] = i + 1
        return (self.high if kind == "high" else self.low)[i % POOL]

    def current_stream(self, device=None):
        self.current_calls += 1
        return getattr(self._tls, "stream", None) or self.default

    def set_stream(self, stream) -> None:
        self._tls.stream = stream

    def stream(self, stream):
        """torch.cuda.stream(s): `stream` current on this thread inside the context."""
        sim = self

        class _Ctx:
            def __enter__(self):
                self.prev = getattr(sim._tls, "stream", None)
                sim._tls.stream = stream

            def __exit__(self, *exc):
                sim._tls.stream = self.prev
                return False
        return _Ctx()

    def compute(self, ns: int) -> int:
        """A kernel of `ns` on the current stream, launched now; returns when it ends."""
        return self.current_stream(None).enqueue(ns)

    def _sleep(self, cycles: int) -> None:
        self.current_stream(None).enqueue(int(cycles / self.sm_khz * 1e6))

    def get_device_properties(self, device):
        return type("Props", (), {"clock_rate": self.clock_rate_khz})()

    # -- helpers for tests ---------------------------------------------------------------
    def pool_stream(self) -> SimStream:
        """What a CUDA future's `then` callback (or a backend) takes: the next low-priority
        pool stream, in turn."""
        return self.Stream(None, 0)

    def host_work(self, ns: int) -> None:
        self.now += ns


class SimDevice:
    type = "cuda"
    index = 0

    def __str__(self) -> str:
        return "cuda:0"
