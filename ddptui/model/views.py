"""Views of a Store for drawing: `Span`, `Lane` and `StepView`, and `step_view(store, strategy, step)`,
the step as the UI draws it (Store.view)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ranks.wire import COMM_KINDS

from . import figures as step_figures
from . import stragglers
from .columns import Placement, placement


@dataclass(slots=True)
class Span:
    kind: int
    idx: int
    start_ms: float
    end_ms: float
    issued_ms: float | None = None  # a collective (COMM or COLL): when it was ready on this rank
    others_ms: float | None = None  # a collective: when the last rank was ready (waits until then)
    last: bool = False  # a collective: this rank arrived last


@dataclass
class StepView:
    """One strategy step ready to draw: spans per rank relative to the step's origin."""
    strategy: str
    step: int
    spans: Mapping[int, Lane | list[Span]]  # (RankSpans: a Lane made per rank when asked for)
    figures: dict[int, step_figures.RankStep]
    duration_ms: float
    bucket_cap_mb: float | None = None
    n_buckets: int | None = None
    marks: list[str] = field(default_factory=list)
    waits: stragglers.StepWaits | None = None  # who waited for whom (two or more ranks communicating)
    # rank -> its collectives table (what each COLL span was: Store.collective_tables); None: none
    colls: dict[int, dict[int, tuple]] | None = None
    # (steps with layers marked, steps) of the strategy where its layers are marked on a
    # sample of steps (Store.layer_sampling); None: every step's
    sampling: tuple[int, int] | None = None
    period: int | None = None  # the period of layer marks in force (Store.layer_period)

    def coll_table(self, rank: int) -> dict[int, tuple]:
        """A rank's collectives table (a lane that is no rank's, a band: the first rank's)."""
        if not self.colls:
            return {}
        got = self.colls.get(rank)
        return got if got is not None else next(iter(self.colls.values()))



def sampling_text(sampling: tuple[int, int], short: bool = False, period: int | None = None) -> str:
    """'layers marked 1 step in 16 (6 of 96)' (short: 'layers 1 step in 16'): layer marks on
    a sample of steps, 1 in `period` (the period in force, Store.layer_period; unknown: the
    steps over those marked)."""
    marked, total = sampling
    if not marked:
        return f"layers marked on none of {total} steps"
    every = period or max(1, round(total / marked))
    return f"layers 1 step in {every}" if short else f"layers marked 1 step in {every} ({marked} of {total})"


class Lane(Sequence):
    """One lane's spans as columns, in span order: what the drawing reads (lanes.compute_bars,
    comm_bars), with no Span made. Indexed or iterated it is a list of Spans, made once, when
    first asked for (readers other than the drawing).

    kind, idx: every span's kind and index (bytes / array, or lists); starts, ends: every
    span's start and end, ms after the step's origin; issued, others, last: every collective's
    (in span order) ready time here, the last rank's ready time (None: not known), and
    whether this rank was that last one; waits: (start, end) ms of each stretch its compute
    stood waiting for a collective (wire.WAIT; drawn on the compute lane, empty for most)."""

    __slots__ = ("kind", "idx", "starts", "ends", "issued", "others", "last", "waits", "_placement", "_spans")

    def __init__(self, kind, idx, starts: list, ends: list, issued: list, others: list, last: list,
                 place: Placement | None = None, waits: list | tuple = ()):
        self.kind, self.idx, self.starts, self.ends = kind, idx, starts, ends
        self.issued, self.others, self.last = issued, others, last
        self.waits = waits
        self._placement = place
        self._spans: list[Span] | None = None

    def placement(self) -> Placement:
        """Where each kind of span sits (columns.Placement)."""
        got = self._placement
        if got is None:
            got = self._placement = placement(self)
        return got

    @classmethod
    def of_spans(cls, spans) -> "Lane":
        """A list of Spans as a Lane (a Lane is returned as it is)."""
        if isinstance(spans, Lane):
            return spans
        comms = [s for s in spans if s.kind in COMM_KINDS]
        lane = cls([s.kind for s in spans], [s.idx for s in spans], [s.start_ms for s in spans],
                   [s.end_ms for s in spans], [s.issued_ms for s in comms], [s.others_ms for s in comms],
                   [s.last for s in comms])
        lane._spans = list(spans)
        return lane

    def spans(self) -> list[Span]:
        got = self._spans
        if got is None:
            n = len(self.kind)
            issued, others, last = [None] * n, [None] * n, [False] * n
            for j, i in enumerate(self.placement().comm):
                issued[i], others[i], last[i] = self.issued[j], self.others[j], self.last[j]
            got = self._spans = list(map(Span, self.kind, self.idx, self.starts, self.ends, issued, others, last))
        return got

    def __getitem__(self, i):
        return self.spans()[i]

    def __iter__(self):
        return iter(self.spans())

    def __len__(self) -> int:
        return len(self.kind)


