"""Where each kind of span sits in a span batch, made once for each set of kind and idx columns.

Every rank of a strategy sends the same kind and idx columns every step (the same layers,
the same AllReduces in the same order), so the figures of a step (figures.rank_step, who
waited for whom, the per-layer evidence) read the timing columns at known positions, in C,
instead of walking every span of every rank of every step.
"""
from __future__ import annotations

from ranks.wire import BWD, COMM, FWD, STEP


class Placement:
    """Where each kind of span sits in a batch: the positions of its spans by kind."""
    __slots__ = ("compute", "comm", "step", "comm_idx", "comm_keys", "sections")

    def __init__(self, kind, idx):
        n = len(kind)
        self.compute = [i for i in range(n) if kind[i] == FWD or kind[i] == BWD]  # forward and backward
        self.comm = [i for i in range(n) if kind[i] == COMM]  # AllReduces, in order
        steps = [i for i in range(n) if kind[i] == STEP]
        self.step = steps[-1] if steps else None  # (the last STEP span, as the figures always read)
        self.comm_idx = [idx[i] for i in self.comm]
        seen: dict[int, int] = {}
        keys = []
        for j in self.comm_idx:  # (idx, nth): the nth AllReduce of that parameter or bucket
            seen[j] = seen.get(j, 0) + 1
            keys.append((j, seen[j] - 1))
        self.comm_keys = keys  # what names the same collective on every rank
        secs = [(kind[i], idx[i]) for i in self.compute]
        self.sections = secs if len(set(secs)) == len(secs) else None  # None: a section recurs


_KEPT: dict = {}
_KEPT_MAX = 256


def placement(b) -> Placement:
    """A span batch's Placement (the same object for every batch with the same kind and idx)."""
    idx = b.idx
    key = (bytes(b.kind), idx.tobytes() if hasattr(idx, "tobytes") else tuple(idx))
    got = _KEPT.get(key)
    if got is None:
        if len(_KEPT) >= _KEPT_MAX:
            _KEPT.clear()
        got = _KEPT[key] = Placement(b.kind, idx)
    return got
