"""Pure functions from spans to the figures that matter (no state, no I/O)."""
from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from dataclasses import asdict, dataclass

from ranks import spec
from ranks.spec import strategy_ranks
from ranks.wire import BWD, COMM, FWD, MB, PASS, PIPE, STEP, SpanBatch

from .columns import placement


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping [a, b) intervals; result sorted and disjoint."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def union_length(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of [a, b) intervals (sorts the list in place)."""
    intervals.sort()
    total = 0
    cur_a = cur_z = -(1 << 62)
    for a, z in intervals:
        if a > cur_z:
            if z > a:
                total += cur_z - cur_a
                cur_a, cur_z = a, z
        elif z > cur_z:
            cur_z = z
    return total + cur_z - cur_a


def length(intervals) -> int:
    return sum(b - a for a, b in intervals)


def intersection_length(xs, ys) -> int:
    """Total overlap of two sorted disjoint interval lists."""
    i = j = total = 0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def difference(xs, ys) -> list[tuple[int, int]]:
    """xs less ys, both sorted and disjoint: sorted, disjoint."""
    out: list[tuple[int, int]] = []
    j = 0
    for a, z in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < z:
            lo, hi = ys[k]
            if lo > a:
                out.append((a, lo))
            a = max(a, hi)
            if a >= z:
                break
            k += 1
        if a < z:
            out.append((a, z))
    return out


def waits_of(b) -> list[tuple[int, int]]:
    """A span batch's WAIT stretches (its compute stood waiting for a collective: wire.WAIT),
    as sorted disjoint intervals; empty for most."""
    w = getattr(b, "waits", None)
    return union(list(zip(w[0::3], w[1::3]))) if w else []  # ((start, end, idx) triples)


