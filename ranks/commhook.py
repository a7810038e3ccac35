"""The DDP comm hook of ddptui.instrument: it times every bucket's AllReduce and runs the user's
own hook (or DDP's default mean) inside. Its state is a small object, as torch's default
hooks take (`CommState`), not the whole handle; bytes sent are counted by wrapping
dist.all_reduce while the user's hook runs (a compression hook sends fewer)."""
from __future__ import annotations

import torch.distributed as dist

from . import colltap


class CommState:
    """What the hook needs: the recorder, the world size, parameter -> index, the user's hook
    and its state; it collects (bucket, params, bytes sent) in `seen` while `track` is on.
    `offset` is added to DDP's bucket index: the buckets of a rank's second DDP module are
    numbered after the first's (by its first parameter's index: never more buckets than
    parameters, so a bucket's number stays below the parameter count the app checks)."""

    __slots__ = ("rec", "world", "pindex", "inner", "inner_state", "seen", "track", "offset")

    def __init__(self, rec, world: int, pindex: dict, inner=None, inner_state=None, offset: int = 0):
        self.rec, self.world, self.pindex = rec, world, pindex
        self.inner, self.inner_state = inner, inner_state
        self.seen: list = []
        self.track = True
        self.offset = offset


_capture: list | None = None  # bytes handed to all_reduce while the user's hook runs
_orig_all_reduce = None


def _counting_all_reduce(tensor, *a, **kw):
    cap = _capture
    if cap is not None:
        cap.append(tensor.numel() * tensor.element_size())
    return _orig_all_reduce(tensor, *a, **kw)


def _install_counter() -> None:
    global _orig_all_reduce
    if _orig_all_reduce is None:
        _orig_all_reduce = dist.all_reduce
        dist.all_reduce = _counting_all_reduce


def timed_hook(h: CommState, bucket):  # DDP requires the name `bucket`
    global _capture
    rec = h.rec
    cur = rec.cur
    inner = h.inner
    if cur is None:  # backward outside any step: not timed
        with colltap.suspended():
            return _call_inner(h, bucket)
    b = bucket.index() + h.offset
    slot = rec.comm_issue(b)
    if inner is None:
        buf = bucket.buffer()
        sent = buf.numel() * buf.element_size()
        with colltap.suspended():  # (the bucket's AllReduce is this COMM span, not a COLL one)
            fut = _default_allreduce(buf, h.world)
    else:
        _install_counter()
        _capture = cap = []
        try:
            with colltap.suspended():
                fut = inner(h.inner_state, bucket)
        finally:
            _capture = None
        buf = bucket.buffer()
        sent = sum(cap) if cap else buf.numel() * buf.element_size()
    if h.track:
        h.seen.append((b, [h.pindex[id(p)] for p in bucket.parameters()], sent))

    def done(f):
        rec.comm_done(cur, slot)
        return f.value()

    return fut.then(done)


def _default_allreduce(buf, world):
    buf.div_(world)  # DDP's default: the mean
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def _call_inner(h: CommState, bucket):
    if h.inner is None:
        return _default_allreduce(bucket.buffer(), h.world)
    return h.inner(h.inner_state, bucket)
