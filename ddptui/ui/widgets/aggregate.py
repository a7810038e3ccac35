"""Lanes for more ranks than a pane has rows: one band per host (or, on one host, per block
of ranks) drawn as two lanes, the median (p50) and the 95th percentile (p95) of every span's
start and end over the band's ranks; then the slowest ranks of the step and the culprit the
per-layer evidence names, each as its own lane, labelled.

`aggregate(view, lanes, groups, culprit)` turns a StepView with one lane per rank into one
with at most `lanes` lanes, keyed by lane ids (real ranks for rank lanes, negative ids for
band lanes, in drawing order), and the labels of every lane: (compute row, comm row), each
at most GUTTER cells. Pure; the app calls `for_pane` with what the pane has room for.
"""
from __future__ import annotations

from array import array
from itertools import compress

from ranks.wire import BWD, COMM_KINDS, FWD, OTHER, PASS

from ddptui.model.kept import Kept
from ddptui.model.views import Lane, StepView

BAND_BASE = -(10 ** 6)  # band lane ids: BAND_BASE + 2 * group + (0: p50, 1: p95), ascending
SLOWEST = 2  # rank lanes for the slowest ranks of the step (room permitting)
LANES_PER_RANK = 2  # a rank's compute and comm lanes, one row each at the thinnest
MIN_RANKS = 9  # up to 8 ranks, those that do not fit are hidden (and said so) rather than banded


def _q(sorted_vals: list[float], q: float) -> float:
    return sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))]


def columns(spans, r: int) -> tuple:
    """A rank's spans as columns (views.RankSpans.columns: kinds, idxs, starts, ends, ready,
    others; times in µs), from a RankSpans without making Spans, else from its list."""
    made = getattr(spans, "columns", None)
    if made is not None:
        return made(r)
    sp = spans[r]
    comms = [s for s in sp if s.kind in COMM_KINDS]
    us = (lambda ms: None if ms is None else ms * 1e3)  # noqa: E731
    return ([s.kind for s in sp], [s.idx for s in sp], [s.start_ms * 1e3 for s in sp], [s.end_ms * 1e3 for s in sp],
            [us(s.issued_ms) for s in comms], [us(s.others_ms) for s in comms])


def _quantiles(col, qs: tuple[float, ...]) -> list:
    """The q-quantiles of a column (None: nothing known in it)."""
    vals = sorted(col) if None not in col else sorted(v for v in col if v is not None)
    return [_q(vals, q) / 1e3 for q in qs] if vals else [None] * len(qs)


def _sans_other(c: tuple) -> tuple:
    """A rank's columns without its OTHER spans (an evaluation of its own, in no band: the
    ranks of a band are those with the same spans as the first)."""
    kinds = c[0]
    if OTHER not in kinds:
        return c
    keep = [k != OTHER for k in kinds]
    idx = c[1]
    idx = array(idx.typecode, compress(idx, keep)) if isinstance(idx, array) else list(compress(idx, keep))
    kinds = bytes(compress(kinds, keep)) if isinstance(kinds, bytes) else list(compress(kinds, keep))
    return (kinds, idx, list(compress(c[2], keep)), list(compress(c[3], keep)), c[4], c[5])


def band_spans(cols_of: dict[int, tuple], ranks: list[int], qs: tuple[float, ...]) -> list[Lane]:
    """The q-quantile lanes of these ranks, one per q of `qs`: span by span (ranks of one
    strategy send the same spans in the same order; ranks whose spans differ from the
    first's are left out), the quantile of the starts, ends and ready times (each column
    sorted once for every q). `cols_of`: rank -> its columns (`columns`): no Span is made
    for a rank, and the columns are turned and sorted in C."""
    cols = [_sans_other(cols_of[r]) for r in ranks if r in cols_of]
    if not cols:
        return [Lane([], [], [], [], [], [], []) for _ in qs]
    kinds, idxs = cols[0][0], cols[0][1]
    cols = [c for c in cols if c[0] == kinds and c[1] == idxs]
    starts, ends = zip(*(c[2] for c in cols)), zip(*(c[3] for c in cols))
    ready, others = zip(*(c[4] for c in cols)), zip(*(c[5] for c in cols))
    n = len(qs)
    lanes = [([], [], [], []) for _ in qs]  # per q: starts, ends, ready, others
    for kind, a_col, z_col in zip(kinds, starts, ends):
        a_q, z_q = _quantiles(a_col, qs), _quantiles(z_col, qs)
        r_q = o_q = (None,) * n
        if kind in COMM_KINDS:
            r_q, o_q = _quantiles(next(ready), qs), _quantiles(next(others), qs)
        for (st, en, rd, ot), a, z, r, o in zip(lanes, a_q, z_q, r_q, o_q):
            st.append(a)
            en.append(max(z, a))
            if kind in COMM_KINDS:
                rd.append(r)
                ot.append(o)
    return [Lane(kinds, idxs, st, en, rd, ot, [False] * len(rd)) for st, en, rd, ot in lanes]