def compute_of(b, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of a batch's compute spans (forward and backward) less its WAIT stretches:
    a collective waited on inside a layer is not hidden by that layer, it holds it up."""
    comp, ws = union(spans), waits_of(b)
    return difference(comp, ws) if ws else comp


def mean(xs) -> float:
    """The mean of a non-empty list of floats (statistics.mean sums exactly, with fractions:
    too slow to call per bucket and rank on every frame)."""
    return math.fsum(xs) / len(xs)


def overlap_each(intervals, union) -> list:
    """For each (a, b) of `intervals` (any order), its overlap with `union` (sorted, disjoint):
    a binary search to the first interval of `union` that can touch it, then only those that do."""
    starts = [u[0] for u in union]
    out = []
    for a, b in intervals:
        i = max(bisect_right(starts, a) - 1, 0)
        total = 0
        while i < len(union) and union[i][0] < b:
            lo, hi = union[i]
            if hi > a:
                total += min(hi, b) - max(lo, a)
            i += 1
        out.append(total)
    return out


def bucket_step(batches) -> dict[int, tuple[float, float | None]]:
    """Per AllReduce index of one step (DDP: per bucket), means over the ranks' span batches:
    (time ms, % of that time the rank was computing — forward or backward)."""
    times: dict[int, list[float]] = {}
    over: dict[int, list[float]] = {}
    for b in batches:
        kind, idx, t0, t1 = b.kind, b.idx, b.t0, b.t1
        compute = union([(t0[i], t1[i]) for i in range(len(kind)) if kind[i] in (FWD, BWD, PASS)])
        comms = [i for i in range(len(kind)) if kind[i] == COMM]
        for i, ov in zip(comms, overlap_each([(t0[i], t1[i]) for i in comms], compute)):
            d = t1[i] - t0[i]
            times.setdefault(idx[i], []).append(d / 1e3)
            if d > 0:
                over.setdefault(idx[i], []).append(100.0 * ov / d)
    return {i: (mean(ts), mean(over[i]) if i in over else None) for i, ts in times.items()}


@dataclass
class RankStep:
    """Figures of one rank for one strategy step (times in ms). Communication is every
    collective: the gradient AllReduces (COMM) and any other (COLL); `colls` counts the COLL
    spans among the `calls` and `bus_bytes` is their bytes x each one's ring bus factor
    (spec.bus_factor) added to the AllReduces' bytes x 2(N-1)/N (None: no COLL span)."""
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_ms: float
    calls: int
    bytes: int
    colls: int = 0
    bus_bytes: float | None = None
    bubble_pct: float | None = None  # a pipeline stage's: pipe_bubble (None: no pipeline)


def pipe_busy(b: SpanBatch) -> tuple[int, int] | None:
    """A pipeline stage's step: (µs in its schedule's step() calls, PIPE spans; µs of them
    with a microbatch running, the union of its MB spans inside them); None without a PIPE
    span (no pipeline)."""
    kind = b.kind
    if PIPE not in kind:
        return None
    t0, t1 = b.t0, b.t1
    pipes = [(t0[i], t1[i]) for i in range(len(kind)) if kind[i] == PIPE]
    inside = []
    for i in range(len(kind)):
        if kind[i] == MB:
            for pa, pz in pipes:
                lo, hi = max(t0[i], pa), min(t1[i], pz)
                if hi > lo:
                    inside.append((lo, hi))
    return sum(z - a for a, z in pipes), union_length(inside) if inside else 0


def pipe_bubble(b: SpanBatch) -> float | None:
    """A pipeline stage's bubble in this step, in %: the share of its schedule's step() calls
    in which it ran no microbatch (`pipe_busy`); None without one. ddptui.model.pipeline has
    the rest of a pipeline's figures."""
    got = pipe_busy(b)
    if got is None or got[0] <= 0:
        return None
    total, busy = got
    return 100.0 * max(0, total - busy) / total


def rank_step(b: SpanBatch, comm_bytes, coll_row=None, world: int = 0) -> RankStep:
    """comm_bytes(idx) -> bytes carried by AllReduce idx (a parameter or a bucket);
    coll_row(idx) -> the collectives table row of a COLL span (None: not known: counted, no
    bytes); world: the AllReduces' ring size. Exposed communication is the union of compute
    and communication less the union of compute; compute is the forward and backward less
    the stretches they stood waiting for a collective (WAIT: `compute_of`)."""
    t0, t1 = b.t0, b.t1
    place = placement(b)  # (the spans' positions by kind: the timing columns read in C)
    step = 0 if place.step is None else t1[place.step] - t0[place.step]
    comp = list(zip(map(t0.__getitem__, place.compute), map(t1.__getitem__, place.compute)))
    comm = list(zip(map(t0.__getitem__, place.comm), map(t1.__getitem__, place.comm)))
    calls = len(comm)
    if getattr(b, "waits", None):  # (the stretches its compute waited for a collective: not compute)
        comp = compute_of(b, comp)
    both = comp + comm
    cu, mu = union_length(comp), union_length(comm)
    if not place.colls:  # (gradient AllReduces alone: as before every collective was drawn)
        nbytes = sum(map(comm_bytes, place.comm_idx))
        return RankStep(step / 1e3, cu / 1e3, mu / 1e3, (union_length(both) - cu) / 1e3, calls, nbytes,
                        bubble_pct=pipe_bubble(b) if PIPE in b.kind else None)
    ar_bytes = sum(map(comm_bytes, place.allreduce_idx))
    nbytes, bus = ar_bytes, ar_bytes * spec.bus_factor("all_reduce", world)
    for j in place.coll_idx:
        row = coll_row(j) if coll_row is not None else None
        if row is not None:
            nbytes += row[2]
            bus += row[2] * spec.bus_factor(row[1], row[3])
    return RankStep(step / 1e3, cu / 1e3, mu / 1e3, (union_length(both) - cu) / 1e3, calls, nbytes,
                    len(place.colls), bus, pipe_bubble(b) if PIPE in b.kind else None)


def step_interval(batches) -> tuple[int, int] | None:
    """(start, end) in ns on the ranks' clock of one step across its ranks' span batches:
    the first rank's STEP start to the last rank's STEP end; None without a STEP span."""
    a = z = None
    for b in batches:
        for i, k in enumerate(b.kind):
            if k == STEP:
                s, e = b.base_ns + b.t0[i] * 1000, b.base_ns + b.t1[i] * 1000
                a = s if a is None else min(a, s)
                z = e if z is None else max(z, e)
                break
    return None if a is None else (a, z)


def hta_step(b: SpanBatch, r: RankStep) -> tuple[float, float]:
    """One rank's step as HTA's get_comm_comp_overlap counts it: (ms of communication, ms of it
    overlapped by compute). Communication is the union of the collectives (as `r.comm_ms`);
    HTA's compute is every kernel not a collective, the optimizer too, where ddptui's is the
    forward and backward: the optimizer's share is added (0 unless it ran while a collective
    was in flight: checked against the collectives' extent first, the common case)."""
    over = r.comm_ms - r.exposed_ms
    place = placement(b)
    if not place.opt or not place.comm:
        return r.comm_ms, over
    t0, t1 = b.t0, b.t1
    lo = min(t0[i] for i in place.comm)
    hi = max(t1[i] for i in place.comm)
    if all(t1[i] <= lo or t0[i] >= hi for i in place.opt):
        return r.comm_ms, over
    span = lambda pos: [(t0[i], t1[i]) for i in pos]  # noqa: E731
    comp, opt, comm = span(place.compute), span(place.opt), span(place.comm)
    # |comm ∩ (comp ∪ opt)| - |comm ∩ comp| = |comp ∪ opt| - |all| - |comp| + |comp ∪ comm|
    extra = (union_length(comp + opt) - union_length(comp + opt + comm) - union_length(list(comp))
             + union_length(comp + comm))
    return r.comm_ms, over + max(0, extra) / 1e3


def hta_overlap_pct(comm_ms: float, over_ms: float) -> float | None:
    """HTA's comp_comm_overlap_pctg from a rank's totals (rounded to 2 places, as HTA's)."""
    return None if comm_ms <= 0 else round(100.0 * over_ms / comm_ms, 2)


@dataclass
class StepFigures:
    """One strategy step across ranks: slowest rank's step time, mean of the rest."""
    step: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_ms: float
    calls: float
    bytes: float
    colls: float = 0.0  # of the calls, COLL spans (not gradient AllReduces)
    bus_bytes: float | None = None  # bytes x bus factor, with COLL spans (RankStep.bus_bytes)
    bubble_pct: float | None = None  # a pipeline's: its stages' bubble, mean of the ranks


def combine(step: int, per_rank: list[RankStep]) -> StepFigures:
    n = len(per_rank)
    got = StepFigures(
        step=step,
        step_ms=max(r.step_ms for r in per_rank),
        compute_ms=sum(r.compute_ms for r in per_rank) / n,
        comm_ms=sum(r.comm_ms for r in per_rank) / n,
        exposed_ms=sum(r.exposed_ms for r in per_rank) / n,
        calls=sum(r.calls for r in per_rank) / n,
        bytes=sum(r.bytes for r in per_rank) / n,
    )
    if any(r.bus_bytes is not None for r in per_rank):
        got.colls = sum(r.colls for r in per_rank) / n
        got.bus_bytes = sum(r.bus_bytes or 0.0 for r in per_rank) / n
    bub = [r.bubble_pct for r in per_rank if r.bubble_pct is not None]
    if bub:
        got.bubble_pct = sum(bub) / len(bub)
    return got


def overlap_pct(comm_ms: float, exposed_ms: float) -> float | None:
    if comm_ms <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (1.0 - exposed_ms / comm_ms)))


