"""Timing of layers, AllReduces, optimizer and steps.

Hot path rule: hooks only take a timestamp (CPU) or record a pooled CUDA event (GPU) into
preallocated slots. Turning slots into spans happens later, off the critical path: on CUDA
a step is resolved only once its last event has completed (no per-step synchronize).

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

import threading
from collections import deque

from .clock import now_ns
from .wire import BWD, COMM, FWD, OPT, STEP

_get_ident = threading.get_ident


class CpuClock:
    """Host CLOCK_MONOTONIC in ns: shared by every process on the host."""

    cuda = False
    serial_comm = False  # gloo: collectives overlap on the backend's threads

    def mark(self):
        return now_ns()

    mark_comm_end = mark

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
        self.a = 0.0
        self.rate = 1.0
        self.h_base = None
        self.residual_ns: int | None = None  # prediction - measurement at the last point

    def add(self, g_ns: float, h0: int, h1: int) -> None:
        if self.h_base is None:
            self.h_base = h0
        h = (h0 + h1) / 2 - self.h_base
        if self.points:
            self.residual_ns = int(round(self.a + self.rate * g_ns - h))
        self.points.append((g_ns, h, h1 - h0))
        self._fit()

    def _fit(self) -> None:
        pts = self.points
        best = min(p[2] for p in pts)
        use = [p for p in pts if p[2] <= 2 * best + 2_000] or list(pts)
        if len(use) < 2 or use[-1][0] - use[0][0] < 1e8:  # under 0.1 s: offset only
            g, h, _ = min(pts, key=lambda p: p[2]) if len(use) < 2 else use[-1]
            self.a = h - self.rate * g
            return
        n = len(use)
        mg = sum(p[0] for p in use) / n
        mh = sum(p[1] for p in use) / n
        sxx = sum((p[0] - mg) ** 2 for p in use)
        sxy = sum((p[0] - mg) * (p[1] - mh) for p in use)
        self.rate = sxy / sxx if sxx > 0 else 1.0
        self.a = mh - self.rate * mg

    def host_ns(self, g_ns: float) -> int:
        return int(round(self.h_base + self.a + self.rate * g_ns))


class CalPoint:
    """A calibration event and its place on the chained GPU axis."""

    __slots__ = ("event", "g_ns")

    def __init__(self, event, g_ns: float):
        self.event, self.g_ns = event, g_ns


class CudaClock:
    """CUDA events on the current stream, mapped to host time (see GpuTimeMap).

    `comm_on_host`: gloo with CUDA tensors runs the collective on the host (its completion
    callback runs on a gloo thread, whose current stream is not ours), so comm ends are host
    readings there; with NCCL the callback runs at enqueue on a stream made to wait for the
    NCCL work, and an event recorded on *that* stream (of our device) marks the end.

    `torch_cuda` / `host_ns` are seams: tests pass a fake GPU timer (drift, float32 rounding).
    """

    cuda = True

    def __init__(self, device, comm_on_host: bool = False, torch_cuda=None,
                 host_ns=now_ns, calib_period_s: float = 1.0):
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
        self.side = torch_cuda.Stream(device)  # idle: an event on it is stamped at once
        self.calibrate()

    # -- hot path -------------------------------------------------------------------
    def _event(self):
        try:
            return self.pool.pop()
        except IndexError:  # pool empty (also safe against a backend thread racing us)
            self.allocated += 1
            return self.tc.Event(enable_timing=True)

    def mark(self):
        ev = self._event()
        ev.record(self.tc.current_stream(self.device))
        return ev

    def mark_comm_end(self):
        if self.comm_on_host:
            return self.host_ns()
        return self.mark()  # the current stream of *our* device, whatever thread this is

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

    def _bracket(self):
        ev = self.tc.Event(enable_timing=True)
        h0 = self.host_ns()
        ev.record(self.side)
        spins = 0
        while not ev.query():
            spins += 1
            if spins > 20000:  # the GPU is busy elsewhere: wait (late, so a wide bracket)
                ev.synchronize()
                break
        return ev, h0, self.host_ns()

    def calibrate(self, samples: int = 3) -> None:
        best = None
        for _ in range(samples):
            ev, h0, h1 = self._bracket()
            if best is None or h1 - h0 < best[2] - best[1]:
                best = (ev, h0, h1)
        ev, h0, h1 = best
        g = 0.0 if self.cal is None else self.cal.g_ns + self.cal.event.elapsed_time(ev) * 1e6
        self.map.add(g, h0, h1)
        self.cal = CalPoint(ev, g)
        # the drift is unknown until two points are apart: the first ones come sooner
        n = len(self.map.points)
        self.next_cal = h1 + min(self.period_ns, 50_000_000 << min(n, 10))

    # -- off the hot path -----------------------------------------------------------
    def resolver(self, start_tok, ref: CalPoint):
        """tok -> host ns for the events of one step: each against the step's start event."""
        m = self.map
        g0 = ref.g_ns + ref.event.elapsed_time(start_tok) * 1e6
        h0 = m.host_ns(g0)
        rate = m.rate

        def ns(tok):
            if type(tok) is int:
                return tok
            if tok is start_tok:
                return h0
            return h0 + int(round(start_tok.elapsed_time(tok) * 1e6 * rate))
        return ns


