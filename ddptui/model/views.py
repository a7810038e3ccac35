"""Views of a Store for drawing: `Span` and `StepView`, and `step_view(store, strategy, step)`,
the step as the UI draws it (Store.view)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import figures as step_figures
from . import stragglers
from .columns import layout


@dataclass(slots=True)
class Span:
    kind: int
    idx: int
    start_ms: float
    end_ms: float
    issued_ms: float | None = None  # AllReduce: when it was ready on this rank
    others_ms: float | None = None  # AllReduce: when the last rank was ready (waits until then)
    last: bool = False  # AllReduce: this rank arrived last


@dataclass
class StepView:
    """One strategy step ready to draw: spans per rank relative to the step's origin."""
    strategy: str
    step: int
    spans: Mapping[int, list[Span]]  # (RankSpans: made per rank when asked for)
    figures: dict[int, step_figures.RankStep]
    duration_ms: float
    bucket_cap_mb: float | None = None
    n_buckets: int | None = None
    marks: list[str] = field(default_factory=list)
    waits: stragglers.StepWaits | None = None  # who waited for whom (two or more ranks communicating)



class RankSpans(Mapping):
    """rank -> its spans (list[Span]) of one step, made when a rank is first asked for: a pane
    draws the ranks that fit (with 64 ranks, a few), so the others' spans are never made."""

    def __init__(self, batches: dict, origin: int, arrivals: dict):
        self._batches, self._origin, self._arrivals = batches, origin, arrivals
        self._made: dict[int, list[Span]] = {}
        self._others_of: dict = {}

    def __getitem__(self, r: int) -> list[Span]:
        got = self._made.get(r)
        if got is None:
            b = self._batches[r]  # (KeyError for a rank not in the step)
            off = (b.base_ns - self._origin) / 1e6
            n = len(b.kind)
            issued, others, last = [None] * n, [None] * n, [False] * n
            arrivals = self._arrivals
            for i, ready_us, key in stragglers.comm_spans(b):
                issued[i] = off + ready_us / 1e3
                arrived = arrivals.get(key)
                if arrived is not None:
                    others[i], last[i] = arrived[0], arrived[1] == r
            got = self._made[r] = list(map(Span, b.kind, b.idx, [off + a / 1e3 for a in b.t0],
                                           [off + z / 1e3 for z in b.t1], issued, others, last))
        return got

    def get(self, r: int, default=None):
        """(Mapping.get, without its try: a pane asks once for each lane it draws.)"""
        got = self._made.get(r)
        if got is None:
            return self[r] if r in self._batches else default
        return got

    def columns(self, r: int) -> tuple:
        """Rank r's spans as columns, no Span made (bands over 64 ranks read every rank):
        (kinds, idxs, starts, ends, ready, others) — starts and ends of every span, ready
        and the last rank's ready (None: not known) of every AllReduce in order, all in µs
        after the step's origin."""
        b = self._batches[r]
        add = ((b.base_ns - self._origin) / 1e3).__add__
        return (b.kind, b.idx, list(map(add, b.t0)), list(map(add, b.t1)), list(map(add, b.iss)),
                self._others(b))

    def _others(self, b) -> list:
        """The last rank's ready time of each AllReduce of a batch (µs; the same on every rank
        with the same AllReduces, so made once for them)."""
        lay = layout(b)
        got = self._others_of.get(lay)
        if got is None:
            arrivals = self._arrivals
            got = self._others_of[lay] = [None if (a := arrivals.get(k)) is None else a[0] * 1e3
                                          for k in lay.comm_keys]
        return got

    def __iter__(self):
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def step_view(store, strategy: str, step: int) -> StepView | None:
    """One step of a strategy as the UI draws it, from a Store (under its lock): spans per rank
    relative to the step's origin, AllReduces marked with their readiness and the last
    arriver, the ranks' figures, the bucket layout size, the marks of events at the step."""
    with store.lock:
        ranks = store.raw.get(strategy, {}).get(step)
        if not ranks:
            return None
        origin = min(b.base_ns for b in ranks.values())
        figs = {}
        dur = 0.0
        waits = store.waits.get(strategy, {}).get(step)
        # (idx, nth) -> (last arriver's ready, ms after origin; the last arriver)
        arrivals = {(c.idx, c.nth): ((c.last_ready - origin) / 1e6, c.last)
                    for c in (waits.collectives if waits else [])}
        batches = dict(sorted(ranks.items()))
        for r, b in batches.items():
            if len(b.t1):
                dur = max(dur, (b.base_ns - origin) / 1e6 + max(b.t1) / 1e3)
            figs[r] = store.rank_figures(strategy, step, r)
        spans = RankSpans(batches, origin, arrivals)
        layout = store.bucket_layout(strategy, step) if strategy == "ddp" else None
        marks = [text for k, s, text in store.events if s == strategy and k == step]
        cap = store.cap_at(step) if strategy == "ddp" else None
        return StepView(strategy, step, spans, figs, dur, cap,
                        len(layout) if layout else None, marks,
                        store.waits.get(strategy, {}).get(step))
