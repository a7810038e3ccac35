"""The DDP comm hook of ddptui.instrument: it times every bucket's AllReduce and runs the user's
own hook (or DDP's default mean) inside. Its state is a small object, as torch's default
hooks take (`CommState`), not the whole handle; bytes sent are counted by wrapping
dist.all_reduce while the user's hook runs (a compression hook sends fewer)."""
from __future__ import annotations

import torch.distributed as dist

from ranks.core import colltap


class CommState:
    """What the hook needs: the recorder, the world size, parameter -> index, the user's hook
    and its state; it collects (bucket, params, bytes sent) in `seen` while `track` is on.
    `offset` is added to DDP's bucket index: the buckets of a rank's second DDP module are
    numbered after the first's (by its first parameter's index: never more buckets than
    parameters, so a bucket's number stays below the parameter count the app checks)."""

    __slots__ = ("rec", "world", "pindex", "inner", "inner_state", "seen", "track", "offset", "owner", "pg")

    def __init__(self, rec, world: int, pindex: dict, inner=None, inner_state=None, offset: int = 0,
                 owner: list | None = None, pg=None):
        self.rec, self.world, self.pindex = rec, world, pindex
        self.inner, self.inner_state = inner, inner_state
        self.seen: list = []
        self.track = True
        self.offset = offset
        self.owner = owner  # parameter index -> internal layer (a bucket in flight names one)
        self.pg = pg  # DDP's process group (the bucket AllReduces' sequence numbers)


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
    buf = bucket.buffer()
    # in flight (a hang names the bucket) from before it is handed over: its end may come first
    tap, key = colltap._tap, 0
    if tap is not None:
        key = tap.enter_bucket(b, buf.numel() * buf.element_size(), _layer(h, bucket), h.pg)
    try:
        if inner is None:
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
    except BaseException:
        if key:
            tap.left_bucket(key)
        raise
    if h.track:
        h.seen.append((b, [h.pindex[id(p)] for p in bucket.parameters()], sent))

    def done(f):
        rec.comm_done(cur, slot)
        if key:
            tap.left_bucket(key)
        return f.value()

    return fut.then(done)


def _layer(h: CommState, bucket) -> int:
    """The internal layer of a bucket's first parameter (-1: not known)."""
    if h.owner is None:
        return -1
    try:
        i = h.pindex[id(bucket.parameters()[0])]
        return h.owner[i] if 0 <= i < len(h.owner) else -1
    except (IndexError, KeyError):
        return -1


def _default_allreduce(buf, world):
    buf.div_(world)  # DDP's default: the mean
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def _call_inner(h: CommState, bucket):
    if h.inner is None:
        return _default_allreduce(bucket.buffer(), h.world)
    return h.inner(h.inner_state, bucket)