class StepRecord:
    """Slots for one (strategy, step) on one rank."""

    __slots__ = ("strategy", "step", "n_layers", "step_start", "step_end", "fwd_s", "fwd_e",
                 "bwd_s", "bwd_e", "comm_idx", "comm_ready", "comm_end",
                 "comm_thr", "opt_s", "opt_e", "ref")

    def __init__(self, strategy: str, step: int, n_layers: int):
        self.strategy, self.step, self.n_layers = strategy, step, n_layers
        self.step_start = self.step_end = self.opt_s = self.opt_e = self.ref = None
        self.fwd_s = [None] * n_layers
        self.fwd_e = [None] * n_layers
        self.bwd_s = [None] * n_layers
        self.bwd_e = [None] * n_layers
        self.comm_idx: list[int] = []
        self.comm_ready: list = []
        self.comm_end: list = []
        self.comm_thr: list = []


def comm_starts(ready: list[int], end: list[int], thr: list, serial: bool) -> list[int]:
    """When each collective (in issue order) started running.

    serial (one stream, NCCL): when it was ready and the previous one had ended.
    threads (gloo): when it was ready and the previous collective that ran on the same backend
    thread (the thread its completion callback ran on) had ended: gloo's worker threads take
    queued works first come, first served, and run them to completion."""
    if serial:  # as if one thread ran them all
        thr = [None] * len(ready)
    out = []
    last: dict = {}
    for r, e, t in zip(ready, end, thr):
        out.append(min(max(r, last.get(t, 0)), e))
        last[t] = max(last.get(t, 0), e)
    return out


