"""Timing of layers, AllReduces, optimizer and steps.

Hot path rule: hooks only take a timestamp (CPU) or record a pooled CUDA event (GPU) into
preallocated slots. Turning slots into spans happens later, off the critical path: on CUDA
a step is resolved only once its last event has completed (no per-step synchronize), and the
workers resolve it on the sender thread (`poll(lazy=True)`), not the training thread. On CUDA a
mark records a pooled event on the step's stream, looked up once per step, through the C
method (no Python Stream object per mark), and each moment is marked once (`bwd_end`).

Clocks. Every span ends up in ns of the host's CLOCK_MONOTONIC (one axis for all ranks of a
host). On CPU that is what the hooks read. On CUDA the hooks record events; a step's events
are resolved against that step's own start event (short intervals: float32 `elapsed_time`
keeps sub-µs resolution), and the start event is mapped to host time through `GpuTimeMap`,
a linear fit (offset and drift) of periodic bracketed calibrations taken between steps.

Collectives. Backends differ in how collectives overlap:
- gloo runs async collectives on a small pool of worker threads, several at once; the
  completion callback runs on the thread that ran the work, so a collective starts when it
  was issued or, if later, when the previous collective on the *same thread* ended;
- NCCL runs them one after another on one stream: start = max(ready, previous end).
"""
from __future__ import annotations

import select
import threading
import time
from collections import deque
from functools import partial

from .clock import now_ns
from .spec import MAX_LAYER_EVERY
from .wire import BWD, COMM, FWD, OPT, PASS, PASS_BWD, PASS_FWD, STEP

_get_ident = threading.get_ident


class CpuClock:
    """Host CLOCK_MONOTONIC in ns: shared by every process on the host."""

    cuda = False
    serial_comm = False  # gloo: collectives overlap on the backend's threads
    cal = None  # (no calibration point: ref())

    mark = staticmethod(now_ns)  # (the clock's own call: no Python frame per mark)
    mark_comm_end = mark

    def begin_step(self) -> None:
        pass

    def comm_host_end(self):
        return None  # the drawn end is a host reading already

    def issue_stream(self):
        return None

    def issuing(self, stream):
        return _NULL

    def done(self, tok) -> bool:
        return True

    def ref(self):
        return None

    def resolver(self, start_tok, ref):
        return _identity

    def release(self, tok) -> None:
        pass

    def maybe_calibrate(self) -> None:
        pass

    residual_ns = None


def _identity(tok):
    return tok


class _Null:
    """A reusable do-nothing context (the issue of a collective with no stream of its own)."""

    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class GpuTimeMap:
    """GPU timer -> host CLOCK_MONOTONIC, from bracketed calibrations.

    A calibration point is an event recorded on an idle stream between two host readings
    h0 < h1: the GPU stamped it inside [h0, h1], estimated at the midpoint with an error of at
    most (h1 - h0) / 2. Points are chained on the GPU side by the elapsed time between
    consecutive calibration events (each a short interval: exact enough in float32), so `g`
    (GPU ns since the first point) never suffers float32 rounding however long the run.
    host(g) = a + rate * g is a least-squares fit over the recent low-delay points: the
    offset and the drift (ppm) between the two oscillators, re-estimated at each point.
    """

    WINDOW = 32

    def __init__(self):
        self.points: deque = deque(maxlen=self.WINDOW)  # (g_ns, h_ns, delay_ns)
        # (h_base, a, rate) as one tuple, replaced whole: calibrate() runs on the training
        # thread while the sender resolves steps with it (a reader of separate attributes
        # could take a new offset with an old rate: off by the change in drift times the GPU
        # time since the first point, ~100 µs after hours)
        self.fit = (None, 0.0, 1.0)
        self.residual_ns: int | None = None  # prediction - measurement at the last point

    @property
    def a(self) -> float:
        return self.fit[1]

    @property
    def rate(self) -> float:
        return self.fit[2]

    @property
    def h_base(self):
        return self.fit[0]

    def add(self, g_ns: float, h0: int, h1: int) -> None:
        base, a, rate = self.fit
        if base is None:
            base = h0
        h = (h0 + h1) / 2 - base
        if self.points:
            self.residual_ns = int(round(a + rate * g_ns - h))
        self.points.append((g_ns, h, h1 - h0))
        self.fit = (base, *self._fit(rate))

    def _fit(self, rate: float) -> tuple[float, float]:
        """(a, rate) over the recent low-delay points (`rate`: the one in force)."""
        pts = self.points
        best = min(p[2] for p in pts)
        use = [p for p in pts if p[2] <= 2 * best + 2_000] or list(pts)
        if len(use) < 2 or use[-1][0] - use[0][0] < 1e8:  # under 0.1 s: offset only
            g, h, _ = min(pts, key=lambda p: p[2]) if len(use) < 2 else use[-1]
            return h - rate * g, rate
        n = len(use)
        mg = sum(p[0] for p in use) / n
        mh = sum(p[1] for p in use) / n
        sxx = sum((p[0] - mg) ** 2 for p in use)
        sxy = sum((p[0] - mg) * (p[1] - mh) for p in use)
        rate = sxy / sxx if sxx > 0 else 1.0
        return mh - rate * mg, rate

    def host_ns(self, g_ns: float) -> int:
        base, a, rate = self.fit
        return int(round(base + a + rate * g_ns))


