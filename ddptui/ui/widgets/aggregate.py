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

from ranks.wire import BWD, FWD

from ddptui.model.kept import Kept
from ddptui.model.views import Span, StepView

BAND_BASE = -(10 ** 6)  # band lane ids: BAND_BASE + 2 * group + (0: p50, 1: p95), ascending
SLOWEST = 2  # rank lanes for the slowest ranks of the step (room permitting)
LANES_PER_RANK = 2  # a rank's compute and comm lanes, one row each at the thinnest
MIN_RANKS = 9  # up to 8 ranks, those that do not fit are hidden (and said so) rather than banded


def _q(sorted_vals: list[float], q: float) -> float:
    return sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))]


def band_spans(spans: dict[int, list[Span]], ranks: list[int], qs: tuple[float, ...]) -> list[list[Span]]:
    """The q-quantile lanes of these ranks, one per q of `qs`: span by span (ranks of one
    strategy send the same spans in the same order; ranks whose list differs from the
    first's are left out), the quantile of the starts, ends and ready times (each column
    sorted once for every q)."""
    lists = [spans[r] for r in ranks if r in spans]
    if not lists:
        return [[] for _ in qs]
    shape = [(s.kind, s.idx) for s in lists[0]]
    lists = [sp for sp in lists if len(sp) == len(shape) and [(s.kind, s.idx) for s in sp] == shape]
    out: list[list[Span]] = [[] for _ in qs]
    for i, (kind, idx) in enumerate(shape):
        col = [sp[i] for sp in lists]
        starts = sorted([s.start_ms for s in col])
        ends = sorted([s.end_ms for s in col])
        ready = sorted([s.issued_ms for s in col if s.issued_ms is not None])
        others = sorted([s.others_ms for s in col if s.others_ms is not None])
        for lane, q in zip(out, qs):
            a = _q(starts, q)
            lane.append(Span(kind, idx, a, max(_q(ends, q), a), _q(ready, q) if ready else None,
                             _q(others, q) if others else None, False))
    return out


def compute_end(spans: list[Span]) -> float:
    """When the rank's forward and backward were done (a late rank makes the others wait)."""
    return max((s.end_ms for s in spans if s.kind == FWD or s.kind == BWD), default=0.0)


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
    singles: list[int] = []
    if culprit is not None and culprit in view.spans and lanes >= 3:  # a band needs 2 lanes
        singles.append(culprit)
    left = lanes - len(singles)
    slow_n = max(0, min(SLOWEST, left - 2))
    n_groups = max(1, (left - slow_n) // 2)
    for r in sorted(ranks, key=lambda r: (-compute_end(view.spans[r]), r)):
        if len(singles) >= lanes - 2 * n_groups:
            break
        if r not in singles:
            singles.append(r)
    spans: dict[int, list[Span]] = {}
    labels: dict[int, tuple[str, str]] = {}
    qs = (0.5, 0.95)
    for g, (name, members) in enumerate(groups_of(ranks, hosts, n_groups)):
        for j, (q, band) in enumerate(zip(qs, band_spans(view.spans, members, qs))):
            lane = BAND_BASE + 2 * g + j
            spans[lane] = band
            labels[lane] = (f"p{int(q * 100)} comp ", f"{name[:8]:<9}" if j == 0 else f"×{len(members):<8}")
    for r in singles:
        spans[r] = view.spans[r]
        labels[r] = (f"r{r:<3}comp "[:9] if r < 1000 else f"r{r}comp"[:9],
                     "culprit  " if r == culprit else "slowest  ")
    out = StepView(view.strategy, view.step, spans, view.figures, view.duration_ms, view.bucket_cap_mb,
                   view.n_buckets, list(view.marks), view.waits)
    return out, labels


_KEPT = Kept(16)  # (the Updater's thread makes them ahead of the drawing thread)


def for_pane(view: StepView | None, rows: int, hosts: dict[int, list[int]] | None = None,
             culprit: int | None = None) -> tuple[StepView | None, dict | None]:
    """The view a pane `rows` tall draws: as is while every rank fits (header, axis and
    two rows a rank) or there are fewer than MIN_RANKS, else aggregated (kept while the same
    view is drawn again)."""
    if view is None:
        return None, None
    lanes = max(2, (rows - 2) // LANES_PER_RANK)
    if len(view.spans) <= lanes or len(view.spans) < MIN_RANKS:
        return view, None
    key = (id(view), lanes, culprit, tuple(sorted(hosts)) if hosts else None)
    return _KEPT.get(key, (view,), lambda: aggregate(view, lanes, hosts, culprit))