class RankSpans(Mapping):
    """rank -> its spans (a Lane) of one step, made when a rank is first asked for: a pane
    draws the ranks that fit (with 64 ranks, a few), so the others' lanes are never made."""

    def __init__(self, batches: dict, origin: int, arrivals: dict, groups: dict | None = None):
        self._batches, self._origin, self._arrivals = batches, origin, arrivals
        # rank -> row id -> (its group's lowest rank, label) (a device mesh: stragglers.arrival_key)
        self._groups = groups or {}
        self._made: dict[int, Lane] = {}
        self._others_of: dict = {}
        self._arrived_of: dict = {}

    def __getitem__(self, r: int) -> Lane:
        got = self._made.get(r)
        if got is None:
            b = self._batches[r]  # (KeyError for a rank not in the step)
            off = (b.base_ns - self._origin) / 1e6
            place = placement(b)
            others, lasts = self._arrived(place, r)
            got = self._made[r] = Lane(
                b.kind, b.idx, [off + a / 1e3 for a in b.t0], [off + z / 1e3 for z in b.t1],
                [off + x / 1e3 for x in b.iss], others, [last == r for last in lasts], place,
                [(off + a / 1e3, off + z / 1e3) for a, z in step_figures.waits_of(b)] if b.waits else ())
        return got

    def _arrived(self, place: Placement, r: int) -> tuple[list, list]:
        """The last rank's ready time (ms after the origin, or None: not known) and that rank
        (or None) of each AllReduce of a placement (the same on every rank with the same
        AllReduces and groups, so made once for them)."""
        mine = self._groups.get(r)
        key = place if not mine else (place, tuple(sorted(mine.items())))
        got = self._arrived_of.get(key)
        if got is None:
            arrived = list(map(self._arrivals.get, stragglers.rank_arrival_keys(place.comm_keys, mine)))
            got = self._arrived_of[key] = ([None if a is None else a[0] for a in arrived],
                                         [None if a is None else a[1] for a in arrived])
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
        place = placement(b)
        mine = self._groups.get(b.rank)
        key = place if not mine else (place, tuple(sorted(mine.items())))
        got = self._others_of.get(key)
        if got is None:
            got = self._others_of[key] = [None if ms is None else ms * 1e3 for ms in self._arrived(place, b.rank)[0]]
        return got

    def __iter__(self):
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def step_view(store, strategy: str, step: int) -> StepView | None:
    """One step of a strategy as the UI draws it, from a Store (under its lock): spans per rank
    relative to the step's origin, AllReduces marked with their readiness and the last
    arriver, the ranks' figures, the number of buckets, the marks of events at the step. Read
    through the Store's queries, under its lock held throughout (one consistent step)."""
    with store.lock:
        batches = store.step_batches(strategy, step)  # (by rank)
        if not batches:
            return None
        origin = min(b.base_ns for b in batches.values())
        figs = {}
        dur = 0.0
        waits = store.step_waits(strategy, step)
        # (kind, idx, nth) -> (last arriver's ready, ms after origin; the last arriver)
        arrivals = {stragglers.arrival_key(c): ((c.last_ready - origin) / 1e6, c.last)
                    for c in (waits.collectives if waits else [])}
        for r, b in batches.items():
            if len(b.t1):
                dur = max(dur, (b.base_ns - origin) / 1e6 + max(b.t1) / 1e3)
            figs[r] = store.rank_figures(strategy, step, r)
        spans = RankSpans(batches, origin, arrivals, store.coll_groups(strategy) if arrivals else None)
        buckets = store.bucket_count(strategy, step) if strategy == "ddp" else 0
        marks = store.marks(strategy, step)
        cap = store.cap_at(step) if strategy == "ddp" else None
        return StepView(strategy, step, spans, figs, dur, cap,
                        buckets or None, marks, waits,
                        store.collective_tables(strategy) or None, store.layer_sampling(strategy),
                        store.layer_period(strategy))