class CalPoint:
    """A calibration event and its place on the chained GPU axis."""

    __slots__ = ("event", "g_ns")

    def __init__(self, event, g_ns: float):
        self.event, self.g_ns = event, g_ns


def _raw_stream_getter(torch_cuda, device):
    """A call returning the current stream's (id, device, type) without building a Python
    Stream (torch._C._cuda_getCurrentStream, which torch.cuda.current_stream wraps; a stand-in's
    `_raw_current_stream`), or None where there is none that answers."""
    raw = getattr(torch_cuda, "_raw_current_stream", None)
    if raw is None:
        try:
            import torch
            if torch_cuda is torch.cuda:
                raw = torch._C._cuda_getCurrentStream
        except (ImportError, AttributeError):
            return None
    if raw is None:
        return None
    index = device if isinstance(device, int) else getattr(device, "index", None)
    if not isinstance(index, int):  # ("cuda:1", or a device without an index: the current one)
        text = str(device)
        if ":" in text:
            index = int(text.split(":")[-1])
        else:
            current = getattr(torch_cuda, "current_device", None)
            index = current() if current is not None else 0
    try:
        raw(index)
    except Exception:  # (an unknown shape: the lookup every step, as before)
        return None
    return partial(raw, index)


class CudaClock:
    """CUDA events on the current stream, mapped to host time (see GpuTimeMap).

    `comm_on_host`: gloo with CUDA tensors runs the collective on the host, on gloo's worker
    threads, then copies the result back to the GPU. Its end is still an event (see
    `mark_comm_end`); a host reading of when the gloo thread was done is kept beside it, only to
    chain the next start on that thread (`comm_starts`). With NCCL the callback runs at enqueue
    on a stream made to wait for the NCCL work, and an event recorded on *that* stream (of our
    device) marks the end.

    gloo with CUDA tensors completes its future (a CPU future: no CUDA events) on its worker
    thread, whose current stream is the device's default stream, after making the stream that
    was current at the issue wait for the copy back (ProcessGroupGlooCuda.cpp,
    AsyncAllreduceCUDAHostWork::synchronize). An event recorded on the default stream there
    waits for every kernel queued on it by then: a bias's AllReduce ending mid-backward would be
    drawn after the backward queued behind it. So each such collective is issued with a stream
    of its own current (`issue_stream`, `issuing`: it waits for the training stream, then gloo
    makes it wait for the copy back and nothing else); its end is an event on that stream, and
    the training stream is made to wait for that event (what gloo would have done to it).

    `torch_cuda` / `host_ns` are seams: tests pass a fake GPU timer (drift, float32 rounding).
    """

    cuda = True

    def __init__(self, device, comm_on_host: bool = False, torch_cuda=None,
                 host_ns=now_ns, calib_period_s: float = 1.0, hook_lag_ns: int | None = None):
        if torch_cuda is None:
            import torch
            torch_cuda = torch.cuda
        self.tc = torch_cuda
        self.device = device
        self.host_ns = host_ns
        self.comm_on_host = comm_on_host
        self.serial_comm = not comm_on_host
        self.pool: list = []
        self.allocated = 0  # events ever created for the pool (the GPU pass checks it stays flat)
        self.period_ns = int(calib_period_s * 1e9)
        self.map = GpuTimeMap()
        self.cal: CalPoint | None = None
        self.next_cal = 0
        # The calibration stream must be idle whenever it is used. torch.cuda.Stream(device)
        # with the default priority hands out the low-priority pool's streams in turn, the
        # pool a CUDA future's `then` callbacks (and ProcessGroupNCCL's and gloo's copy
        # streams) draw from: a calibration could land behind an AllReduce in flight. A
        # high-priority stream comes from a separate pool none of them use.
        self.side = torch_cuda.Stream(device, priority=-1)
        # The training stream, looked up once per step (begin_step) rather than per mark:
        # torch.cuda.current_stream builds a Python Stream object under a device guard, the
        # largest part of a mark's host cost. The autograd engine runs backward on the stream
        # of the forward ops, so the same stream serves forward, backward and the optimizer.
        self.stream = torch_cuda.current_stream(device)
        # torch.cuda.current_stream's C call, without the Python Stream it builds: the stream
        # is looked up again only when this says it changed (None: looked up every step)
        self._raw_stream = _raw_stream_getter(torch_cuda, device)
        self._stream_key = None
        # the host's time from a gradient's accumulation to the post-accumulate hook's mark
        # (measured here on CPU tensors: PyTorch's hook dispatch on this machine); see idle_end
        self.hook_lag_ns = measure_hook_lag() if hook_lag_ns is None else int(hook_lag_ns)
        self._issue: list = []  # gloo with CUDA tensors: streams a collective is issued on
        self._issue_i = 0
        ev_cls = torch_cuda.Event
        # Event.record(stream) is a Python wrapper over the C method: call the C one directly
        base = getattr(ev_cls, "__mro__", (ev_cls,))
        self._record = next((c.__dict__["record"] for c in base[1:] if "record" in c.__dict__),
                            ev_cls.record)
        self.calibrate()

    # -- hot path -------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a step's first mark, on the training thread: the stream it runs on."""
        raw = self._raw_stream
        if raw is not None:
            key = raw()
            if key == self._stream_key:
                return
            self._stream_key = key
        self.stream = self.tc.current_stream(self.device)

    def _event(self):
        try:
            return self.pool.pop()
        except IndexError:  # pool empty (also safe against a backend thread racing us)
            self.allocated += 1
            return self.tc.Event(enable_timing=True)

    def mark(self):
        try:
            ev = self.pool.pop()
        except IndexError:
            ev = self._event()
        self._record(ev, self.stream)
        return ev

    ISSUE_STREAMS = 8  # collectives in flight at once before two share an issue stream

    def issue_stream(self):
        """gloo with CUDA tensors: the stream the next collective is issued on (see the class
        docstring); None otherwise (NCCL's future carries CUDA events: its callbacks run on a
        stream that waits for the NCCL work alone)."""
        if not self.comm_on_host:
            return None
        if len(self._issue) < self.ISSUE_STREAMS:
            self._issue.append(self.tc.Stream(self.device))
            return self._issue[-1]
        self._issue_i = i = (self._issue_i + 1) % self.ISSUE_STREAMS
        return self._issue[i]

    def issuing(self, stream):
        """A context around the backend call that issues a collective: with `stream` current,
        made to wait for the training stream first (the copy to the host reads the gradient)."""
        if stream is None:
            return _NULL
        stream.wait_stream(self.stream)
        return self.tc.stream(stream)

    def mark_comm_end(self, stream=None):
        """The end of a collective, from its completion callback: an event on `stream` (the
        collective's issue stream, gloo with CUDA tensors) or else on the *current* stream of
        our device, whatever thread this is. NCCL: the callback's stream waits on the NCCL
        work. gloo with CUDA tensors: gloo reduces on the host and copies the result back to
        the GPU asynchronously, and makes the issue stream wait for that copy before its
        future completes: an event there is stamped once the copy has landed, whatever
        compute is queued on the training stream. The training stream then waits for it, as
        gloo would have made it wait. (Without an issue stream, the current stream on gloo's
        thread is the default one: late by the compute queued there.)"""
        ev = self._event()
        if stream is None:
            self._record(ev, self.tc.current_stream(self.device))
        else:
            self._record(ev, stream)
            self.stream.wait_event(ev)
        return ev

    def comm_host_end(self):
        """gloo with CUDA tensors: when the backend thread was done with the collective (a
        host reading), used only to chain the next collective's start on that thread."""
        return self.host_ns() if self.comm_on_host else None

    def done(self, tok) -> bool:
        return type(tok) is int or tok.query()

    def release(self, tok) -> None:
        if type(tok) is not int:
            self.pool.append(tok)

    def ref(self) -> CalPoint:
        return self.cal

    # -- calibration (between steps, never inside one) ------------------------------
    @property
    def residual_ns(self):
        return self.map.residual_ns

    def maybe_calibrate(self) -> None:
        if self.host_ns() >= self.next_cal:
            self.calibrate()

    SPIN_NS = 200_000  # an event on an idle stream is stamped within µs; give up after this

    def _bracket(self, block: bool = False):
        ev = self.tc.Event(enable_timing=True)
        h0 = self.host_ns()
        ev.record(self.side)
        give_up = h0 + self.SPIN_NS
        while not ev.query():
            if self.host_ns() > give_up:  # not stamped at once: no use as a calibration point
                if not block:
                    return None
                ev.synchronize()  # the first point, before training: a wide bracket will do
                break
        return ev, h0, self.host_ns()

    def calibrate(self, samples: int = 3) -> None:
        best = None
        for i in range(samples):
            got = self._bracket(block=self.cal is None and i == samples - 1 and best is None)
            if got is not None and (best is None or got[2] - got[1] < best[2] - best[1]):
                best = got
        if best is None:  # the side stream was not idle (a GPU shared with other work):
            self.next_cal = self.host_ns() + 10_000_000  # try again a little later, never block
            return
        ev, h0, h1 = best
        g = 0.0 if self.cal is None else self.cal.g_ns + self.cal.event.elapsed_time(ev) * 1e6
        self.map.add(g, h0, h1)
        self.cal = CalPoint(ev, g)
        # the drift is unknown until two points are apart: the first ones come sooner
        n = len(self.map.points)
        self.next_cal = h1 + min(self.period_ns, 50_000_000 << min(n, 10))

    def idle_end(self, t_ns: int, host_ns: int) -> int:
        """A backward layer's end, drawn from its mark (`t_ns`, the event mapped to host time)
        and the host's reading just before the mark (`host_ns`). An event recorded on an idle
        stream is stamped when the host records it, not when the work before it ended: the
        mark comes after the hook's dispatch (a host-bound step: a starved GPU). Stamped within
        `idle_window_ns` of the host's reading, the stream was idle: the work ended before the
        host got there, drawn `hook_lag_ns` earlier. On a busy stream the event waited for the
        work: its stamp is the end."""
        if t_ns - host_ns <= self.idle_window_ns():
            return t_ns - self.hook_lag_ns
        return t_ns

    def idle_window_ns(self) -> int:
        """How far after the host's reading an event on an idle stream is stamped, as mapped:
        the calibration's half-bracket (its error) and 2 µs for the record call itself."""
        pts = tuple(self.map.points)  # (a copy in one call: calibrate() appends on the training thread)
        return 2_000 + (min(p[2] for p in pts) // 2 if pts else 0)

    # -- off the hot path -----------------------------------------------------------
    def resolver(self, start_tok, ref: CalPoint):
        """tok -> host ns for the events of one step: each against the step's start event."""
        base, a, rate = self.map.fit  # (one fit for the whole step, whatever calibrate() does)
        g0 = ref.g_ns + ref.event.elapsed_time(start_tok) * 1e6
        h0 = int(round(base + a + rate * g0))

        def ns(tok):
            if type(tok) is int:
                return tok
            if tok is start_tok:
                return h0
            return h0 + int(round(start_tok.elapsed_time(tok) * 1e6 * rate))
        return ns


def measure_hook_lag(samples: int = 48) -> int:
    """The host's time, in ns, from a gradient's accumulation to a post-accumulate hook's first
    line (median): on CPU tensors, from a tensor hook just before the accumulation to the
    post-accumulate hook after it. What an end mark on an idle stream comes late by."""
    import torch
    w = torch.zeros(4, requires_grad=True)
    w.grad = torch.zeros(4)
    t = [0, 0]

    def pre(g):
        t[0] = now_ns()

    def post(p):
        t[1] = now_ns()
    w.register_hook(pre)
    w.register_post_accumulate_grad_hook(post)
    got = []
    for _ in range(samples):
        (w * 1.0).sum().backward()
        got.append(t[1] - t[0])
    got.sort()
    return max(0, min(got[len(got) // 2], 50_000))


NO_COMMS = ()  # a step's collectives before its first (StepRecord)


class StepRecord:
    """Slots for one (strategy, step) on one rank."""

    __slots__ = ("strategy", "step", "n_layers", "step_start", "step_end", "fwd_s", "fwd_e",
                 "bwd_s", "bwd_e", "bwd_h", "bwd_n", "comm_idx", "comm_kind", "comm_ready", "comm_end",
                 "comm_hend", "comm_thr", "comm_strm", "opt_s", "opt_e", "ref", "synced", "layers",
                 "host0")

    def __init__(self, strategy: str, step: int, n_layers: int, layers: bool = True):
        # (on the training thread at every step's begin: as few statements as it takes)
        self.strategy, self.step, self.n_layers = strategy, step, n_layers
        # its layers marked one by one; False: the forward's and backward's start and end only
        # (layer marks on a sample of steps, Recorder.begin), resolved as two PASS spans
        self.layers = layers
        self.host0 = 0  # host clock at begin (the step's length on the host, for the sampling)
        self.step_start = self.step_end = self.opt_s = self.opt_e = self.ref = None
        # per layer; a step whose layers are not marked holds one slot: [0] the first layer's
        # (the forward's start, the backward's end), [-1] the last's (the forward's end, the
        # backward's start), the same slot
        n = n_layers if layers else 1
        self.fwd_s, self.fwd_e, self.bwd_s, self.bwd_e = [None] * n, [None] * n, [None] * n, [None] * n
        self.bwd_h = [None] * n  # host reading just before each end mark (CUDA: idle_end)
        self.bwd_n = [0] * n  # bwd_end calls so far this step
        # the collectives, in issue order: COMM (a gradient AllReduce) or COLL (any other);
        # gloo with CUDA tensors: host ends (comm_hend, to chain starts) and issue streams.
        # Lists from the first collective (Recorder.comm_issue), an empty tuple until then
        self.comm_idx = self.comm_kind = self.comm_ready = self.comm_end = self.comm_hend = \
            self.comm_thr = self.comm_strm = NO_COMMS
        self.synced = 0  # gradient synchronisations issued (COMM spans, FSDP's reduce-scatters)


def comm_starts(ready: list[int], end: list[int], thr: list, serial: bool,
                free: list | None = None) -> list[int]:
    """When each collective (in issue order) started running.

    serial (one stream, NCCL): when it was ready and the previous one had ended.
    threads (gloo): when it was ready and the previous collective that ran on the same backend
    thread (the thread its completion callback ran on) had ended: gloo's worker threads take
    queued works first come, first served, and run them to completion.
    `free`: when the backend thread was done with each collective, where that differs from
    its drawn end (gloo with CUDA tensors: the thread is free once the copy back to the GPU
    is queued; the collective ends, drawn, when that copy lands)."""
    if serial:  # as if one thread ran them all
        thr = [None] * len(ready)
    if free is None:
        free = end
    out = []
    last: dict = {}
    for r, e, t, f in zip(ready, end, thr, free):
        out.append(min(max(r, last.get(t, 0)), e))
        last[t] = max(last.get(t, 0), f)
    return out


# The sender thread resolves a step while the training thread runs the next. Each CUDA mark
# releases the GIL (Event.record); a thread that wants it back waits until the holder lets go,
# which a pure-Python loop does only at the switch interval (5 ms): a hook would wait for the
# sender's whole stretch. Resolving, the sender lets go every YIELD_EVERY events (~20 µs)
# for a system call that returns at once: cheap, but a hand-over only when the waiting thread
# wakes before the sender takes the GIL again (measured: 44-90 of 1,500 let-gos, and now and
# then none in 57 ms). So at least every HANDOFF_NS it sleeps instead (time.sleep(0): the
# kernel runs the waiting thread, ~70 µs), which hands the GIL over: a hook waits at most
# about that long, for ~14 % more of the sender's own time (off the training thread).
YIELD_EVERY = 16
HANDOFF_NS = 500_000
_last_handoff = [0]


def letting_go(resolve, every: int):
    """`resolve` (a mark -> ns), letting go of the GIL every `every` calls (0: never): off the
    training thread, a hook waiting for the GIL gets it within a few marks, not a switch
    interval."""
    if not every:
        return resolve
    count = [0]

    def ns(tok):
        count[0] += 1
        if count[0] % every == 0:
            _let_go()
        return resolve(tok)
    return ns


def _let_go() -> None:
    t = now_ns()
    if t - _last_handoff[0] >= HANDOFF_NS:
        time.sleep(0)
        _last_handoff[0] = now_ns()
    else:
        select.select((), (), (), 0)


# Layer marks on a sample of steps. A marked layer costs the training thread PyTorch's dispatch
# of a hook and two marks a step; on a step of ~1 ms (a host-bound GPU step) that is several
# per cent. Where a strategy's hooks can be switched off (attach_layer_hooks' LayerMarks), its
# layers are marked on one step in `every` (a power of two, the step number a multiple of
# it: every rank marks the same steps), as few as keep that cost within MARKS_SHARE of the
# step: half of LAYER_SHARE, ddptui's whole host time a step, the other half the steps' own
# marks and bookkeeping, made every step. The other steps mark the forward's and backward's
# start and end (PASS spans), and every collective as always.
LAYER_SHARE = 0.005
# Steps whose layers are not marked (short ones) are handed over by Recorder.poll in fours: a
# poll per step was a tenth of such a step's cost to the training thread (the app is a few ms
# later to see them)
POLL_BATCH = 4
SPARE = 8  # such steps' records kept for reuse once resolved (Recorder._spare)
MARKS_SHARE = LAYER_SHARE / 2
MAX_EVERY = MAX_LAYER_EVERY
# a marked layer of a sampled model: a pre-hook registered in its forward and called in its
# backward (ranks.strategies.LayerMarks; ~4 µs here, where a hook registered once costs
# ~1.1-1.4 µs of PyTorch's call but ~0.5 µs on every step ever after, marked or not). The
# period's first guess: once layers are sampled, what a marked step takes over the others
# (Recorder._marked_ns) is the cost where it is more (P7: ~5-8 µs a layer here, by the minute)
LAYER_HOOK_NS = 4_000


def every_for(cost_ns: float, step_ns: float, cur: int = 1) -> int:
    """The sampling period that keeps `cost_ns` of layer marks a marked step within
    MARKS_SHARE of a step of `step_ns`: a power of two up to MAX_EVERY. It comes down from
    `cur` only when a third of it would do (no flapping at a boundary)."""
    want = cost_ns / (MARKS_SHARE * max(step_ns, 1.0))
    every = 1
    while every < want and every < MAX_EVERY:
        every *= 2
    if every < cur and want > cur / 3:
        every = cur
    return every


class _GivenBack(list):
    """A dropped step's collective ends: an end marked after the drop (Recorder.comm_done, on
    the backend's thread) goes straight back to the pool."""

    __slots__ = ("release",)

    def __init__(self, ends, release):
        super().__init__(ends)
        self.release = release

    def __setitem__(self, i, tok) -> None:
        self.release(tok)


class Pending:
    """A finished step not yet turned into spans (Recorder.poll(lazy=True)): calling it
    resolves it; `n_spans` is how many spans it holds (counted if its frame is dropped)."""

    __slots__ = ("rec", "r")

    def __init__(self, rec: "Recorder", r: StepRecord):
        self.rec, self.r = rec, r

    def __call__(self) -> tuple:
        return self.rec._resolve(self.r, yield_every=YIELD_EVERY)

    def drop(self) -> None:
        """Its frame is dropped (a full queue): its events go back to the pool unresolved (a
        pending event may be recorded again; nothing will read this one), and so does the end
        of a collective still running (its callback comes later: `_GivenBack`)."""
        if self.rec.clock.cuda:
            self.rec._give_back(self.r)

    @property
    def n_spans(self) -> int:
        r = self.r
        n = 1 + len(r.comm_idx) + (r.opt_s is not None and r.opt_e is not None)
        n += len(getattr(r, "micro", None) or ())  # (a user's step: its earlier micro-steps' spans)
        if not r.layers:  # (the forward and backward as a whole: PASS spans)
            return n + (r.fwd_s[0] is not None) + (r.bwd_e[0] is not None)
        n += sum(1 for a, b in zip(r.fwd_s, r.fwd_e) if a is not None and b is not None)
        n += sum(1 for a, b in zip(r.bwd_s, r.bwd_e) if a is not None and b is not None)
        return n


class Recorder:
    """One per rank. Strategies call the mark_* methods from hooks; the worker calls
    begin/end around each step and poll() to collect finished steps as span tuples."""

    def __init__(self, clock, n_layers: int, every: int | None = None):
        self.clock = clock
        self.n_layers = n_layers
        self.cur: StepRecord | None = None
        self.pending: list[StepRecord] = []
        self.straggle = None  # strategies.Straggle when a delay is injected (the layer hooks ask)
        # CUDA: a layer's backward end is re-marked for each parameter; hand the superseded
        # event back to the pool at once (the pool would otherwise grow every step)
        self._recycle = clock.release if clock.cuda else None
        # the host clock of the end marks' readings (CUDA: CudaClock.idle_end); the clock's own
        # where it has one (a seam in tests)
        self.host_ns = getattr(clock, "host_ns", now_ns) if clock.cuda else now_ns
        self._bwd_calls: list = [None] * n_layers  # bwd_end calls per layer in the last step
        # layer marks on a sample of steps: strategy -> its marks' switch (on: bool), where
        # they can be switched (attach_layer_hooks); `every`: a fixed period (1: every step),
        # None: as MARKS_SHARE asks
        self.switches: dict = {}
        self.every = every
        self._every: dict[str, int] = {}  # strategy -> the period in force
        self._step_ns: dict[str, float] = {}  # strategy -> its steps' host time (moving average)
        # strategy -> its last marked steps' host times, while its layers are sampled (their
        # median: one preempted marked step does not double the period)
        self._marked_ns: dict[str, deque] = {}
        self._mark_ns: float | None = None  # one mark's host cost (measured once)
        # steps whose layers were not marked, resolved (on the sender thread), nothing else
        # holding them: begin takes one rather than making a record (SPARE at most)
        self._spare: list[StepRecord] = []

    def wanted_every(self, strategy: str) -> int:
        """The period this rank would mark `strategy`'s layers at (1: every step)."""
        if self.every is not None:
            return self.every
        step_ns = self._step_ns.get(strategy)
        if step_ns is None or strategy not in self.switches or self._mark_ns is None:
            return 1
        cost = self.n_layers * (2 * self._mark_ns + LAYER_HOOK_NS)
        marked = self._marked_ns.get(strategy)
        if marked and len(marked) >= 3:  # (what marked steps have been seen to take over the others)
            cost = max(cost, sorted(marked)[len(marked) // 2] - step_ns)
        return every_for(cost, step_ns, self._every.get(strategy, 1))

    def layer_every(self, strategy: str) -> int:
        """The period in force for `strategy` (1: every step's layers marked)."""
        return self._every.get(strategy, 1)

    # -- hot path -------------------------------------------------------------------
    def begin(self, strategy: str, step: int, every: int | None = None) -> None:
        """A step starts. `every`: the period its layers are marked at, as all ranks agreed
        (the worker's control collective); None: this rank's own (`wanted_every`)."""
        switch = self.switches.get(strategy)
        layers = True
        if switch is not None:
            cur = self._every.get(strategy)
            if every is None:  # (the period changes where one ends: asked for there only)
                every = cur if cur is not None and step % cur else self.wanted_every(strategy)
            if every != cur or every == 1:
                self._every[strategy] = every
                # the hooks registered once while every step is marked and the steps are
                # timed (until then, and while sampled, a marked step registers its own)
                switch(every == 1 and (self.every == 1 or strategy in self._step_ns))
            layers = step % every == 0
        spare = self._spare
        if layers or not spare:
            c = StepRecord(strategy, step, self.n_layers, layers)
        else:  # (a record given back by the sender thread, made blank: no object to make)
            c = spare.pop()
            c.strategy, c.step = strategy, step
            c.step_end = c.opt_s = c.opt_e = c.fwd_s[0] = c.fwd_e[0] = c.bwd_s[0] = c.bwd_e[0] = \
                c.bwd_h[0] = None
            if c.comm_idx is not NO_COMMS:
                c.comm_idx = c.comm_kind = c.comm_ready = c.comm_end = c.comm_hend = \
                    c.comm_thr = c.comm_strm = NO_COMMS
                c.synced = 0
        self.cur = c
        c.host0 = now_ns()
        clock = self.clock
        if layers:  # (the stream is looked up again on the marked steps: a built-in strategy's
            clock.begin_step()  # steps, the only ones sampled, run on the device's own)
        c.ref = clock.cal  # (the clock's ref(), without the call)
        c.step_start = clock.mark()

    def backward_starts(self) -> None:
        """Right before the step calls backward() (the built-in strategies): a step whose layers
        are not marked marks its backward's start here, on the training thread, with no hook
        (on CUDA an event after the loss's kernels: where the backward starts on the stream)."""
        c = self.cur
        if c is not None and not c.layers:
            c.bwd_s[-1] = self.clock.mark()

    def fwd_begin(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.fwd_s[layer] = self.clock.mark()

    def fwd_end(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.fwd_e[layer] = self.clock.mark()

    def bwd_begin(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.bwd_s[layer] = self.clock.mark()

    def fwd_between(self, layer: int) -> None:
        """Layer `layer` ended and layer + 1 starts: one moment, one mark (-1: the first
        layer starts; the last: the last ends)."""
        c = self.cur
        if c is not None:
            t = self.clock.mark()
            if layer >= 0:
                c.fwd_e[layer] = t
            if layer + 1 < self.n_layers:
                c.fwd_s[layer + 1] = t

    def bwd_between(self, layer: int) -> None:
        """The gradient of layer `layer`'s output is ready: layer + 1's backward has ended and
        `layer`'s starts. One moment, one mark."""
        c = self.cur
        if c is not None:
            h = self.host_ns()
            t = self.clock.mark()
            c.bwd_s[layer] = t
            if layer + 1 < self.n_layers:
                c.bwd_e[layer + 1] = t
                c.bwd_h[layer + 1] = h

    def bwd_end(self, layer: int) -> None:
        # called when the layer's input gradient is ready and again as each of its
        # parameter gradients is accumulated: the last call wins. Each moment is marked
        # once: calls before the number the last step made are only counted (a CUDA mark is
        # a few µs of host time); the first step, and any call past that number, marks.
        c = self.cur
        if c is not None:
            n = c.bwd_n[layer] = c.bwd_n[layer] + 1
            want = self._bwd_calls[layer]
            if want is None or n >= want:
                c.bwd_h[layer] = self.host_ns()
                self._mark_again(c.bwd_e, layer)

    def _mark_again(self, slots: list, i: int) -> None:
        """slots[i] = now, where the last call wins; a superseded CUDA event goes back to the pool."""
        old = slots[i]
        slots[i] = self.clock.mark()
        if old is not None and self._recycle is not None:
            self._recycle(old)

    def comm_issue(self, idx: int, kind: int = COMM, synced: bool = False) -> int:
        """A collective is handed to the backend now; returns its slot. COMM: a gradient
        AllReduce (idx: its bucket or parameter; a gradient synchronisation); COLL: any other
        (idx: its row of the rank's collectives table; `synced`: it synchronises gradients)."""
        c = self.cur
        if c.comm_idx is NO_COMMS:
            c.comm_idx, c.comm_kind, c.comm_ready, c.comm_end, c.comm_hend, c.comm_thr, \
                c.comm_strm = [], [], [], [], [], [], []
        if kind == COMM or synced:
            c.synced += 1
        c.comm_kind.append(kind)
        c.comm_idx.append(idx)
        c.comm_ready.append(self.clock.mark())
        c.comm_end.append(None)
        c.comm_hend.append(None)
        c.comm_thr.append(None)
        c.comm_strm.append(None)
        return len(c.comm_idx) - 1

    def issuing(self, slot: int):
        """A context around the backend call that issues the collective in `slot` (on the
        thread that issues it): its own stream current where the clock needs one (gloo with
        CUDA tensors), whose end `comm_done` then marks there. A collective issued without it
        (the collective tap's, a user's comm hook) keeps the current stream's end."""
        strm = self.clock.issue_stream()
        if strm is None:
            return _NULL
        self.cur.comm_strm[slot] = strm
        return self.clock.issuing(strm)

    def comm_done(self, rec: StepRecord, slot: int) -> None:
        """The AllReduce in `slot` has finished (called on the thread that completed it)."""
        # (its thread and host end before its end: a step whose ends are all in is resolved)
        rec.comm_thr[slot] = _get_ident()
        rec.comm_hend[slot] = self.clock.comm_host_end()
        strm = rec.comm_strm[slot]
        rec.comm_end[slot] = (self.clock.mark_comm_end(strm) if strm is not None
                              else self.clock.mark_comm_end())

    def opt_begin(self) -> None:
        self.cur.opt_s = self.clock.mark()

    def opt_end(self) -> None:
        self.cur.opt_e = self.clock.mark()

    def end(self) -> None:
        c = self.cur
        c.step_end = self.clock.mark()
        self.pending.append(c)
        self.cur = None
        if c.strategy in self.switches:  # (the sampling's input: the steps' host time)
            dt = now_ns() - c.host0
            if c.layers and self._every.get(c.strategy, 1) > 1:  # (a marked step among others)
                self._marked_ns.setdefault(c.strategy, deque(maxlen=5)).append(dt)
            else:
                old = self._step_ns.get(c.strategy)
                self._step_ns[c.strategy] = dt if old is None else old + 0.25 * (dt - old)
            if self._mark_ns is None:
                self._mark_ns = self._time_marks()
        if not c.layers:
            return
        calls = self._bwd_calls
        for i, n in enumerate(c.bwd_n):
            if n:
                calls[i] = n

    def _time_marks(self, n: int = 32) -> float:
        """One mark's host cost in ns (after a step's end: outside every span)."""
        mark, toks = self.clock.mark, []
        t0 = now_ns()
        for _ in range(n):
            toks.append(mark())
        dt = (now_ns() - t0) / n
        if self._recycle is not None:
            for t in toks:
                self._recycle(t)
        return dt

    # -- off the hot path -----------------------------------------------------------
    def poll(self, wait: bool = False, lazy: bool = False) -> list:
        """Finished steps as (strategy, step, base_ns, kinds, idxs, t0s, t1s, issues), or with
        `lazy` as callables that return that tuple: resolving a step (on CUDA, an
        `elapsed_time` per event) is then done by whoever calls them, e.g. the thread that
        encodes and sends frames, not the training thread."""
        pending = self.pending
        out: list = []
        if not pending or (not wait and len(pending) < POLL_BATCH and not pending[-1].layers):
            return out
        clock = self.clock
        done = clock.done
        while pending:
            rec = pending[0]
            if wait and clock.cuda:
                for t in (rec.step_end, *rec.comm_end):
                    if t is not None and not done(t):
                        t.synchronize()
            else:
                # comm ends are recorded on the backends' callback streams: wait for them too
                if not done(rec.step_end):
                    break
                ends = rec.comm_end
                if ends:
                    if None in ends:
                        # a collective of the script's own still running (an async all_reduce
                        # waited on after the step): the step waits for it, up to two steps later
                        if not wait and len(pending) < 3:
                            break
                    if clock.cuda and not all([t is None or done(t) for t in ends]):
                        break
            pending.pop(0)
            out.append(Pending(self, rec) if lazy else self._resolve(rec))
        return out

    def _resolve(self, r: StepRecord, yield_every: int = 0) -> tuple:
        clock = self.clock
        ns = letting_go(clock.resolver(r.step_start, r.ref), yield_every)
        kinds, idxs, t0s, t1s = [STEP], [0], [ns(r.step_start)], [ns(r.step_end)]
        idle_end = clock.idle_end if clock.cuda else None
        if not r.layers:  # the forward and the backward as one each (PASS 0 and 1)
            if r.fwd_s[0] is not None and r.fwd_e[-1] is not None:
                kinds.append(PASS); idxs.append(PASS_FWD); t0s.append(ns(r.fwd_s[0])); t1s.append(ns(r.fwd_e[-1]))
            if r.bwd_s[-1] is not None and r.bwd_e[0] is not None:
                t0, t1 = ns(r.bwd_s[-1]), ns(r.bwd_e[0])
                if idle_end is not None and r.bwd_h[0] is not None:
                    t1 = max(t0, idle_end(t1, r.bwd_h[0]))
                kinds.append(PASS); idxs.append(PASS_BWD); t0s.append(t0); t1s.append(t1)
        for i in range(r.n_layers if r.layers else 0):
            if r.fwd_s[i] is not None and r.fwd_e[i] is not None:
                kinds.append(FWD); idxs.append(i); t0s.append(ns(r.fwd_s[i])); t1s.append(ns(r.fwd_e[i]))
        for i in reversed(range(r.n_layers if r.layers else 0)):
            if r.bwd_s[i] is not None and r.bwd_e[i] is not None:
                t0, t1 = ns(r.bwd_s[i]), ns(r.bwd_e[i])
                if idle_end is not None and r.bwd_h[i] is not None:
                    t1 = max(t0, idle_end(t1, r.bwd_h[i]))
                kinds.append(BWD); idxs.append(i); t0s.append(t0); t1s.append(t1)
        ready: list[int] = []
        if r.comm_idx:
            ready = [ns(t) for t in r.comm_ready]
            end = [ns(t) if t is not None else rd for t, rd in zip(r.comm_end, ready)]
            free = None
            if any(h is not None for h in r.comm_hend):
                free = [h if h is not None else e for h, e in zip(r.comm_hend, end)]
            starts = comm_starts(ready, end, r.comm_thr, clock.serial_comm, free)
            kinds += r.comm_kind; idxs += r.comm_idx; t0s += starts; t1s += end
        if r.opt_s is not None and r.opt_e is not None:
            kinds.append(OPT); idxs.append(0); t0s.append(ns(r.opt_s)); t1s.append(ns(r.opt_e))
        # the "issue" column is when each collective was READY: handed to the backend on CPU,
        # reached by the training stream on GPU (the host's issue time runs ahead there)
        iss = ready
        out = (r.strategy, r.step, t0s[0], kinds, idxs, t0s, t1s, iss)  # (before r may be reused)
        late = r.comm_end and None in r.comm_end  # (a collective's callback still to write)
        if clock.cuda:
            self._give_back(r)
        if not r.layers and not late and type(r) is StepRecord and len(self._spare) < SPARE:
            self._spare.append(r)
        return out

    def _give_back(self, r: StepRecord) -> None:
        """A step done with (resolved or dropped): its events back to the pool, and the end of
        a collective still running too, when its callback marks it (`_GivenBack`; swapped in
        first: an end written meanwhile is given back either way)."""
        if r.comm_end and None in r.comm_end:
            r.comm_end = _GivenBack(r.comm_end, self.clock.release)
        self._release_all(r)

    def _release_all(self, r: StepRecord, keep=(), more=()) -> None:
        """Every event of a step back to the pool, once (one mark may fill two slots), but
        those in `keep`; `more`: events the step holds elsewhere (a subclass's)."""
        seen = set(keep)
        release = self.clock.release
        for tok in (r.step_start, r.step_end, r.opt_s, r.opt_e, *r.fwd_s, *r.fwd_e,
                    *r.bwd_s, *r.bwd_e, *r.comm_ready, *r.comm_end, *more):
            if tok is not None and id(tok) not in seen:
                seen.add(id(tok))
                release(tok)