_COMPUTE = bytes(int(k in (FWD, BWD, PASS)) for k in range(256))  # kinds.translate: 1 for a forward or backward


def compute_end(cols: tuple) -> float:
    """When a rank's forward and backward were done, ms, from its columns (a late rank makes
    the others wait)."""
    kinds, ends = cols[0], cols[3]
    mask = kinds.translate(_COMPUTE) if isinstance(kinds, bytes) else [k in (FWD, BWD, PASS) for k in kinds]
    return max(compress(ends, mask), default=0.0) / 1e3


def groups_of(ranks: list[int], hosts: dict[int, list[int]] | None, n: int) -> list[tuple[str, list[int]]]:
    """(label, ranks) of at most n bands: per host when there are several (hosts beyond n
    share the last band), else n blocks of consecutive ranks."""
    have = set(ranks)
    if hosts and len(hosts) > 1:
        out = [(f"n{h}", [r for r in rs if r in have]) for h, rs in sorted(hosts.items())]
        out = [g for g in out if g[1]]
        if len(out) > n:
            rest = [r for _, rs in out[n - 1:] for r in rs]
            out = out[:n - 1] + [(f"n{out[n - 1][0][1:]}+", rest)]
        return out
    size = -(-len(ranks) // max(1, n))
    return [(f"r{b[0]}-{b[-1]}" if len(b) > 1 else f"r{b[0]}", b)
            for b in (ranks[i:i + size] for i in range(0, len(ranks), size))]


def aggregate(view: StepView, lanes: int, hosts: dict[int, list[int]] | None = None,
              culprit: int | None = None) -> tuple[StepView, dict[int, tuple[str, str]]]:
    """A view of at most `lanes` lanes (>= 2) for a view with more ranks than that."""
    ranks = sorted(view.spans)
    cols = {r: columns(view.spans, r) for r in ranks}
    singles: list[int] = []
    if culprit is not None and culprit in view.spans and lanes >= 3:  # a band needs 2 lanes
        singles.append(culprit)
    left = lanes - len(singles)
    slow_n = max(0, min(SLOWEST, left - 2))
    n_groups = max(1, (left - slow_n) // 2)
    for r in sorted(ranks, key=lambda r: (-compute_end(cols[r]), r)):
        if len(singles) >= lanes - 2 * n_groups:
            break
        if r not in singles:
            singles.append(r)
    spans: dict[int, Lane] = {}
    labels: dict[int, tuple[str, str]] = {}
    qs = (0.5, 0.95)
    for g, (name, members) in enumerate(groups_of(ranks, hosts, n_groups)):
        for j, (q, band) in enumerate(zip(qs, band_spans(cols, members, qs))):
            lane = BAND_BASE + 2 * g + j
            spans[lane] = band
            labels[lane] = (f"p{int(q * 100)} comp ", f"{name[:8]:<9}" if j == 0 else f"×{len(members):<8}")
    for r in singles:
        spans[r] = view.spans[r]
        labels[r] = (f"r{r:<3}comp "[:9] if r < 1000 else f"r{r}comp"[:9],
                     "culprit  " if r == culprit else "slowest  ")
    out = StepView(view.strategy, view.step, spans, view.figures, view.duration_ms, view.bucket_cap_mb,
                   view.n_buckets, list(view.marks), view.waits, view.colls)
    return out, labels


_KEPT = Kept(16)  # (the Updater's thread makes them ahead of the drawing thread)


def banded(view: StepView | None, rows: int) -> bool:
    """Whether a pane `rows` tall draws this view aggregated (for_pane): more ranks than fit
    (header, axis and two rows a rank), and at least MIN_RANKS of them."""
    if view is None:
        return False
    n = len(view.spans)
    return n > max(2, (rows - 2) // LANES_PER_RANK) and n >= MIN_RANKS


def for_pane(view: StepView | None, rows: int, hosts: dict[int, list[int]] | None = None,
             culprit: int | None = None) -> tuple[StepView | None, dict | None]:
    """The view a pane `rows` tall draws: as is while every rank fits (header, axis and
    two rows a rank) or there are fewer than MIN_RANKS, else aggregated (kept while the same
    view is drawn again)."""
    if not banded(view, rows):
        return view, None
    lanes = max(2, (rows - 2) // LANES_PER_RANK)
    key = (id(view), lanes, culprit, tuple(sorted(hosts)) if hosts else None)
    return _KEPT.get(key, (view,), lambda: aggregate(view, lanes, hosts, culprit))
