"""A step's figures for every rank at once: the span batches of a strategy step stacked into
arrays (ranks x spans) and the per-rank figures and who-waits-for-whom computed column-wise
with numpy, instead of rank by rank in Python.

Every rank of a strategy sends the same kind and idx columns each step (columns.Placement):
then the timing columns of all ranks form matrices, and the figures of 1,024 ranks cost a
few array operations (measured: benchmarks P11). The results are the ones figures.rank_step
and stragglers.step_waits give, value for value (tests/test_columnwise.py holds them side
by side); a step whose ranks differ in their columns, that repeats a section (micro-steps),
or whose ranks live on several hosts (a clock correction per rank) takes those functions.
"""
from __future__ import annotations

from statistics import median

import numpy as np

from ranks import spec

from . import figures, stragglers
from .columns import placement

MIN_RANKS = 2  # below this, nothing to stack
# from this many ranks a step's per-layer evidence is made with its figures, from the same
# matrices (made when first asked for, the evidence of the steps since the screen last took
# a newer one would be made all at once then, on the way to the frame)
EAGER_EVIDENCE_FROM = 64


def _matrix(cols: list, n: int) -> np.ndarray:
    """The ranks' u32 columns (array('I'), n each) as one int64 matrix (ranks x n)."""
    if n == 0:
        return np.zeros((len(cols), 0), dtype=np.int64)
    return np.frombuffer(b"".join(c.tobytes() for c in cols), dtype=np.uint32).reshape(len(cols), n).astype(np.int64)


