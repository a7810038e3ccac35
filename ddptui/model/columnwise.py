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
from .stacked import MIN_RANKS, Stacked, _matrix, sections_excess, usable  # noqa: F401 (re-exported)

# from this many ranks a step's per-layer evidence is made with its figures, from the same
# matrices (made when first asked for, the evidence of the steps since the screen last took
# a newer one would be made all at once then, on the way to the frame)
EAGER_EVIDENCE_FROM = 64


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


def hta_steps(sk: Stacked, rs: dict) -> dict:
    """rank -> figures.hta_step of the stacked step (rs: its figures.RankStep per rank): the
    optimizer's share worked out only for the ranks whose optimizer ran while a collective of
    theirs was in flight (column-wise, the others at once)."""
    place = sk.place
    out = {r: (x.comm_ms, x.comm_ms - x.exposed_ms) for r, x in rs.items()}
    if not place.opt or not place.comm:
        return out
    t0, t1, mp = sk.t0, sk.t1, place.comm
    lo, hi = t0[:, mp].min(axis=1), t1[:, mp].max(axis=1)
    touch = np.zeros(len(sk.ranks), dtype=bool)
    for i in place.opt:
        touch |= (t1[:, i] > lo) & (t0[:, i] < hi)
    for j in np.flatnonzero(touch).tolist():
        r = sk.ranks[j]
        out[r] = figures.hta_step(sk.batches[j], rs[r])
    return out


def step_waits(sk: Stacked, step_ms: float, groups: dict | None = None) -> stragglers.StepWaits | None:
    """stragglers.step_waits of the stacked step (one host: one clock); with collectives on
    other groups than the default one (`groups`: a device mesh), stragglers.step_waits itself."""
    if groups:
        return stragglers.step_waits(dict(zip(sk.ranks, sk.batches)), step_ms, groups=groups)
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