def bus_bandwidth_gbps(nbytes: float, comm_ms: float, world: int) -> float | None:
    """nccl-tests' bus bandwidth: bytes x 2(N-1)/N / time."""
    if comm_ms <= 0 or world < 2:
        return None
    return nbytes * 2 * (world - 1) / world / (comm_ms / 1e3) / 1e9


def summarize(strategy: str, steps: list[StepFigures], batch: int, world: int,
              skip_warmup: bool = True) -> dict:
    """The per-strategy summary (the JSON fields of the headless run)."""
    use = steps[1:] if skip_warmup and len(steps) > 1 else steps
    ranks = strategy_ranks(strategy, world)
    if not use:
        return {"strategy": strategy, "ranks": ranks, "steps": 0}
    med = lambda f: statistics.median(getattr(s, f) for s in use)  # noqa: E731
    step_ms = med("step_ms")
    comm_ms, exposed = med("comm_ms"), med("exposed_ms")
    nbytes = med("bytes")
    bus_bw = bus_bandwidth_gbps(nbytes, comm_ms, ranks)
    calls = med("calls")
    colls = None
    if any(s.bus_bytes is not None for s in use):  # COLL spans: each collective's own bus factor
        bus = statistics.median(s.bus_bytes or 0.0 for s in use)
        bus_bw = bus / (comm_ms / 1e3) / 1e9 if comm_ms > 0 and bus > 0 else None
        colls = med("colls")
        calls = statistics.median(s.calls - s.colls for s in use)
    out = {
        "strategy": strategy,
        "ranks": ranks,
        "steps": len(steps),
        "step_ms_median": step_ms,
        "step_ms_min": min(s.step_ms for s in use),
        "step_ms_max": max(s.step_ms for s in use),
        "compute_ms": med("compute_ms"),
        "comm_ms": comm_ms,
        "exposed_comm_ms": exposed,
        "overlap_pct": overlap_pct(comm_ms, exposed),
        "allreduce_calls_per_step": calls,
        "bytes_per_step": nbytes,
        "samples_per_s": batch / (step_ms / 1e3) if step_ms > 0 and batch > 0 else None,
        "bus_bw_gbps": bus_bw,
    }
    if colls is not None:  # (every other collective: said only by strategies that issued any)
        out["collective_calls_per_step"] = colls
    bub = [s.bubble_pct for s in use if s.bubble_pct is not None]
    if bub:  # (a pipeline: its stages' bubble, the median step; model/pipeline.py per rank)
        out["bubble_pct"] = statistics.median(bub)
    return out


def speedups(rows: list[dict]) -> dict:
    """DDP vs naive, and every strategy vs single, from summaries."""
    by = {r["strategy"]: r for r in rows if r.get("step_ms_median")}
    out = {}
    if "ddp" in by and "naive" in by:
        out["ddp_vs_naive"] = by["naive"]["step_ms_median"] / by["ddp"]["step_ms_median"]
    if "single" in by:
        for s, r in by.items():
            if s != "single":
                out[f"{s}_vs_single"] = by["single"]["step_ms_median"] / r["step_ms_median"]
    return out


__all__ = ["RankStep", "StepFigures", "rank_step", "hta_step", "hta_overlap_pct", "combine", "summarize", "speedups",
           "overlap_pct", "bus_bandwidth_gbps", "union", "intersection_length", "asdict"]
