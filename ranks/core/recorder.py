"""The Recorder: one per rank; the strategies' hooks mark moments into a step's slots
(`StepRecord`), and finished steps are handed over (`poll`) to be resolved into spans
(`Pending`, on the sender thread).

Collectives. Backends differ in how collectives overlap:
- gloo runs async collectives on a small pool of worker threads, several at once; the
  completion callback runs on the thread that ran the work, so a collective starts when it
  was issued or, if later, when the previous collective on the *same thread* ended;
- NCCL runs them one after another on one stream: start = max(ready, previous end).
"""
from __future__ import annotations

import threading
from collections import deque

from ranks.clock import now_ns
from ranks.core.clocks import _NULL
from ranks.core.resolve import YIELD_EVERY, comm_starts, letting_go
from ranks.core.sampling import LAYER_HOOK_NS, POLL_BATCH, SETTLE, SPARE, every_for
from ranks.wire import BWD, COMM, FWD, OPT, PASS, PASS_BWD, PASS_FWD, STEP, WAIT

_get_ident = threading.get_ident


NO_COMMS = ()  # a step's collectives before its first (StepRecord)


class FrEnd:
    """A collective's end to be read from PyTorch's own timing (the Flight Recorder, NCCL):
    its process group's name and sequence number (`Recorder.comm_seal` fills it after the
    backward: the last n collectives of the group are the step's n buckets)."""

    __slots__ = ("group", "seq")

    def __init__(self, group: str):
        self.group, self.seq = group, None