class Recorder:
    """One per rank. Strategies call the mark_* methods from hooks; the worker calls
    begin/end around each step and poll() to collect finished steps as span tuples."""

    def __init__(self, clock, n_layers: int):
        self.clock = clock
        self.n_layers = n_layers
        self.cur: StepRecord | None = None
        self.pending: list[StepRecord] = []
        self.straggle = None  # strategies.Straggle when a delay is injected (the layer hooks ask)
        # CUDA: a layer's backward end is re-marked for each parameter; hand the superseded
        # event back to the pool at once (the pool would otherwise grow every step)
        self._recycle = clock.release if clock.cuda else None

    # -- hot path -------------------------------------------------------------------
    def begin(self, strategy: str, step: int) -> None:
        self.cur = c = StepRecord(strategy, step, self.n_layers)
        c.ref = self.clock.ref()
        c.step_start = self.clock.mark()

    def fwd_begin(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.fwd_s[layer] = self.clock.mark()

    def fwd_end(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.fwd_e[layer] = self.clock.mark()

    def bwd_begin(self, layer: int) -> None:
        if self.cur is not None:
            self.cur.bwd_s[layer] = self.clock.mark()

    def bwd_end(self, layer: int) -> None:
        # called when the layer's input gradient is ready and again as each of its
        # parameter gradients is accumulated: the last call wins
        c = self.cur
        if c is not None:
            self._mark_again(c.bwd_e, layer)

    def _mark_again(self, slots: list, i: int) -> None:
        """slots[i] = now, where the last call wins; a superseded CUDA event goes back to the pool."""
        old = slots[i]
        slots[i] = self.clock.mark()
        if old is not None and self._recycle is not None:
            self._recycle(old)

    def comm_issue(self, idx: int) -> int:
        """An AllReduce is handed to the backend now; returns its slot."""
        c = self.cur
        c.comm_idx.append(idx)
        c.comm_ready.append(self.clock.mark())
        c.comm_end.append(None)
        c.comm_thr.append(None)
        return len(c.comm_idx) - 1

    def comm_done(self, rec: StepRecord, slot: int) -> None:
        """The AllReduce in `slot` has finished (called on the thread that completed it)."""
        rec.comm_end[slot] = self.clock.mark_comm_end()
        rec.comm_thr[slot] = _get_ident()

    def opt_begin(self) -> None:
        self.cur.opt_s = self.clock.mark()

    def opt_end(self) -> None:
        self.cur.opt_e = self.clock.mark()

    def end(self) -> None:
        c = self.cur
        c.step_end = self.clock.mark()
        self.pending.append(c)
        self.cur = None

    # -- off the hot path -----------------------------------------------------------
    def poll(self, wait: bool = False) -> list[tuple]:
        """Finished steps as (strategy, step, base_ns, kinds, idxs, t0s, t1s, issues)."""
        out = []
        clock = self.clock
        while self.pending:
            rec = self.pending[0]
            if wait and clock.cuda:
                for t in (rec.step_end, *rec.comm_end):
                    if t is not None and not clock.done(t):
                        t.synchronize()
            # comm ends are recorded on the backends' callback streams: wait for them too
            elif not (clock.done(rec.step_end) and
                      all(t is None or clock.done(t) for t in rec.comm_end)):
                break
            self.pending.pop(0)
            out.append(self._resolve(rec))
        return out

    def _resolve(self, r: StepRecord) -> tuple:
        clock = self.clock
        ns = clock.resolver(r.step_start, r.ref)
        kinds, idxs, t0s, t1s = [STEP], [0], [ns(r.step_start)], [ns(r.step_end)]
        for i in range(r.n_layers):
            if r.fwd_s[i] is not None and r.fwd_e[i] is not None:
                kinds.append(FWD); idxs.append(i); t0s.append(ns(r.fwd_s[i])); t1s.append(ns(r.fwd_e[i]))
        for i in reversed(range(r.n_layers)):
            if r.bwd_s[i] is not None and r.bwd_e[i] is not None:
                kinds.append(BWD); idxs.append(i); t0s.append(ns(r.bwd_s[i])); t1s.append(ns(r.bwd_e[i]))
        ready: list[int] = []
        if r.comm_idx:
            ready = [ns(t) for t in r.comm_ready]
            end = [ns(t) if t is not None else rd for t, rd in zip(r.comm_end, ready)]
            starts = comm_starts(ready, end, r.comm_thr, clock.serial_comm)
            n = len(r.comm_idx)
            kinds += [COMM] * n; idxs += r.comm_idx; t0s += starts; t1s += end
        if r.opt_s is not None and r.opt_e is not None:
            kinds.append(OPT); idxs.append(0); t0s.append(ns(r.opt_s)); t1s.append(ns(r.opt_e))
        # the "issue" column is when each collective was READY: handed to the backend on CPU,
        # reached by the training stream on GPU (the host's issue time runs ahead there)
        iss = ready
        if clock.cuda:
            for tok in [r.step_start, r.step_end, r.opt_s, r.opt_e, *r.fwd_s, *r.fwd_e,
                        *r.bwd_s, *r.bwd_e, *r.comm_ready, *r.comm_end]:
                if tok is not None:
                    clock.release(tok)
        return (r.strategy, r.step, t0s[0], kinds, idxs, t0s, t1s, iss)
