"""Timing of layers, AllReduces, optimizer and steps.

Hot path rule: hooks only take a timestamp (CPU) or record a pooled CUDA event (GPU) into
preallocated slots. Turning slots into spans happens later, off the critical path: on CUDA
a step is resolved only once its last event has completed (no per-step synchronize).
"""
from __future__ import annotations

import time

import torch

from .wire import BWD, COMM, FWD, OPT, STEP


class CpuClock:
    """Host CLOCK_MONOTONIC in ns: shared by every process on the host."""

    cuda = False

    def mark(self):
        return time.monotonic_ns()

    def done(self, tok) -> bool:
        return True

    def ns(self, tok) -> int:
        return tok

    def release(self, tok) -> None:
        pass


class CudaClock:
    """CUDA events on the current stream, anchored to the host monotonic clock."""

    cuda = True

    def __init__(self, device):
        self.device = device
        self.pool: list = []
        torch.cuda.synchronize(device)
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        torch.cuda.synchronize(device)
        self.anchor_ns = time.monotonic_ns()

    def mark(self):
        try:
            ev = self.pool.pop()
        except IndexError:  # pool empty (also safe against a backend thread racing us)
            ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def done(self, tok) -> bool:
        return tok.query()

    def ns(self, tok) -> int:
        return self.anchor_ns + int(self.anchor.elapsed_time(tok) * 1e6)

    def release(self, tok) -> None:
        self.pool.append(tok)


class StepRecord:
    """Slots for one (strategy, step) on one rank."""

    __slots__ = ("strategy", "step", "n_layers", "step_start", "step_end", "fwd_s", "fwd_e",
                 "bwd_s", "bwd_e", "comm_idx", "comm_iss", "comm_ready", "comm_end",
                 "opt_s", "opt_e")

    def __init__(self, strategy: str, step: int, n_layers: int):
        self.strategy, self.step, self.n_layers = strategy, step, n_layers
        self.step_start = self.step_end = self.opt_s = self.opt_e = None
        self.fwd_s = [None] * n_layers
        self.fwd_e = [None] * n_layers
        self.bwd_s = [None] * n_layers
        self.bwd_e = [None] * n_layers
        self.comm_idx: list[int] = []
        self.comm_iss: list[int] = []
        self.comm_ready: list = []
        self.comm_end: list = []


class Recorder:
    """One per rank. Strategies call the mark_* methods from hooks; the worker calls
    begin/end around each step and poll() to collect finished steps as span tuples."""

    def __init__(self, clock, n_layers: int):
        self.clock = clock
        self.n_layers = n_layers
        self.cur: StepRecord | None = None
        self.pending: list[StepRecord] = []

    # -- hot path -------------------------------------------------------------------
    def begin(self, strategy: str, step: int) -> None:
        self.cur = StepRecord(strategy, step, self.n_layers)
        self.cur.step_start = self.clock.mark()

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
        if self.cur is not None:
            self.cur.bwd_e[layer] = self.clock.mark()

    def comm_issue(self, idx: int) -> int:
        """An AllReduce is handed to the backend now; returns its slot."""
        c = self.cur
        c.comm_idx.append(idx)
        c.comm_iss.append(time.monotonic_ns())
        c.comm_ready.append(self.clock.mark())
        c.comm_end.append(None)
        return len(c.comm_idx) - 1

    def comm_done(self, rec: StepRecord, slot: int) -> None:
        """The AllReduce in `slot` has finished (may be called from a backend thread)."""
        rec.comm_end[slot] = self.clock.mark()

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
            # comm ends are recorded on the backends' callback streams: wait for them too
            if not wait and not (clock.done(rec.step_end) and
                                 all(t is None or clock.done(t) for t in rec.comm_end)):
                break
            if wait and clock.cuda:
                torch.cuda.synchronize(clock.device)
            self.pending.pop(0)
            out.append(self._resolve(rec))
        return out

    def _resolve(self, r: StepRecord) -> tuple:
        clock = self.clock
        ns = clock.ns
        kinds, idxs, t0s, t1s, iss = [STEP], [0], [ns(r.step_start)], [ns(r.step_end)], []
        for i in range(r.n_layers):
            if r.fwd_s[i] is not None and r.fwd_e[i] is not None:
                kinds.append(FWD); idxs.append(i); t0s.append(ns(r.fwd_s[i])); t1s.append(ns(r.fwd_e[i]))
        for i in reversed(range(r.n_layers)):
            if r.bwd_s[i] is not None and r.bwd_e[i] is not None:
                kinds.append(BWD); idxs.append(i); t0s.append(ns(r.bwd_s[i])); t1s.append(ns(r.bwd_e[i]))
        prev_end = 0
        for j, idx in enumerate(r.comm_idx):
            end_tok = r.comm_end[j]
            ready = ns(r.comm_ready[j])
            end = ns(end_tok) if end_tok is not None else ready
            # a backend runs collectives in issue order: one starts when it is ready
            # and the previous one is done
            start = min(max(ready, prev_end), end)
            prev_end = max(prev_end, end)
            kinds.append(COMM); idxs.append(idx); t0s.append(start); t1s.append(end)
            iss.append(r.comm_iss[j])
        if r.opt_s is not None and r.opt_e is not None:
            kinds.append(OPT); idxs.append(0); t0s.append(ns(r.opt_s)); t1s.append(ns(r.opt_e))
        if clock.cuda:
            for tok in [r.step_start, r.step_end, r.opt_s, r.opt_e, *r.fwd_s, *r.fwd_e,
                        *r.bwd_s, *r.bwd_e, *r.comm_ready, *r.comm_end]:
                if tok is not None:
                    clock.release(tok)
        return (r.strategy, r.step, t0s[0], kinds, idxs, t0s, t1s, iss)