def union_lengths(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per row, the length of the union of its [start, end) intervals (figures.union_length,
    row by row): sorted by start, each interval adds what reaches past every end before it."""
    if starts.shape[1] == 0:
        return np.zeros(starts.shape[0], dtype=np.int64)
    order = np.argsort(starts, axis=1, kind="stable")
    s = np.take_along_axis(starts, order, axis=1)
    e = np.take_along_axis(ends, order, axis=1)
    reach = np.maximum.accumulate(e, axis=1)
    prev = np.empty_like(reach)
    prev[:, 0] = np.iinfo(np.int64).min // 2
    prev[:, 1:] = reach[:, :-1]
    return np.clip(e - np.maximum(s, prev), 0, None).sum(axis=1)


def usable(batches: dict, to_common=stragglers.same_clock):
    """The batches' shared Placement when the column-wise figures apply, else None."""
    if len(batches) < MIN_RANKS or to_common is not stragglers.same_clock:
        return None
    it = iter(batches.values())
    place = placement(next(it))
    if place.sections is None:  # (a section recurs: micro-steps)
        return None
    for b in it:
        if placement(b) is not place:
            return None
    return place


class Stacked:
    """A strategy step's span batches (rank -> batch, sharing one Placement) as matrices."""

    def __init__(self, batches: dict, place):
        self.ranks = sorted(batches)
        bs = [batches[r] for r in self.ranks]
        self.batches, self.place = bs, place
        n = len(bs[0].kind)
        self.t0 = _matrix([b.t0 for b in bs], n)
        self.t1 = _matrix([b.t1 for b in bs], n)
        self.iss = _matrix([b.iss for b in bs], len(bs[0].iss))
        self.base = np.array([b.base_ns for b in bs], dtype=np.int64)


def rank_steps(sk: Stacked, comm: dict, world: int) -> dict:
    """rank -> figures.RankStep, as figures.rank_step gives it for each rank (comm: rank ->
    (comm_bytes, coll_row) functions)."""
    place, t0, t1 = sk.place, sk.t0, sk.t1
    if place.step is None:
        step = np.zeros(len(sk.ranks), dtype=np.int64)
    else:
        step = t1[:, place.step] - t0[:, place.step]
    cp, mp = place.compute, place.comm
    cu = union_lengths(t0[:, cp], t1[:, cp])
    mu = union_lengths(t0[:, mp], t1[:, mp])
    both = cp + mp
    bu = union_lengths(t0[:, both], t1[:, both])
    calls = len(mp)
    out = {}
    step_l, cu_l, mu_l, ex_l = step.tolist(), cu.tolist(), mu.tolist(), (bu - cu).tolist()
    colls = len(place.colls)
    ar_factor = spec.bus_factor("all_reduce", world)
    for i, r in enumerate(sk.ranks):
        comm_bytes, coll_row = comm[r]
        if not colls:
            nbytes = sum(map(comm_bytes, place.comm_idx))
            out[r] = figures.RankStep(step_l[i] / 1e3, cu_l[i] / 1e3, mu_l[i] / 1e3, ex_l[i] / 1e3, calls, nbytes)
            continue
        ar_bytes = sum(map(comm_bytes, place.allreduce_idx))
        nbytes, bus = ar_bytes, ar_bytes * ar_factor
        for j in place.coll_idx:
            row = coll_row(j) if coll_row is not None else None
            if row is not None:
                nbytes += row[2]
                bus += row[2] * spec.bus_factor(row[1], row[3])
        out[r] = figures.RankStep(step_l[i] / 1e3, cu_l[i] / 1e3, mu_l[i] / 1e3, ex_l[i] / 1e3, calls, nbytes,
                                  colls, bus)
    return out


def step_waits(sk: Stacked, step_ms: float) -> stragglers.StepWaits | None:
    """stragglers.step_waits of the stacked step (one host: one clock)."""
    place, ranks = sk.place, sk.ranks
    mp = place.comm
    if not mp:
        return None
    base = sk.base[:, None]
    ready = base + sk.iss * 1000
    end = base + sk.t1[:, mp] * 1000
    last_ready = ready.max(axis=0)
    last_at = ready.argmax(axis=0)  # (the first: the lowest rank among those tied)
    first_ready = ready.min(axis=0)
    rcols, ecols = ready.T.tolist(), end.T.tolist()
    cols = []
    for j, key in enumerate(place.comm_keys):
        lr = int(last_ready[j])
        cols.append(stragglers.Collective(key[1], key[2], dict(zip(ranks, rcols[j])), dict(zip(ranks, ecols[j])),
                                          ranks[int(last_at[j])], lr, key[0]))
    waits = union_lengths(ready, np.broadcast_to(last_ready, ready.shape)).tolist()
    wait = {r: waits[i] / 1e6 for i, r in enumerate(ranks)}
    caused = {r: 0.0 for r in ranks}
    for c, fr in zip(cols, first_ready.tolist()):
        worst = (c.last_ready - fr) / 1e6
        if worst > caused[c.last]:
            caused[c.last] = worst
    last = max(ranks, key=lambda r: (caused[r], -r))
    gaps = np.maximum(0, end - last_ready).T.tolist()
    transfer = median(int(median(g)) for g in gaps) / 1e6
    sw = stragglers.StepWaits(cols, wait, caused, transfer, last if caused[last] > 0 else None)
    sw.step = sk.batches[0].step
    if place.step is None:
        sw.t_ns = int(sk.base.min())
    else:
        sw.t_ns = int((sk.base + sk.t0[:, place.step] * 1000).min())
    sw.batches = dict(zip(ranks, sk.batches))
    waited = caused[last]
    if waited >= stragglers.MIN_CULPRIT_WAIT_MS and waited >= stragglers.MIN_CULPRIT_SHARE * step_ms:
        kind, idx = sk.batches[0].kind, sk.batches[0].idx
        bpos = [i for i in range(len(kind)) if kind[i] == stragglers.BWD]
        layers = [idx[i] for i in bpos]
        d = ((sk.t1[:, bpos] - sk.t0[:, bpos]) / 1000).T.tolist()  # layer -> per rank, ms
        li = ranks.index(last)
        excess = {}
        for layer, col in zip(layers, d):
            ref = col[:li] + col[li + 1:]
            if ref:
                excess[layer] = col[li] - median(ref)
        sw.layer_excess_ms = excess
        if excess:
            layer = max(excess, key=excess.get)
            sw.culprit = (last, layer, excess[layer])
    return sw


_ORDERS: dict = {}  # id(Placement) -> (it, its sections' order, the sections in that order)


def _sorted_sections(place) -> tuple[list[int], tuple]:
    got = _ORDERS.get(id(place))
    if got is None or got[0] is not place:
        secs = place.sections
        order = sorted(range(len(secs)), key=secs.__getitem__)
        if len(_ORDERS) > 64:
            _ORDERS.clear()
        got = _ORDERS[id(place)] = (place, order, tuple(secs[j] for j in order))
    return got[1], got[2]


def sections_excess(batches: dict, sk: "Stacked | None" = None):
    """(flat, excess, ref) of a step, as evidence.flatten(step_sections), step_excess give them
    (StepWaits' per-layer evidence), or None when the batches do not share one Placement
    (`sk`: the batches stacked already).
    Every section at once (the same sorts, sums and halves as rank by rank: the same values);
    `excess` is a mapping whose rank's dict is made when asked for (the evidence asks for the
    few ranks a finding names: at 1,024 ranks a dict per rank was most of the cost)."""
    from . import evidence
    place = usable(batches) if sk is None else sk.place
    if place is None:
        return None
    ranks = sorted(batches) if sk is None else sk.ranks
    cp = place.layered
    if sk is None:
        bs = [batches[r] for r in ranks]
        n_cols = len(bs[0].kind)
        t0, t1 = _matrix([b.t0 for b in bs], n_cols)[:, cp], _matrix([b.t1 for b in bs], n_cols)[:, cp]
    else:  # (the step's matrices, made for its figures)
        t0, t1 = sk.t0[:, cp], sk.t1[:, cp]
    d = (t1 - t0) / 1000  # ranks x sections, ms
    secs = place.sections
    n = len(ranks)
    order, sorted_secs = _sorted_sections(place)
    # flat: keys made as evidence.flatten makes them (the same object while the shape holds;
    # the sections' tuple is the same object each step: compared by identity)
    shape = (tuple(ranks), (sorted_secs,) * n)
    last_shape, keys = evidence._last_keys[0]
    if shape != last_shape:
        keys = tuple((r, key) for r in ranks for key in sorted_secs)
        evidence._last_keys[0] = (shape, keys)
    vals = d[:, order].ravel()  # (many columns: kept an array, stacked as one by the judge)
    flat = (keys, vals if len(keys) >= evidence.COLUMNWISE_FROM else tuple(vals.tolist()))
    ex, med = evidence.over_median(d)
    return flat, evidence.RankExcess(ranks, list(secs), ex), dict(zip(secs, med.tolist()))


def bucket_step(batches) -> dict | None:
    """figures.bucket_step of a step's batches (a list), or None when they do not share one
    Placement: per AllReduce idx, (mean time ms, mean % of it overlapped with compute). A
    collective's overlap with the union U of compute is |U| + its length - |U with it|."""
    bd = dict(enumerate(batches))
    place = usable(bd)
    if place is None:
        return None
    from math import fsum
    sk = Stacked(bd, place)
    cp = place.compute
    cs, ce = sk.t0[:, cp], sk.t1[:, cp]
    cu = union_lengths(cs, ce)
    times: dict = {}
    over: dict = {}
    kind, idx = sk.batches[0].kind, sk.batches[0].idx
    pos = [i for i in range(len(kind)) if kind[i] == 2]  # (figures.bucket_step: COMM spans)
    for i in pos:
        a, z = sk.t0[:, i], sk.t1[:, i]
        d = z - a
        both = union_lengths(np.concatenate([cs, a[:, None]], axis=1), np.concatenate([ce, z[:, None]], axis=1))
        ov = cu + np.clip(d, 0, None) - both
        times.setdefault(idx[i], []).extend((d / 1e3).tolist())
        keep = d > 0
        if keep.any():
            over.setdefault(idx[i], []).extend((100.0 * ov[keep] / d[keep]).tolist())
    return {i: (fsum(ts) / len(ts), fsum(over[i]) / len(over[i]) if i in over else None) for i, ts in times.items()}
