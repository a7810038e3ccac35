"""The clocks the Recorder marks with: `CpuClock` (the host's CLOCK_MONOTONIC, read by the hooks)
and `CudaClock` (pooled CUDA events on the training stream, mapped to host time through
`ranks.core.timemap.GpuTimeMap`). A mark is the one call a hook makes; everything else a clock does
(calibration, resolution) happens between steps or on the sender thread.

Hot path rule: a mark takes a timestamp (CPU) or records a pooled CUDA event (GPU) through the
C method (no Python Stream object per mark), on the step's stream looked up once per step.
"""
from __future__ import annotations

from collections import deque
from functools import partial

from ranks.clock import now_ns
from ranks.core.timemap import CalPoint, GpuTimeMap


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
        self._streams: dict = {}  # (id, device, type) -> its Python Stream (_current)
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
        self._seen: deque = deque(maxlen=GpuTimeMap.WINDOW)  # record to stamped, ns (idle_wait_ns)
        self._late: list = []  # calibration events given up on, with when they were recorded
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
            self._record(ev, self._current())
        else:
            self._record(ev, stream)
            self.stream.wait_event(ev)
        return ev

    def _current(self):
        """The current stream of our device on this thread (a completion callback's), as a
        Python Stream: torch.cuda.current_stream builds a new one each call (a few µs, the
        largest part of a collective's end mark); here one per stream, kept, looked up by the
        C call's (id, device, type)."""
        raw = self._raw_stream
        if raw is None:
            return self.tc.current_stream(self.device)
        key = raw()
        got = self._streams.get(key)
        if got is None:
            got = self._streams[key] = self.tc.current_stream(self.device)
        return got

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

    BOUND_SLACK_NS = 1_000  # beyond the bracket: the stamp's visibility to a query, float32 ms
    _bound = None  # (bound_ns, figured at each calibration)

    @property
    def bound_ns(self):
        """How far a span's time may be off (ns), None before the first calibration: the map's
        error (half the widest bracket of the points it is fitted to, GpuTimeMap.bound_ns, and
        BOUND_SLACK_NS) and how much later than usual an event on an idle stream is stamped
        (`idle_wait_ns`). A mark on an idle stream (a host-bound step, the end of a layer whose
        work the GPU has done) is stamped when the GPU takes it: on a GPU time-sliced with
        another process's context, when this context gets its slice back. (Figured at each
        calibration: read every step, it costs an attribute.)"""
        return self._bound

    def idle_wait_ns(self) -> int:
        """How much later than the quickest an event on an idle stream is stamped, for three
        in four of the recent calibration events (0 with fewer than four; one given up on is
        timed at the next point, its stamp mapped): ~1 µs on a GPU of one's own; on one
        time-sliced with another context, up to the other's slice."""
        seen = sorted(self._seen)  # (a copy: calibrate() appends on the training thread)
        return seen[(3 * len(seen)) // 4] - seen[0] if len(seen) >= 4 else 0

    def maybe_calibrate(self) -> None:
        if self.host_ns() >= self.next_cal:
            self.calibrate()

    SPIN_NS = 200_000  # an event on an idle stream is stamped within µs; give up after this
    BLOCK_SPIN_NS = 2_000_000_000  # the first point (before training): poll this long at most

    def _bracket(self, block: bool = False):
        """(event, lo, hi): an event recorded on the idle side stream and two host readings
        it was stamped between. `lo` is the reading before the last query that found it not
        yet stamped (the record itself, if the first query found it done): the GPU stamped it
        after that. A GPU time-sliced with another process's context (two ranks on one GPU)
        stamps the event only when this context gets the GPU back, up to a slice later: the
        midpoint of [record, seen] would be early by half that wait, and every span with it
        (the first H100 pass: ~160 µs). Polled, the bracket is one query wide however long the
        wait. None: not stamped within SPIN_NS (`block`: the first point, polled longer)."""
        ev = self.tc.Event(enable_timing=True)
        host_ns, query = self.host_ns, ev.query
        lo = rec_ns = host_ns()
        ev.record(self.side)
        give_up = lo + (self.BLOCK_SPIN_NS if block else self.SPIN_NS)
        while True:
            t = host_ns()
            if query():
                break
            lo = t
            if t > give_up:  # not stamped in time: no use as a calibration point
                if not block:
                    if len(self._late) < 8:  # (how long it waited: seen at the next point)
                        self._late.append((ev, rec_ns))
                    return None
                ev.synchronize()  # (a GPU that never came back: a wide bracket will do)
                break
        hi = host_ns()
        self._seen.append(hi - rec_ns)  # (record to seen: idle_window_ns)
        return ev, lo, hi

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
        if self._late:  # the events given up on, stamped since: when, mapped
            late, self._late = self._late, []
            for old, rec_ns in late:
                if old.query():
                    at = self.map.host_ns(g + ev.elapsed_time(old) * 1e6)
                    self._seen.append(max(0, at - rec_ns))
                else:
                    self._late.append((old, rec_ns))
        self._bound = self.map.bound_ns + self.BOUND_SLACK_NS + self.idle_wait_ns()
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
        half the shortest time from a calibration event's record to its being seen (the
        submission latency, and the mapping's error) and 2 µs for the record call itself."""
        seen = tuple(self._seen)  # (a copy in one call: calibrate() appends on the training thread)
        return 2_000 + (min(seen) // 2 if seen else 0)

    # -- off the hot path -----------------------------------------------------------
    def resolver(self, start_tok, ref: CalPoint):
        """tok -> host ns for the events of one step: each against the step's start event."""
        base, a, rate = self.map.fit  # (one fit for the whole step, whatever calibrate() does)
        g0 = ref.g_ns + ref.event.elapsed_time(start_tok) * 1e6
        h0 = int(round(base + a + rate * g0))

        # one `elapsed_time` per event (a driver call, ~6 µs on an H100 host): an event that
        # fills two slots (a layer's end is the next one's start) is resolved once
        seen: dict = {id(start_tok): h0}
        elapsed = start_tok.elapsed_time

        def ns(tok):
            if type(tok) is int:
                return tok
            got = seen.get(id(tok))
            if got is None:
                got = seen[id(tok)] = h0 + int(round(elapsed(tok) * 1e6 * rate))
            return got
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
