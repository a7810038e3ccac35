"""The store: every source (live ranks, a replay file) feeds frames in; the UI, the
recorder's summary and the headless report read figures out.

Ingest is cheap (columns are kept as they arrive); figures are computed by update(),
off the collector thread: while a run is live by one Updater thread (updater.py), else by
whoever reads. Raw spans are kept for the last
``keep_steps`` steps of each strategy and per-step figures for the last ``keep_figures``,
so memory stays bounded however long the run.
"""
from __future__ import annotations

import threading
import time
from time import monotonic as _monotonic
from collections import OrderedDict, deque
from dataclasses import dataclass

from ranks import frames, spec
from ranks.frames import FrameError, Frame
from ranks.wire import SpanBatch

from . import figures
from . import stragglers
from .clocksync import KEEP_COLLECTIVES, HostClocks, coll_sample
from .runinfo import RunInfo
from .summary import bucket_rows, strategy_summary
from .views import StepView, step_view



def in_force(entries, step: int, default=None, first: bool = False):
    """The value of the last (k, value, ...) entry with k <= step (entries in step order):
    what is in force at `step`. None there: `default`, or the first entry's with first=True."""
    got = default
    if first and entries:
        got = entries[0][1]
    for e in entries:
        if e[0] > step:
            break
        got = e[1]
    return got


@dataclass
class RankInfo:
    rank: int
    pid: int | None = None
    device: str = ""
    backend: str = ""
    note: str = ""
    phase: str = "connecting"
    step: int = -1
    connected: bool = False
    last_seen: float = 0.0
    dropped_spans: int = 0
    error: str | None = None
    exit: str | None = None
    finished: bool = False
    uuid: str | None = None  # the GPU's UUID (CUDA ranks)
    clock_res_ns: int | None = None  # CUDA: GPU-timer mapping residual at the last calibration

    def copy(self) -> "RankInfo":
        """A shallow copy (copy.copy's reduce protocol costs ten times this: the status bar
        and the GPU panel take one per rank every frame)."""
        new = object.__new__(RankInfo)
        new.__dict__.update(self.__dict__)
        return new