class StepRecord:
    """Slots for one (strategy, step) on one rank."""

    __slots__ = ("strategy", "step", "n_layers", "step_start", "step_end", "fwd_s", "fwd_e",
                 "bwd_s", "bwd_e", "bwd_h", "bwd_n", "comm_idx", "comm_kind", "comm_ready", "comm_end",
                 "comm_hend", "comm_thr", "comm_strm", "opt_s", "opt_e", "ref", "synced", "layers",
                 "host0", "fwd_first", "bwd_at", "defer", "waits", "extra")

    def __init__(self, strategy: str, step: int, n_layers: int, layers: bool = True):
        # (on the training thread at every step's begin: as few statements as it takes)
        self.strategy, self.step, self.n_layers = strategy, step, n_layers
        # its layers marked one by one; False: the forward's and backward's start and end only
        # (layer marks on a sample of steps, Recorder.begin), resolved as two PASS spans
        self.layers = layers
        self.host0 = 0  # host clock at begin (the step's length on the host, for the sampling)
        # the forward not started yet: its first mark may be the step's start (attach_layer_hooks)
        self.fwd_first = True
        # the backward's progress (attach_layer_hooks: the lowest block whose backward started;
        # -1 before) and the collectives whose ready moment is the next block boundary's mark
        # (Recorder.comm_issue: NCCL, layers marked)
        self.bwd_at = -1
        self.defer = None
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
        # (waits: (slot, mark) where the compute began waiting for collective `slot`'s result:
        # Recorder.comm_wait, a WAIT span each, to that collective's end)
        self.comm_idx = self.comm_kind = self.comm_ready = self.comm_end = self.comm_hend = \
            self.comm_thr = self.comm_strm = self.waits = NO_COMMS
        self.synced = 0  # gradient synchronisations issued (COMM spans, FSDP's reduce-scatters)
        self.extra = None  # spans a strategy adds as (kind, idx, start mark, end mark): a pipeline's


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
        # (on CUDA a quarter as many: an elapsed_time holds the GIL ~6 µs on an H100's host,
        # so 16 of them would keep a hook waiting ~100 µs)
        rec = self.rec
        return rec._resolve(self.r, yield_every=YIELD_EVERY // 4 if rec.clock.cuda else YIELD_EVERY)

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
        n += len(r.extra or ())  # (a built-in pipeline's microbatches)
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
        # strategy -> its steps ended so far, the first one (a warm-up: PyTorch's first autograd
        # call and allocations, 26 ms against 3 here for 40 tiny layers) not in the average; the
        # hooks registered once wait for SETTLE timed steps (a slow start does not leave hooks
        # PyTorch calls on every step after: LayerMarks)
        self._ended: dict[str, int] = {}
        # strategy -> its steps' own time on the device (CUDA: from their resolved start and end,
        # written by the sender thread; moving average): a GPU-bound step's length
        self._dev_ns: dict[str, float] = {}
        # a marked layer's hook on this host: the clock's measured dispatch where it has one
        # (CUDA), the first guess elsewhere
        lag = getattr(clock, "hook_lag_ns", None) if clock.cuda else None
        self._hook_ns = float(lag) if lag else float(LAYER_HOOK_NS)
        # strategy -> its last marked steps' host times, while its layers are sampled (their
        # median: one preempted marked step does not double the period)
        self._marked_ns: dict[str, deque] = {}
        self._mark_ns: float | None = None  # one mark's host cost (measured once)
        # steps whose layers were not marked, resolved (on the sender thread), nothing else
        # holding them: begin takes one rather than making a record (SPARE at most)
        self._spare: list[StepRecord] = []
        # a collective's ready moment taken from the next block boundary's mark where it can be
        # (CUDA, one stream for collectives: NCCL; comm_issue)
        self._defer = bool(clock.cuda and clock.serial_comm)
        # NCCL timed by PyTorch itself (ranks.core.flightrec.FlightTimes; DDPStrategy sets it): the
        # buckets' ends read from the Flight Recorder on the sender thread; how many were not
        self.fr = None
        self.fr_untimed = 0
        # strategies whose step starts at their model's forward, not at begin (DDP: its own work
        # before the forward is not the step's, as the profiler sees it; attach_layer_hooks)
        self.late_start: set[str] = set()

    def wanted_every(self, strategy: str) -> int:
        """The period this rank would mark `strategy`'s layers at (1: every step)."""
        if self.every is not None:
            return self.every
        step_ns = self._step_ns.get(strategy)
        if step_ns is None or strategy not in self.switches or self._mark_ns is None:
            return 1
        cost = self.n_layers * (2 * self._mark_ns + self._hook_ns)
        marked = self._marked_ns.get(strategy)
        if marked and len(marked) >= 3:  # (what marked steps have been seen to take over the others)
            cost = max(cost, sorted(marked)[len(marked) // 2] - step_ns)
        # the step's length: its host time, or its time on the device where that is longer
        length = max(step_ns, self._dev_ns.get(strategy, 0.0))
        return every_for(cost, length, self._every.get(strategy, 1))

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
                switch(every == 1 and (self.every == 1 or self._ended.get(strategy, 0) > SETTLE))
            layers = step % every == 0
        spare = self._spare
        if layers or not spare:
            c = StepRecord(strategy, step, self.n_layers, layers)
        else:  # (a record given back by the sender thread, made blank: no object to make)
            c = spare.pop()
            c.strategy, c.step = strategy, step
            c.step_end = c.opt_s = c.opt_e = c.fwd_s[0] = c.fwd_e[0] = c.bwd_s[0] = c.bwd_e[0] = \
                c.bwd_h[0] = None
            c.fwd_first, c.bwd_at, c.defer, c.extra = True, -1, None, None
            if c.comm_idx is not NO_COMMS:
                c.comm_idx = c.comm_kind = c.comm_ready = c.comm_end = c.comm_hend = \
                    c.comm_thr = c.comm_strm = c.waits = NO_COMMS
                c.synced = 0
        self.cur = c
        c.host0 = now_ns()
        clock = self.clock
        if layers:  # (the stream is looked up again on the marked steps: a built-in strategy's
            clock.begin_step()  # steps, the only ones sampled, run on the device's own)
        c.ref = clock.cal  # (the clock's ref(), without the call)
        # (a strategy whose wrapper works before the model's forward: marked at the forward)
        c.step_start = None if strategy in self.late_start else clock.mark()

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
        if self._defer and c.bwd_at > 0 and c.layers:
            # NCCL, inside a marked backward before its first block: the collective's stream
            # waits for the training stream where it is issued, and the next block boundary's
            # mark (after the hook that issued it: the reducer's, or interleaved's) is at that
            # very place on the training stream: its event is the ready moment, one event less
            # (attach_layer_hooks' marks fill it; Recorder.end any left)
            if c.defer is None:
                c.defer = []
            c.defer.append(len(c.comm_ready))
            c.comm_ready.append(None)
        else:
            c.comm_ready.append(self.clock.mark())
        c.comm_end.append(None)
        c.comm_hend.append(None)
        c.comm_thr.append(None)
        c.comm_strm.append(None)
        return len(c.comm_idx) - 1

    def comm_issue_fr(self, idx: int, group: str) -> None:
        """A bucket's AllReduce was handed to NCCL by DDP's reducer (no comm hook): its ready
        moment marked now (or at the next block boundary, as comm_issue), its end and length
        read later from PyTorch's own timing of the collective (`fr`, FrEnd)."""
        slot = self.comm_issue(idx)
        self.cur.comm_end[slot] = FrEnd(group)

    def comm_seal(self, group: str, last_seq: int, ready_at: list[int] | None = None) -> None:
        """After the backward: the group's sequence number now; the step's FrEnd slots of that
        group, in issue order, are the collectives that end there. `ready_at`: each bucket's
        block, the one holding its last gradient to arrive, where no hook marked the buckets
        (the layer marks registered once, every step marked): the step's slots made here, in
        bucket order, each ready at its block's backward end, the very mark (the block is done
        when its weight's gradient is in the bucket: after its bias's, after DDP's hooks).
        No hook, no event and no Python per bucket on the training thread."""
        c = self.cur
        if c is None:
            return
        if c.comm_idx is NO_COMMS:
            if ready_at is None or not c.layers:
                return
            bwd_e = c.bwd_e
            n = len(ready_at)
            c.comm_idx, c.comm_kind = list(range(n)), [COMM] * n
            c.comm_ready = [bwd_e[i] for i in ready_at]
            if None in c.comm_ready:  # (a block not marked: ready at the backward's end, end())
                c.defer = [j for j, t in enumerate(c.comm_ready) if t is None]
            c.comm_end = [FrEnd(group) for _ in range(n)]
            c.comm_hend, c.comm_thr, c.comm_strm = [None] * n, [None] * n, [None] * n
            c.synced += n
        ends = [e for e in c.comm_end if type(e) is FrEnd and e.group == group and e.seq is None]
        for j, e in enumerate(ends):
            e.seq = last_seq - (len(ends) - 1 - j)

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

    def comm_wait(self, rec: StepRecord, slot: int, whole: bool = False) -> None:
        """The compute waits for the result of the collective in `slot` from now (a functional
        collective's wait_tensor, on the training thread), or, `whole`, from its start (a
        blocking call: no mark): a WAIT span to its end, not compute in any figure (a
        tensor-parallel all_reduce waited on inside its layer is exposed, not hidden by it)."""
        if rec.waits is NO_COMMS:
            rec.waits = []
        rec.waits.append((slot, None if whole else self.clock.mark()))

    def opt_begin(self) -> None:
        self.cur.opt_s = self.clock.mark()

    def opt_end(self, last: bool = False) -> None:
        """The optimizer's end; `last`: nothing of the step comes after it (the built-in
        strategies), so that one event marks the step's end too."""
        c = self.cur
        c.opt_e = t = self.clock.mark()
        if last:
            c.step_end = t

    def end(self) -> None:
        c = self.cur
        if c.step_end is None:
            c.step_end = self.clock.mark()
        if c.step_start is None:  # (late_start, no forward came: the step as a moment)
            c.step_start = c.step_end
        if c.defer:  # (a ready moment no block boundary came to fill: the backward's end)
            t = c.bwd_e[0] if c.bwd_e[0] is not None else c.step_end
            for j in c.defer:
                c.comm_ready[j] = t
            c.defer = None
        self.pending.append(c)
        self.cur = None
        if c.strategy in self.switches:  # (the sampling's input: the steps' host time)
            dt = now_ns() - c.host0
            if c.layers and self._every.get(c.strategy, 1) > 1:  # (a marked step among others)
                self._marked_ns.setdefault(c.strategy, deque(maxlen=5)).append(dt)
            else:
                n = self._ended[c.strategy] = self._ended.get(c.strategy, 0) + 1
                if n > 1:  # (the first: a warm-up)
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

    def _time_marks(self, n: int = 16, rounds: int = 4) -> float:
        """One mark's host cost in ns (after a step's end: outside every span): the quickest of
        a few rounds, so that a round the scheduler preempted (ms on a loaded host) does not
        set the period of layer marks for the whole run."""
        mark, best = self.clock.mark, None
        for _ in range(rounds):
            toks = []
            t0 = now_ns()
            for _ in range(n):
                toks.append(mark())
            dt = (now_ns() - t0) / n
            best = dt if best is None else min(best, dt)
            if self._recycle is not None:
                for t in toks:
                    self._recycle(t)
        return best

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
                    if t is not None and type(t) is not FrEnd and not done(t):
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
                    if clock.cuda:
                        if clock.serial_comm:  # (one stream, NCCL: they end in order)
                            last = ends[-1]
                            # (an end PyTorch times: the step's end waited for it)
                            if last is not None and type(last) is not FrEnd and not done(last):
                                break
                        elif not all([t is None or done(t) for t in ends]):
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
            fr = [type(t) is FrEnd for t in r.comm_end] if self.fr is not None else ()
            if any(fr):  # timed by PyTorch (DDP's buckets); the others (the collective tap's,
                # the script's own) as they were marked, each set placed on its own
                own = [j for j, f in enumerate(fr) if not f]
                starts, end = [0] * len(fr), [0] * len(fr)
                got = self._fr_place([r.comm_end[j] for j, f in enumerate(fr) if f],
                                     [ready[j] for j, f in enumerate(fr) if f])
                for j, a, b in zip((j for j, f in enumerate(fr) if f), *got):
                    starts[j], end[j] = a, b
                if own:
                    a, b = self._marked_comms(r, own, [ready[j] for j in own], ns)
                    for j, x, y in zip(own, a, b):
                        starts[j], end[j] = x, y
            else:
                starts, end = self._marked_comms(r, range(len(ready)), ready, ns)
            kinds += r.comm_kind; idxs += r.comm_idx; t0s += starts; t1s += end
            for j, tok in r.waits:  # (WAIT: from the wait's call, within the collective, to its end)
                z = end[j]
                a = starts[j] if tok is None else min(max(ns(tok), starts[j]), z)
                kinds.append(WAIT); idxs.append(r.comm_idx[j]); t0s.append(a)
                t1s.append(z)
        if r.opt_s is not None and r.opt_e is not None:
            kinds.append(OPT); idxs.append(0); t0s.append(ns(r.opt_s)); t1s.append(ns(r.opt_e))
        for k, i, a, z in r.extra or ():  # (a built-in pipeline's microbatches and schedule step)
            kinds.append(k); idxs.append(i); t0s.append(ns(a)); t1s.append(ns(z))
        # the "issue" column is when each collective was READY: handed to the backend on CPU,
        # reached by the training stream on GPU (the host's issue time runs ahead there)
        iss = ready
        out = (r.strategy, r.step, t0s[0], kinds, idxs, t0s, t1s, iss)  # (before r may be reused)
        if clock.cuda and r.strategy in self.switches:  # (the step's own length on the device)
            dt, old = t1s[0] - t0s[0], self._dev_ns.get(r.strategy)
            self._dev_ns[r.strategy] = dt if old is None else old + 0.25 * (dt - old)
        late = r.comm_end and None in r.comm_end  # (a collective's callback still to write)
        if clock.cuda:
            self._give_back(r)
        if not r.layers and not late and type(r) is StepRecord and len(self._spare) < SPARE:
            self._spare.append(r)
        return out

    def _marked_comms(self, r: StepRecord, which, ready: list[int], ns) -> tuple[list[int], list[int]]:
        """(starts, ends) of the collectives `which` of a step whose ends were marked (a comm
        hook's, the collective tap's callbacks): each from its ready moment or the previous
        one's end on a serial backend (comm_starts)."""
        which = list(which)
        end = [ns(r.comm_end[j]) if r.comm_end[j] is not None else rd for j, rd in zip(which, ready)]
        free = None
        hend = [r.comm_hend[j] for j in which]
        if any(h is not None for h in hend):
            free = [h if h is not None else e for h, e in zip(hend, end)]
        return comm_starts(ready, end, [r.comm_thr[j] for j in which], self.clock.serial_comm, free), end

    def _fr_place(self, ends: list, ready: list[int]) -> tuple[list[int], list[int]]:
        """Collectives timed by PyTorch (FrEnd) placed on the device's time axis: one NCCL
        stream, so each starts when it is ready or when the one before it ended, whichever is
        later, and lasts its GPU duration. One not seen finished (a wrapped buffer, a dump that
        failed) is drawn as a moment at its ready time and counted (`fr_untimed`)."""
        fr = self.fr
        keys = [(e.group, e.seq) for e in ends if type(e) is FrEnd and e.seq is not None]
        fr.wait_for(keys)
        starts, out, prev = [], [], None
        for e, rd in zip(ends, ready):
            t0 = rd if prev is None else max(rd, prev)
            got = fr.get(e.group, e.seq) if type(e) is FrEnd and e.seq is not None else None
            if got is None:
                self.fr_untimed += 1
                t1 = t0
            else:
                t1 = t0 + got[0]
                fr.forget(e.group, e.seq)
            starts.append(t0)
            out.append(t1)
            prev = t1
        return starts, out

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
                    *r.bwd_s, *r.bwd_e, *r.comm_ready, *r.comm_end, *[t for _, t in r.waits],
                    *(t for e in r.extra or () for t in e[2:]), *more):
            if tok is not None and id(tok) not in seen and type(tok) is not FrEnd:
                seen.add(id(tok))
                release(tok)
