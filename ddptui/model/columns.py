"""Where each kind of span sits in a span batch, made once for each set of kind and idx columns.

Every rank of a strategy sends the same kind and idx columns every step (the same layers,
the same collectives in the same order), so the figures of a step (figures.rank_step, who
waited for whom, the per-layer evidence) read the timing columns at known positions, in C,
instead of walking every span of every rank of every step.
"""
from __future__ import annotations

from ranks.wire import BWD, COLL, COMM, FWD, OPT, PASS, STEP


class Placement:
    """Where each kind of span sits in a batch: the positions of its spans by kind.

    comm: every collective (COMM and COLL spans) in span order, as the issue column lists
    them; comm_idx: their idx; comm_keys: (kind, idx, nth), the nth collective of that kind
    and idx in the step, what names the same collective on every rank (kind-aware: a COLL's
    idx, a row of its rank's collectives table, is never taken for a bucket); allreduce and
    colls: the positions within `comm` of the gradient AllReduces (COMM) and of the other
    collectives (COLL); coll_idx: the COLL spans' idx. compute: every forward and backward
    span (PASS too); layered and sections: the layers' own (FWD, BWD) and their (kind, idx);
    opt: the optimizer's spans (not compute for ddptui's figures; HTA counts them: figures.hta_step)."""
    __slots__ = ("compute", "opt", "layered", "comm", "step", "comm_idx", "comm_keys", "sections", "comm_kind",
                 "allreduce", "colls", "allreduce_idx", "coll_idx")

    def __init__(self, kind, idx):
        n = len(kind)
        # forward and backward: layer by layer, or a step's whole passes where its layers were
        # not marked (PASS: layer marks on a sample of steps)
        self.compute = [i for i in range(n) if kind[i] == FWD or kind[i] == BWD or kind[i] == PASS]
        self.layered = [i for i in range(n) if kind[i] == FWD or kind[i] == BWD]  # the layers' own
        self.opt = [i for i in range(n) if kind[i] == OPT]
        self.comm = [i for i in range(n) if kind[i] == COMM or kind[i] == COLL]  # collectives, in order
        steps = [i for i in range(n) if kind[i] == STEP]
        self.step = steps[-1] if steps else None  # (the last STEP span, as the figures always read)
        self.comm_idx = [idx[i] for i in self.comm]
        self.comm_kind = [kind[i] for i in self.comm]
        self.allreduce = [j for j, k in enumerate(self.comm_kind) if k == COMM]
        self.colls = [j for j, k in enumerate(self.comm_kind) if k == COLL]
        self.allreduce_idx = [self.comm_idx[j] for j in self.allreduce]
        self.coll_idx = [self.comm_idx[j] for j in self.colls]
        seen: dict[tuple[int, int], int] = {}
        keys = []
        for k, j in zip(self.comm_kind, self.comm_idx):  # the nth collective of that kind and idx
            n_seen = seen.get((k, j), 0)
            seen[(k, j)] = n_seen + 1
            keys.append((k, j, n_seen))
        self.comm_keys = keys  # what names the same collective on every rank
        secs = [(kind[i], idx[i]) for i in self.layered]
        self.sections = secs if len(set(secs)) == len(secs) else None  # None: a section recurs


_BWD_B, _PASS_B = bytes([BWD]), bytes([PASS])


def layers_marked(b) -> bool:
    """A span batch with its layers' own spans (a backward per layer)."""
    return _BWD_B in b.kind


def whole_passes(b) -> bool:
    """A span batch whose forward and backward are whole passes (its layers not marked:
    layer marks on a sample of steps)."""
    return _PASS_B in b.kind


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