class Store:
    def __init__(self, keep_steps: int = 400, keep_figures: int = 20000):
        self.lock = threading.RLock()
        self.version = 0
        self.keep_steps = keep_steps
        self.keep_figures = keep_figures
        self.meta = RunInfo()  # what the run is (typed; .as_dict() for the header's map)
        self.ranks: dict[int, RankInfo] = {}
        self.raw: dict[str, OrderedDict[int, dict[int, SpanBatch]]] = {}
        self._strategies: tuple | None = None  # (the strategies named, len(raw), the list): asked many times a frame
        self.step_figs: dict[str, OrderedDict[int, figures.StepFigures]] = {}
        self.rank_figs: dict[tuple[str, int, int], figures.RankStep] = {}
        self.bucket_figs: dict[tuple[str, int], dict] = {}  # (strategy, step) of complete steps
        self.layouts: dict[tuple[str, int], list[tuple[int, dict[int, int], list]]] = {}
        self.ddp_reported: dict[tuple[str, int], list[int]] = {}  # bucket sizes DDP itself reports
        self.events: list[tuple[int, str, str]] = []  # (step, strategy, text)
        self.cap_changes: list[tuple[int, float]] = []  # (step, bucket_cap_mb) as applied
        self.slow_changes: list[tuple[int, float, int, int]] = []  # (step, ms, rank, layer) as applied
        self.waits: dict[str, OrderedDict[int, stragglers.StepWaits | None]] = {}  # kept like raw spans
        # (strategy, step) -> (start ns, end ns) of a complete step on CLOCK_MONOTONIC, kept like raw spans
        self._intervals: dict[tuple[str, int], tuple[int, int]] = {}
        self.log: deque[tuple[float, str, str]] = deque(maxlen=500)
        self.log_seq = 0  # lines ever logged (the deque keeps the last 500): readers follow this
        self.gpu: deque[dict] = deque(maxlen=600)
        self.cpu: deque[dict] = deque(maxlen=600)
        self.spans = 0
        self.rejected = 0
        self._param_bytes: list[int] = []
        self._limits = frames.Limits()
        self._dirty: dict[str, set[int]] = {}
        # multi-node: rank -> node, node -> clock frame (its offset onto node 0's axis)
        self.host_clocks = HostClocks()
        self.node_of: dict[int, int] = self.host_clocks.node_of  # (the same dicts, read by queries)
        self.clocks: dict[int, dict] = self.host_clocks.clocks
        self._shift: dict[tuple[str, int], dict[int, int]] = {}  # (strategy, step) -> rank -> raw - mapped
        self._coll: dict[int, deque] = {}  # node -> its latest collectives against node 0 (CollSample)

    # -- ingest ------------------------------------------------------------------------
    def ingest(self, f: Frame, validated: bool = False) -> None:
        """Take one frame (a ranks.frames Struct): validated as if it had come over the wire
        unless it did (`validated`: decoded by frames.decode), then checked against this
        run's limits before anything changes, then applied. Raises FrameError, having
        changed nothing, for a frame that breaks the protocol; the handlers trust what
        they get. (A plain map is taken too, as its Struct: tests and tools.)"""
        if not validated:
            f = frames.validate(f)
        cls = type(f)
        with self.lock:
            if cls is frames.Spans:
                self._spans(frames.check_spans(f, self._limits))
            else:
                handler = self._handlers.get(cls)
                if handler is None:
                    raise FrameError(f"{frames.TAG[cls]} frames are not for the store")
                frames.check(f, self._limits)
                handler(self, f)
            self.version += 1

    def _rank(self, r: int) -> RankInfo:
        info = self.ranks.get(r)
        if info is None:
            info = self.ranks[r] = RankInfo(r)
        info.last_seen = time.monotonic()
        return info

    @property
    def limits(self) -> frames.Limits:
        """What frames are checked against: this run's world, strategies, layers, params."""
        return self._limits

    def _meta_changed(self) -> None:
        self._limits = self.meta.limits()

    def _on_hello(self, f: frames.Hello) -> None:
        info = self._rank(f.rank)
        info.pid, info.device, info.backend = f.pid or None, f.device, f.backend
        info.note = f.note
        info.uuid = f.uuid or None
        info.connected = True
        info.phase = "connected"
        if not self.meta.params:
            self._param_bytes = spec.grad_bytes(f.params or [])
        self.meta.take_hello(f, info.device)
        self._meta_changed()
        self.add_log(f"rank {f.rank} connected: {info.device}, {info.backend}", "info")

    def set_meta(self, meta: dict) -> None:
        """Metadata known before any rank speaks (from the CLI or a recording header)."""
        with self.lock:
            self.meta.merge(meta)
            if not self._param_bytes and self.meta.params:
                self._param_bytes = spec.grad_bytes(self.meta.params)
            self._meta_changed()
            self.version += 1

    def _on_phase(self, f: frames.Phase) -> None:
        self._rank(f.rank).phase = f.phase

    def _on_hb(self, f: frames.Hb) -> None:
        info = self._rank(f.rank)
        info.step = f.step
        info.dropped_spans = f.dropped
        if f.residual_ns is not frames.UNSET:
            info.clock_res_ns = f.residual_ns
        if info.phase in ("connected", "connecting") and f.phase:
            info.phase = f.phase

    def _on_bye(self, f: frames.Bye) -> None:
        info = self._rank(f.rank)
        info.finished = True
        info.phase = "done"
        if f.dropped is not frames.UNSET:
            info.dropped_spans = f.dropped

    def _on_error(self, f: frames.Error) -> None:
        info = self._rank(f.rank)
        msg = " ".join(f.msg.split()) or "error"  # one line, whatever the backend said
        info.error = msg if len(msg) <= 300 else msg[:297] + "…"
        info.phase = "failed"
        self.add_log(f"rank {info.rank} failed: {info.error}", "error")

    def _on_event(self, f: frames.Event) -> None:
        self._rank(f.rank)
        if f.rank == 0 and f.what == "bucket_cap_mb":
            k, cap = f.step, float(f.value)
            self.cap_changes.append((k, cap))
            self.events.append((k, "ddp", f"bucket_cap_mb → {cap:g} MB"))
        elif f.rank == 0 and f.what == "slow_ms":
            k, ms, rank, layer = f.step, float(f.value), f.slow_rank, f.layer
            self.slow_changes.append((k, ms, rank, layer))
            name = self.meta.layer_name(layer)
            text = f"straggler rank {rank} {name} +{ms:g} ms" if ms > 0 else "straggler off"
            for s in self.strategies():
                self.events.append((k, s, text))

    def _on_buckets(self, f: frames.Buckets) -> None:
        self._rank(f.rank)
        assignment = [[b, list(params), n] for b, params, n in f.buckets]
        sizes = {b[0]: b[2] for b in assignment}
        key = (f.strategy, f.rank)
        history = self.layouts.setdefault(key, [])
        if not history or history[-1][2] != assignment:
            history.append((f.step, sizes, assignment))
        if f.ddp_reported is not None:
            self.ddp_reported[key] = f.ddp_reported
        if f.cap_mb is not None:
            self.meta.bucket_cap_mb_now = f.cap_mb

    def _on_gpu(self, f: frames.Gpu) -> None:
        self.gpu.append(f)

    def _on_cpu(self, f: frames.Cpu) -> None:
        self.cpu.append(f)

    def _on_status(self, f: frames.Status) -> None:  # launcher progress, recorded too
        self.add_log(f.text, f.level)

    def _on_exit(self, f: frames.Exit) -> None:  # a rank process ended (from the launcher)
        info = self._rank(f.rank)
        info.exit = f.status
        if not info.finished and info.error is None:
            info.phase = "died"

    def _on_reject(self, f: frames.Reject) -> None:  # a frame or a connection the app refused
        r, ft = f.rank, f.frame_type
        who = f"rank {r}" if r is not None else f"a {ft} frame" if ft else "unauthenticated client"
        self.rejected += 1
        self.add_log(f"rejected {who}: {f.why}", "warn")

    def _on_drop(self, f: frames.Drop) -> None:  # a rank's connection closed
        info = self.ranks.get(f.rank)
        if info is not None:
            info.connected = False

    def _on_node(self, f: frames.Node) -> None:  # multi-node: which host a rank runs on
        self.host_clocks.observe(f)

    def _on_clock(self, f: frames.Clock) -> None:  # multi-node: a host's clock against node 0's
        prev = self.clocks.get(f.node)
        if prev is None:
            self.add_log(f"node {f.node} ({f.host}): clock {f.offset_ns / 1e6:+.3f} ms "
                         f"± {f.uncertainty_ns / 1e3:.0f} µs against node 0", "info")
        if f.collectives and (prev is None or not prev.collectives):
            self.add_log(f"node {f.node} ({f.host}): clock refined from {f.collectives} collectives: "
                         f"{f.offset_ns / 1e6:+.3f} ms ± {f.uncertainty_ns / 1e3:.0f} µs "
                         f"(exchanges alone: {f.ntp_offset_ns / 1e6:+.3f} ms "
                         f"± {f.ntp_uncertainty_ns / 1e3:.0f} µs)", "info")
        self.host_clocks.observe(f)

    def to_common(self, rank: int, ns: int) -> int:
        """A time of `rank`'s host clock on node 0's axis (identity on one host)."""
        return self.host_clocks.to_common(rank, ns)

    def _collect_clock_samples(self, w: stragglers.StepWaits, shift: dict[int, int], step: tuple) -> None:
        """Multi-node: each collective of a step, per host against node 0, in raw host times
        (what the clock refinement reads; ddptui/model/clocksync.py)."""
        by_node: dict[int, list[int]] = {}
        for r in shift:
            by_node.setdefault(self.node_of.get(r, 0), []).append(r)
        here = by_node.pop(0, None)
        if not here or not by_node:
            return
        for c in w.collectives:
            r0, e0 = [c.ready[r] for r in here], [c.end[r] for r in here]
            for node, rs in by_node.items():
                got = self._coll.get(node)
                if got is None:
                    got = self._coll[node] = deque(maxlen=KEEP_COLLECTIVES)
                got.append(coll_sample(r0, e0, [c.ready[r] + shift[r] for r in rs],
                                       [c.end[r] + shift[r] for r in rs], step))

    def clock_samples(self, node: int) -> list:
        """Multi-node: the latest collectives between `node` and node 0 (CollSample, raw times)."""
        with self.lock:
            return list(self._coll.get(node, ()))

    def clock_offsets(self) -> list[dict]:
        """Per host: its offset onto node 0's clock and the uncertainty (JSON `clock_offsets`)."""
        with self.lock:
            return self.host_clocks.offsets(self.meta.host)

    def hosts(self) -> dict[int, list[int]]:
        """node rank -> its ranks (ranks no connection placed are node 0's)."""
        with self.lock:
            out: dict[int, list[int]] = {}
            for r in sorted(self.ranks):
                out.setdefault(self.node_of.get(r, 0), []).append(r)
            return out

    def _spans(self, b: SpanBatch) -> None:
        strategy, step, r = b.strategy, b.step, b.rank
        if self.clocks:  # multi-node: onto node 0's axis (recordings keep the raw time)
            raw = b.base_ns
            b.base_ns = self.to_common(r, raw)
            self._shift.setdefault((strategy, step), {})[r] = raw - b.base_ns
        info = self.ranks.get(r)
        if info is None:
            info = self._rank(r)
        else:
            info.last_seen = _monotonic()
        if step > info.step:
            info.step = step
        per = self.raw.get(strategy)
        if per is None:
            per = self.raw[strategy] = OrderedDict()
        slot = per.get(step)
        if slot is None:
            slot = per[step] = {}
        slot[r] = b
        self.spans += len(b.kind)
        dirty = self._dirty.get(strategy)
        if dirty is None:
            dirty = self._dirty[strategy] = set()
        dirty.add(step)
        if len(per) > self.keep_steps * 4:  # nobody called update(): drop the oldest anyway
            old = per.popitem(last=False)[0]
            self._shift.pop((strategy, old), None)
            self._intervals.pop((strategy, old), None)

    def add_log(self, text: str, level: str = "info") -> None:
        with self.lock:
            self.log.append((time.time(), level, text))
            self.log_seq += 1
            self.version += 1

    _handlers = {frames.Hello: _on_hello, frames.Phase: _on_phase, frames.Hb: _on_hb,
                 frames.Bye: _on_bye, frames.Error: _on_error, frames.Event: _on_event,
                 frames.Buckets: _on_buckets, frames.Gpu: _on_gpu, frames.Cpu: _on_cpu,
                 frames.Status: _on_status, frames.Exit: _on_exit, frames.Reject: _on_reject,
                 frames.Drop: _on_drop, frames.Node: _on_node, frames.Clock: _on_clock}

    # -- figures -----------------------------------------------------------------------
    @property
    def world(self) -> int:
        return int(self.meta.world or max(len(self.ranks), 1))

    def expected_ranks(self, strategy: str) -> int:
        return spec.strategy_ranks(strategy, self.world)

    def comm_bytes_fn(self, strategy: str, rank: int, step: int):
        layouts = self.layouts.get((strategy, rank))
        if strategy == "ddp" and layouts:
            sizes = in_force(layouts, step, first=True)
            return lambda i: sizes.get(i, 0)
        pb = self._param_bytes
        return lambda i: pb[i] if i < len(pb) else 0

    def rank_figures(self, strategy: str, step: int, rank: int) -> figures.RankStep | None:
        with self.lock:
            key = (strategy, step, rank)
            got = self.rank_figs.get(key)
            if got is None:
                b = self.raw.get(strategy, {}).get(step, {}).get(rank)
                if b is None:
                    return None
                got = self.rank_figs[key] = figures.rank_step(b, self.comm_bytes_fn(strategy, rank, step))
            return got

    def bucket_figures(self, strategy: str, step: int) -> dict[int, tuple[float, float | None]] | None:
        """Per AllReduce index (DDP: bucket) of a step: (mean time ms, mean % overlapped with
        compute) over its ranks (figures.bucket_step); kept once the step is complete. Made
        outside the lock (batches never change once in): ingest does not wait on it."""
        key = (strategy, step)
        with self.lock:
            got = self.bucket_figs.get(key)
            if got is not None:
                return got
            ranks = self.raw.get(strategy, {}).get(step)
            if not ranks:
                return None
            batches, complete = list(ranks.values()), len(ranks) >= self.expected_ranks(strategy)
        got = figures.bucket_step(batches)
        if complete:
            with self.lock:
                if self.raw.get(strategy, {}).get(step) is not None:  # (not evicted meanwhile)
                    self.bucket_figs[key] = got
        return got

    def update(self) -> None:
        """Compute figures of steps complete on every rank; evict what is beyond bounds.

        Three phases, so readers (the UI) never wait on the arithmetic: what to compute is
        chosen under the lock, computed outside it (span batches never change once in), and
        published under it (a step evicted meanwhile is dropped). The Updater thread calls
        this while a run is live; readers that need figures now may call it too."""
        todo = []  # (strategy, step, {rank: batch}, {rank: comm_bytes})
        with self.lock:
            for strategy, dirty in self._dirty.items():
                per = self.raw.get(strategy, {})
                want = self.expected_ranks(strategy)
                figs = self.step_figs.get(strategy, {})
                for k in sorted(dirty):
                    ranks = per.get(k)
                    if ranks is None or len(ranks) < want or k in figs:
                        continue
                    todo.append((strategy, k, dict(sorted(ranks.items())),
                                 {r: self.comm_bytes_fn(strategy, r, k) for r in ranks}))
                    dirty.discard(k)
        done = []
        for strategy, k, ranks, comm in todo:
            rs = {r: figures.rank_step(b, comm[r]) for r, b in ranks.items()}
            step = figures.combine(k, list(rs.values()))
            done.append((strategy, k, ranks, rs, step, stragglers.step_waits(ranks, step.step_ms),
                         figures.step_interval(ranks.values())))
        with self.lock:
            for strategy, k, ranks, rs, step, waits, interval in done:
                if self.raw.get(strategy, {}).get(k) is None:
                    continue  # evicted while computed
                figs = self.step_figs.setdefault(strategy, OrderedDict())
                if k in figs:
                    continue  # another caller published it first
                for r, got in rs.items():
                    self.rank_figs[(strategy, k, r)] = got
                figs[k] = step
                if interval is not None:
                    self._intervals[(strategy, k)] = interval
                self.waits.setdefault(strategy, OrderedDict())[k] = waits
                if waits is not None and self.clocks:
                    self._collect_clock_samples(waits, self._shift.get((strategy, k), {}), (strategy, k))
            if done:
                self.version += 1
            for strategy, dirty in self._dirty.items():
                per = self.raw.get(strategy, {})
                figs = self.step_figs.setdefault(strategy, OrderedDict())
                while len(per) > self.keep_steps:
                    k, ranks = per.popitem(last=False)
                    self._shift.pop((strategy, k), None)
                    self.waits.get(strategy, {}).pop(k, None)
                    self.bucket_figs.pop((strategy, k), None)
                    self._intervals.pop((strategy, k), None)
                    for r in ranks:
                        self.rank_figs.pop((strategy, k, r), None)
                    dirty.discard(k)
                while len(figs) > self.keep_figures:
                    figs.popitem(last=False)

    def strategies(self) -> list[str]:
        with self.lock:
            named, known = self.meta.strategies, len(self.raw)  # (raw only grows)
            got = self._strategies
            if got is None or got[0] is not named or got[1] != known:
                order = list(named or [])
                got = self._strategies = (named, known, order + [s for s in self.raw if s not in order])
            return list(got[2])

    def complete_steps(self, strategy: str) -> list[int]:
        with self.lock:
            return list(self.step_figs.get(strategy, {}))

    def latest_complete(self, strategy: str) -> int | None:
        with self.lock:
            figs = self.step_figs.get(strategy)
            return next(reversed(figs)) if figs else None

    def summary(self, strategy: str) -> dict:
        """A strategy's figures as the reports' JSON shapes them (summary.strategy_summary)."""
        return strategy_summary(self, strategy)

    def bucket_rows(self, strategy: str) -> list[dict] | None:
        """Rank 0's newest bucket layout as {index, params (names), bytes}; None without one."""
        return bucket_rows(self, strategy)

    def summaries(self) -> list[dict]:
        self.update()
        return [self.summary(s) for s in self.strategies()]

    def bucket_layout(self, strategy: str = "ddp", step: int | None = None) -> list | None:
        """Rank 0's bucket layout in force at `step` (None: the newest)."""
        with self.lock:
            layouts = self.layouts.get((strategy, 0))
            if not layouts:
                return None
            if step is None:
                return layouts[-1][2]
            return in_force([(k, lay) for k, _, lay in layouts], step, first=True)

    def cap_at(self, step: int) -> float | None:
        """DDP's bucket_cap_mb in force at `step`."""
        with self.lock:
            return in_force(self.cap_changes, step, self.meta.bucket_cap_mb)

    def cap_changed_at(self, upto: int | None = None) -> int:
        """The step of the last bucket_cap_mb change at or before `upto` (0: none)."""
        with self.lock:
            return max((k for k, _ in self.cap_changes if upto is None or k <= upto), default=0)

    # -- queries -------------------------------------------------------------------------
    def rank_snapshot(self) -> dict[int, RankInfo]:
        """A copy of every rank's state, taken under the lock (safe from any thread)."""
        with self.lock:
            return {r: i.copy() for r, i in self.ranks.items()}

    def first_rank(self) -> RankInfo | None:
        """A copy of the lowest rank's state (what the title says of device and backend)."""
        with self.lock:
            return self.ranks[min(self.ranks)].copy() if self.ranks else None

    def dropped_spans(self) -> list[tuple[int, int]]:
        """(rank, spans it dropped) of the ranks that dropped any, by rank."""
        with self.lock:
            return sorted((r, i.dropped_spans) for r, i in self.ranks.items() if i.dropped_spans)

    def span_batches(self) -> dict[str, dict[int, dict[int, SpanBatch]]]:
        """strategy -> step -> rank -> its span batch, for every kept step (a copy of the
        mappings, taken under the lock; the batches themselves are never changed once in)."""
        with self.lock:
            return {s: {k: dict(ranks) for k, ranks in per.items()} for s, per in self.raw.items()}

    def last_complete(self, strategy: str, upto: int | None = None, lookback: int = 10_000) -> int | None:
        """The newest complete step of a strategy at or before `upto` (None: the newest)."""
        with self.lock:
            figs = self.step_figs.get(strategy)
            if not figs:
                return None
            if upto is None:
                return next(reversed(figs))
            if upto in figs:
                return upto
            for i, k in enumerate(reversed(figs)):
                if k <= upto or i > lookback:
                    return k if k <= upto else None
        return None

    def recent_figures(self, strategy: str, upto: int | None = None, n: int = 20,
                       since: int = 0) -> list[figures.StepFigures]:
        """Up to n complete steps' figures with since <= k <= upto, oldest first."""
        out = []
        with self.lock:
            figs = self.step_figs.get(strategy, {})
            for k in reversed(figs):
                if upto is not None and k > upto:
                    continue
                if k < since or len(out) >= n:
                    break
                out.append(figs[k])
        out.reverse()
        return out

    def oldest_step(self) -> int:
        """The oldest step whose spans every strategy still keeps (0: none kept)."""
        with self.lock:
            kept = [min(per) for per in self.raw.values() if per]
            return max(kept) if kept else 0

    def cap_history(self) -> list[tuple[int, float]]:
        """Every bucket_cap_mb change as applied, (step, MB), oldest first (a copy)."""
        with self.lock:
            return list(self.cap_changes)

    def view_stamp(self, strategy: str) -> tuple[int, int]:
        """Changes when something that shapes view(strategy, k) besides its spans arrives
        (a bucket layout of rank 0, an event): a view may be kept while this stays."""
        with self.lock:
            return len(self.layouts.get((strategy, 0), ())), len(self.events)

    def recent_waits(self, strategy: str, upto: int | None = None, n: int = 20) -> list[stragglers.StepWaits]:
        """Who waited for whom in the last n kept steps 0 < k <= upto that had collectives
        on two or more ranks, oldest first."""
        with self.lock:
            got = [w for k, w in self.waits.get(strategy, {}).items()
                   if w is not None and k > 0 and (upto is None or k <= upto)]
        return got[-n:]

    def waits_kept(self, strategy: str) -> bool:
        """Whether any kept step of a strategy has its who-waits entry (an empty one too)."""
        with self.lock:
            return bool(self.waits.get(strategy))

    def samples(self) -> tuple[list[dict], list[dict]]:
        """Copies of the kept GPU and CPU samples, oldest first."""
        with self.lock:
            return list(self.gpu), list(self.cpu)

    def log_lines(self) -> list[tuple[float, str, str]]:
        """A copy of the kept log: (time, level, text), oldest first."""
        with self.lock:
            return list(self.log)

    def log_since(self, seq: int) -> tuple[int, list[tuple[float, str, str]], int]:
        """The lines logged after the reader's sequence number `seq` (0 at first):
        (new seq, those still kept, how many of them the 500-line log no longer holds)."""
        with self.lock:
            new = self.log_seq - seq
            kept = list(self.log)[-new:] if new > 0 else []
            return self.log_seq, kept, max(0, new - len(kept))

    def view(self, strategy: str, step: int) -> StepView | None:
        """A step ready to draw (views.step_view): spans per rank, figures, waits, marks."""
        return step_view(self, strategy, step)

    # -- UI query: where each kept step lies on the host clock (per-strategy NVML figures) --
    def step_intervals(self, strategy: str) -> list[tuple[int, int, int]]:
        """(step, start ns, end ns) of the kept complete steps of a strategy, on
        CLOCK_MONOTONIC (the clock of gpu/cpu samples): from the first rank's STEP start to the
        last rank's end (made once, by update(), when the step completes)."""
        with self.lock:
            iv = self._intervals
            return [(k, *iv[(strategy, k)]) for k in self.raw.get(strategy, {}) if (strategy, k) in iv]
