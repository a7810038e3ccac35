"""The Store's intake, one job: frames in. `ingest` checks a frame (its schema, then against
the run's `limits`) and hands it to its handler, one per frame type, which applies it to the
Store's state (declared in store/__init__.py); `set_meta` and `add_log` are the other two
ways in. Nothing here computes figures (figuring.py) or answers readers (queries.py).

`ingest` is the collector thread's hot path: a spans frame is stored as it came (columns),
under the lock, with as little as possible done per frame."""
from __future__ import annotations

import copy
import time
from time import monotonic as _monotonic
from collections import OrderedDict, deque

from ranks import frames, spec
from ranks.frames import FrameError, Frame
from ranks.wire import SpanBatch

from .. import gpu as gpusamples, stragglers
from ..collectives import WORLD, group_label, group_parts
from ..columns import whole_passes

from .rankinfo import RankInfo


# strategies.COMM_TIMING by value (ranks.builtin.strategies imports torch: not here)
COMM_TIMING_NAMES = {1: "comm-hook", 2: "flight-recorder"}


class Intake:
    """Frames in (a part of Store: the state it changes is declared in Store.__init__)."""

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

    def _figured_again(self, strategy: str, step: int) -> None:
        """(Under the lock.) A step whose rank sent its spans again (the hang's step of `ddptui
        attach`, sent at every poll while it lasts): what was figured of it is dropped, so that
        update() figures it anew from the spans as they are now; the HTA totals lose its
        share where it was the last step added (the hang's step is)."""
        figs = self.step_figs.get(strategy)
        if figs is None or figs.pop(step, None) is None:
            return
        self.waits.get(strategy, {}).pop(step, None)
        self.bucket_figs.pop((strategy, step), None)
        self._intervals.pop((strategy, step), None)
        for r in self.raw.get(strategy, {}).get(step, ()):
            self.rank_figs.pop((strategy, step, r), None)
        for (s, _r), acc in self.hta_acc.items():
            if s == strategy and acc[2] == step:
                acc[0] -= acc[3]
                acc[1] -= acc[4]
                acc[2:] = [-1, 0.0, 0.0]
        got = self.stalls.get(strategy)
        if got:
            got[:] = [x for x in got if x[0] != step]

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

    def set_meta(self, meta: dict) -> None:
        """Metadata known before any rank speaks (from the CLI or a recording header)."""
        with self.lock:
            self.meta.merge(meta)
            if not self._param_bytes and self.meta.params:
                self._param_bytes = spec.grad_bytes(self.meta.params)
            self._meta_changed()
            self.version += 1

    def revise_meta(self, key: str, value) -> None:
        """A key of the run's description that a live source revises as it learns (`ddptui
        attach`: ``flight_recorder``, the hang as named now): replaced, where set_meta keeps the
        first value."""
        with self.lock:
            self.meta.extra[key] = copy.deepcopy(value)
            self.version += 1

    def add_log(self, text: str, level: str = "info") -> None:
        with self.lock:
            self.log.append((time.time(), level, text))
            self.log_seq += 1
            self.version += 1

    # -- the handlers: one per frame type, under the lock, trusting what they get -------------
    def _on_hello(self, f: frames.Hello) -> None:
        info = self._rank(f.rank)
        info.pid, info.device, info.backend = f.pid or None, f.device, f.backend
        info.note = f.note
        info.uuid = f.uuid or None
        if f.memory is not frames.UNSET:
            info.memory = tuple(f.memory)
        if f.mem_peak is not frames.UNSET:
            info.mem_peak = f.mem_peak
        info.connected = True
        info.phase = "connected"
        if not self.meta.params:
            self._param_bytes = spec.grad_bytes(f.params or [])
        self.meta.take_hello(f, info.device)
        self._meta_changed()
        said = ", ".join(x for x in (info.device, info.backend) if x) or "device unknown"
        self.add_log(f"rank {f.rank} connected: {said}", "info")

    def _on_phase(self, f: frames.Phase) -> None:
        self._rank(f.rank).phase = f.phase

    def _on_hb(self, f: frames.Hb) -> None:
        info = self._rank(f.rank)
        info.step = f.step
        info.dropped_spans = f.dropped
        if f.residual_ns is not frames.UNSET:
            info.clock_res_ns = f.residual_ns
        if f.bound_ns is not frames.UNSET:
            info.clock_bound_ns = f.bound_ns
        if f.ts is not frames.UNSET:
            info.hb_ts = f.ts
        info.waiting = None if f.waiting is frames.UNSET else tuple(f.waiting)
        info.waiting_bucket = None if f.bucket is frames.UNSET or info.waiting is None else f.bucket
        info.waiting_p2p = None if f.p2p is frames.UNSET or info.waiting is None else tuple(f.p2p)
        if f.colls is not frames.UNSET:
            info.colls_entered = f.colls
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
        if f.what == "comm_timing":
            self.comm_timing[f.rank] = spec.COMM_TIMING_NAMES.get(int(f.value), "?")
            return
        if f.what == "fr_untimed":
            self.fr_untimed[f.rank] = int(f.value)
            return
        if f.what == "captured_marks":  # layer marks skipped in a CUDA graph's capture
            if not self.graph_marks:
                self.add_log(f"rank {f.rank}: layer marks inside a CUDA graph's capture: skipped "
                             "(its replays run no Python: those layers have no spans; docs/compiled.md)",
                             "warn")
            self.graph_marks[f.rank] = int(f.value)
            return
        if f.what.startswith(("traced ", "traced_b ")):  # collectives in a compiled graph
            kind, _, op = f.what.partition(" ")
            first = not self.traced_colls
            got = self.traced_colls.setdefault(f.rank, {}).setdefault(op, [0, 0, 0])
            got[0 if kind == "traced" else 1] = int(f.value)
            got[2] = max(got[2], f.step + 1)  # (the steps they ran over)
            if first:
                self.add_log(f"rank {f.rank}: {op} traced into a compiled graph by torch.compile: "
                             "counted, not timed (docs/compiled.md)", "warn")
            return
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
        history = self.bucket_assignments.setdefault(key, [])
        if not history or history[-1][2] != assignment:
            history.append((f.step, sizes, assignment))
        if f.ddp_reported is not None:
            self.reported_sizes[key] = f.ddp_reported
        if f.cap_mb is not None:
            self.meta.bucket_cap_mb_now = f.cap_mb

    def _on_colls(self, f: frames.Colls) -> None:
        self._rank(f.rank)
        table = self.collectives.setdefault((f.strategy, f.rank), {})
        for row in f.rows:
            table[row[0]] = tuple(row)
            low, label = group_parts(row[4])[1], group_label(row[4])
            if low is not None or label != WORLD:
                self.coll_group_rows.setdefault((f.strategy, f.rank), {})[row[0]] = (low, label)

    def _on_gpu(self, f: frames.Gpu) -> None:  # (PCIe rates across a counter's wrap mended)
        self.gpu.append(gpusamples.unwrap(self.gpu[-1] if self.gpu else None, f))

    def _on_cpu(self, f: frames.Cpu) -> None:
        self.cpu.append(f)

    def _on_status(self, f: frames.Status) -> None:  # launcher progress, recorded too
        self.add_log(f.text, f.level)

    def _on_output(self, f: frames.Output) -> None:  # a rank's own output (the script's prints)
        ts = time.time() if f.ts is frames.UNSET else f.ts
        self.output.extend((ts, f.rank, f.stream, line) for line in f.lines)
        self.output_seq += len(f.lines)
        self.output_dropped += f.dropped

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
        if r == 0 and slot.get(0) is None:  # (counted once a step)
            lm = self.layer_marks.get(strategy)
            if lm is None:
                lm = self.layer_marks[strategy] = [0, 0]
            passes = whole_passes(b)
            lm[passes] += 1
            if not passes:
                got = self.marked.get(strategy)
                if got is None:
                    got = self.marked[strategy] = deque(maxlen=3 * stragglers.RECENT)
                got.append(step)
        if slot.get(r) is not None:  # (a step sent again: `ddptui attach`'s hang step grows)
            self._figured_again(strategy, step)
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

    _handlers = {frames.Hello: _on_hello, frames.Phase: _on_phase, frames.Hb: _on_hb,
                 frames.Bye: _on_bye, frames.Error: _on_error, frames.Event: _on_event,
                 frames.Buckets: _on_buckets, frames.Colls: _on_colls, frames.Gpu: _on_gpu, frames.Cpu: _on_cpu,
                 frames.Status: _on_status, frames.Exit: _on_exit, frames.Reject: _on_reject,
                 frames.Drop: _on_drop, frames.Node: _on_node, frames.Clock: _on_clock,
                 frames.Output: _on_output}
