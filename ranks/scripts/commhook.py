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
                fut = _default_allreduce(buf, h)
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


def _default_allreduce(buf, h: "CommState"):
    """DDP's default (allreduce_hook): the mean over DDP's own process group (a DDP on a
    sub-group, a pipeline's or a mesh's data-parallel dimension, reduces over that group
    only, by its size)."""
    pg = h.pg
    n = dist.get_world_size(pg) if pg is not None else h.world
    buf.div_(n)
    return dist.all_reduce(buf, group=pg, async_op=True).get_future().then(lambda f: f.value()[0])


def _call_inner(h: CommState, bucket):
    if h.inner is None:
        return _default_allreduce(bucket.buffer(), h)
    return h.inner(h.inner_state, bucket)


class FrBuckets:
    """DDP's buckets timed by PyTorch itself, with no comm hook (NCCL's own timing; a Flight
    Recorder buffer): DDP keeps its own C++ AllReduce. A post hook on the AccumulateGrad node of
    each bucket's last parameter (DDP's rebuilt buckets hold them in arrival order), registered
    after the reducer's own hook there, so it runs once the reducer has handed the bucket to the
    process group: its ready moment (`Recorder.comm_issue_fr`) and the group's sequence number
    now, the bucket's collective (read, not counted: another collective of the script's on the
    same group moves nothing). Its end and length come later from the Flight Recorder
    (`Recorder.fr`, FlightTimes). In flight from then (a hang names it) until the step ends
    (DDP's backward waits for every bucket) or the group says it completed (`settle`).

    A DDP that never rebuilds its buckets (find_unused_parameters without static_graph) keeps
    its first layout, whose parameters are in DDP's order, not their arrival's, and some of
    which may go unused in a step (the reducer marks those ready itself, no hook of theirs
    runs): every parameter of such a bucket is hooked, and the last to arrive in a step wins
    (its moment and the sequence number then: `set(..., arrival=False)`).
    `armed`: the backward to come synchronises (DDP's `require_backward_grad_sync` at the
    forward, as DDP itself decides; off under no_sync() and nanoGPT's flag): a backward that
    only accumulates issues no bucket, and its hooks mark nothing."""

    __slots__ = ("h", "group", "backend", "handles", "keys", "inflight", "armed", "slots")

    def __init__(self, h: CommState, group: str, backend):
        self.h, self.group, self.backend = h, group, backend
        self.handles: list = []
        self.keys: list = []
        self.inflight: dict = {}  # collective tap's key -> the group's sequence number
        self.armed = True
        self.slots: dict = {}  # (arrival=False) bucket -> (its step record, slot, tap key), this step

    def set(self, per_bucket: list, params: list, nbytes: list, arrival: bool = True) -> None:
        """per_bucket: each bucket's parameter indices (DDP's order; `arrival`: in the order
        their gradients arrive, the last one's hook alone); params: DDP's parameters; nbytes:
        each bucket's bytes."""
        keys = [tuple(ps) for ps in per_bucket]
        if keys == self.keys:
            return
        self.clear()
        self.keys = keys
        h, group, backend = self.h, self.group, self.backend
        rec, offset, inflight, slots = h.rec, h.offset, self.inflight, self.slots
        for b, ps in enumerate(per_bucket):
            layer = _layer_of(h, params[ps[0]])
            if arrival:
                def ready(gi, go, b=b + offset, n=nbytes[b], layer=layer):
                    c = rec.cur
                    if c is None or not self.armed:
                        return
                    rec.comm_issue_fr(b, group)
                    seq = c.comm_end[-1].seq = backend._get_sequence_number_for_group()
                    tap = colltap._tap
                    if tap is not None:
                        inflight[tap.enter_bucket(b, n, layer, h.pg)] = seq
                hooked = [ps[-1]]
            else:
                def ready(gi, go, b=b + offset, n=nbytes[b], layer=layer):
                    c = rec.cur
                    if c is None or not self.armed:
                        return
                    seq = backend._get_sequence_number_for_group()
                    got = slots.get(b)
                    if got is not None and got[0] is c:  # (a later gradient of the bucket: it wins)
                        _, slot, key = got
                        c.comm_end[slot].seq = seq
                        if not (c.defer and slot in c.defer):  # (else: the next boundary's mark)
                            rec._mark_again(c.comm_ready, slot)
                        if key is not None:
                            inflight[key] = seq
                        return
                    rec.comm_issue_fr(b, group)
                    slot = len(c.comm_end) - 1
                    c.comm_end[slot].seq = seq
                    tap = colltap._tap
                    key = tap.enter_bucket(b, n, layer, h.pg) if tap is not None else None
                    if key is not None:
                        inflight[key] = seq
                    slots[b] = (c, slot, key)
                hooked = ps
            for i in hooked:
                p = params[i]
                node = p.view_as(p).grad_fn.next_functions[0][0]  # (as DDP's reducer finds it)
                self.handles.append(node.register_hook(ready))

    def step_done(self) -> None:
        """The step ended: its backward waited for every bucket."""
        tap = colltap._tap
        for key in list(self.inflight):
            self.inflight.pop(key, None)
            if tap is not None:
                tap.left_bucket(key)
        self.slots.clear()

    def settle(self, completed: int) -> None:
        """Buckets the group has completed (its pg_status) out of flight."""
        tap = colltap._tap
        for key, seq in list(self.inflight.items()):
            if seq <= completed:
                self.inflight.pop(key, None)
                if tap is not None:
                    tap.left_bucket(key)

    def clear(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.keys = [], []
        self.slots.clear()


def _layer_of(h: CommState, p) -> int:
    if h.owner is None:
        return -1
    i = h.pindex.get(id(p), -1)
    return h.owner[i] if 0 <= i < len(h.owner) else -1
