"""A strategy step's span batches stacked into matrices (ranks x spans), and what both
columnwise (every figure of a step at once) and stragglers (a step's per-layer evidence, made
when first asked for) take from them: `Stacked`, `usable`, `sections_excess`.

A module of its own so that neither of those two imports the other (tests/test_layering.py:
no import cycles, imports inside functions included).
"""
from __future__ import annotations

import numpy as np

from . import evidence
from .columns import placement

MIN_RANKS = 2  # below this, nothing to stack


def same_clock(rank: int, ns: int) -> int:
    """The identity clock correction: every rank on one host (one CLOCK_MONOTONIC)."""
    return ns


def _matrix(cols: list, n: int) -> np.ndarray:
    """The ranks' u32 columns (array('I'), n each) as one int64 matrix (ranks x n)."""
    if n == 0:
        return np.zeros((len(cols), 0), dtype=np.int64)
    return np.frombuffer(b"".join(c.tobytes() for c in cols), dtype=np.uint32).reshape(len(cols), n).astype(np.int64)


def usable(batches: dict, to_common=same_clock):
    """The batches' shared Placement when the column-wise figures apply, else None."""
    if len(batches) < MIN_RANKS or to_common is not same_clock:
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
