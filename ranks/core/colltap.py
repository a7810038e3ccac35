"""Every collective a rank issues, timed where every torch.distributed API ends up: the
process group (imports torch, never the app).

`dist.all_reduce`, `all_gather_into_tensor`, `all_gather_single` (FSDP2's), `all_to_all_single`,
`reduce_scatter_tensor`, `broadcast`, `barrier`... each call a method of the `ProcessGroup`
they are given (or the default one); FSDP2 calls them through its own classes, so wrapping
a list of `torch.distributed` functions misses it. `install()` wraps those methods once a
process: a wrapper costs one attribute read when no `CollTap` is active (`_tap is None`),
and otherwise marks the issue, calls the method, and asks the `Work` it returns for a
completion callback (`get_future().then`, on the backend's thread, as DDP's buckets are
timed). The functional collectives (`torch.distributed._functional_collectives`: DTensor's
redistribution, `clip_grad_norm_` on FSDP2's sharded gradients, a script's own `funcol.*`) go
from their C++ ops to the backend without a process-group method: their Python functions are
wrapped instead, the span running from the call to the `wait_tensor` that first needs the
result (their asynchronous result is waited on where it is used; on CPU that is when its end
is known to the host). What is not seen: collectives C++ issues by itself (DDP's reducer without
a comm hook, its buffer broadcasts), the functional collectives' own backward passes, and
those inside a compiled graph (torch.compile traces the wrappers through, untimed).

Each collective issued inside a step becomes a COLL span (ranks.wire) whose idx is a row of
this rank's collectives table: (op, bytes, group, issuing layer, phase, async), one row per
distinct signature, sent as a `colls` frame before the first spans frame that uses it. The
issuing layer and phase: FSDP2's unit when FSDP2 issued it (its all-gather for a unit's
forward or backward, prefetches included; its reduce-scatter after a unit's backward), else
the layer running when it was issued (`UserRecorder.at`), else none.

Where the compute waits for a collective (Recorder.comm_wait: a WAIT, not compute in any
figure): a blocking call for its whole length, a functional collective from the `wait_tensor`
that needs it, an asynchronous call's Work from its `wait()` called from Python (a script's,
FSDP2's), each to its end.

For a hang: every collective entered and not yet left is kept (`inflight`), with the
group's sequence number as this rank counts it; the heartbeat names the oldest. DDP's bucket
AllReduces, timed by ddptui's comm hook as COMM spans (ranks/scripts/commhook.py), are in flight too
(`enter_bucket`), with their bucket (`bucket_of`): a rank blocked in DDP's reducer is inside one.
"""
from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist

from ranks.clock import now_ns
from ranks.wire import COLL, COMM

# ProcessGroup method -> the collective it is (spec.COLL_OPS)
METHOD_OPS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "all_gather_single": "all_gather",
    "allgather_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_single_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "barrier": "barrier", "monitored_barrier": "barrier",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send", "recv": "recv", "recv_anysource": "recv",
}

_graph_task = torch._C._current_graph_task_id  # -1 outside a backward
_tap: "CollTap | None" = None  # the active tap (one a process), or None: the wrappers pass through
_installed = False
_lock = threading.Lock()


# a device mesh's dimensions whose ranks are given the same samples (torchtitan's names): each
# sample counted once in the global batch, by the first rank along them (CollTap.batch_copy)
SAME_BATCH_DIMS = frozenset(("tp", "cp", "sp", "pp", "mp"))


def _nbytes(obj, depth: int = 0) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth < 2 and isinstance(obj, (list, tuple)):
        return sum(_nbytes(x, depth + 1) for x in obj)
    return 0


def _wrap(name: str, op: str, orig):
    def wrapper(self, *args, **kwargs):
        tap = _tap
        if tap is None or tap.suspended:
            return orig(self, *args, **kwargs)
        # the collective's buffer: the larger of its first two arguments (the gathered
        # output of an all-gather, the input of a reduce-scatter, the tensor of an all_reduce)
        n = max(_nbytes(args[0]) if args else 0, _nbytes(args[1]) if len(args) > 1 else 0)
        is_async = bool(getattr(args[-1], "asyncOp", True)) if args else True
        token = tap.enter(op, n, self, is_async, args[0] if args else None)
        try:
            work = orig(self, *args, **kwargs)
            if work is not None and not is_async:
                # a blocking call (async_op=False: FSDP2 on gloo, dist.all_reduce(t)): the API
                # waits for it next; waiting here marks its end on this thread, with no
                # callback on the backend's thread contending for the GIL (a second wait() is
                # a no-op). On CUDA the end is an event on this stream, which waited for it.
                # The compute waited all along (a WAIT span: not hidden by the layer it is in)
                if token.step is not None and token.step is tap.rec.cur and not token.grad:
                    tap.rec.comm_wait(token.step, token.slot, True)
                work.wait()
                tap.left(token)
                return work
        except BaseException:
            tap.left(token)
            raise
        if work is None:  # (a backend that completed it in the call)
            tap.left(token)
            return work
        try:
            work.get_future().then(token.done)
        except Exception:  # noqa: BLE001 - a Work without a future (gloo's send and recv):
            if token.step is not None:  # it ends where it is waited on (a pipeline's P2P ops)
                _keep_work(work, token, True)
            else:
                tap.left(token)
            return work
        if token.step is not None and not token.grad:  # (its wait(), where the script calls it:
            _keep_work(work, token)  # a WAIT from there; a gradient's: the step's own exposed time)
        return work
    wrapper.__name__ = name
    wrapper.__qualname__ = f"ProcessGroup.{name}"
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    return wrapper


def install() -> None:
    """Wrap the process group's collective methods (once a process; idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        pg = dist.ProcessGroup
        for name, op in METHOD_OPS.items():
            orig = getattr(pg, name, None)
            if orig is None or hasattr(orig, "_ddptui_orig"):
                continue
            setattr(pg, name, _wrap(name, op, orig))
        _install_fsdp()
        _install_funcol()
        _install_work_wait()
        _installed = True


# -- an asynchronous call's Work waited on ------------------------------------------------------
# id(a Work an asynchronous call returned, inside a step) -> (Entered, a weak reference to it):
# its wait(), called from Python (a script's `work.wait()`, FSDP2's), is where the compute
# starts waiting for it (Recorder.comm_wait); the end is still the backend's callback
_works: dict = {}
_WORKS_MAX = 256  # (works never waited on from Python are dropped past this)


def _keep_work(work, token, ends: bool = False) -> None:
    """Note an asynchronous call's Work inside a step: its wait() from Python is a WAIT from
    there; `ends`: the collective ends when that wait returns (a Work with no future)."""
    if len(_works) >= _WORKS_MAX:
        for k, v in list(_works.items()):  # (a copy: another thread may issue meanwhile)
            if v[1]() is None:
                _works.pop(k, None)
        if len(_works) >= _WORKS_MAX:
            _works.clear()
    try:
        _works[id(work)] = (token, weakref.ref(work), ends)
    except TypeError:  # (a Work without weak references: its wait is not seen)
        pass


def _install_work_wait() -> None:
    work_cls = getattr(dist, "Work", None)
    orig = getattr(work_cls, "wait", None)
    if orig is None or hasattr(orig, "_ddptui_orig"):
        return

    def wait(self, *args, **kwargs):
        if _works:
            got = _works.pop(id(self), None)
            if got is not None and got[1]() is self:
                token = got[0]
                rec = token.tap.rec
                if token.step is rec.cur:  # (the compute waits from here)
                    rec.comm_wait(token.step, token.slot)
                tap = token.tap
                tap.blocked = token.key  # (the rank stands in this wait: what a hang names)
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    tap.blocked = None
                    if got[2]:  # (no future: it ends as the wait returns)
                        token.done(None)
        return orig(self, *args, **kwargs)
    wait.__wrapped__ = wait._ddptui_orig = orig
    wait.__name__, wait.__qualname__, wait.__doc__ = "wait", "Work.wait", orig.__doc__
    try:
        work_cls.wait = wait
    except (TypeError, AttributeError):  # (a torch whose Work takes no attribute)
        pass


# -- FSDP2: which unit issued it --------------------------------------------------------------
def _install_fsdp() -> None:
    """FSDP2's param groups say which unit an all-gather or a reduce-scatter is for (the
    unit's modules): `unshard` issues the all-gather (forward, backward, prefetches),
    `post_backward` the reduce-scatter of the unit's gradients (a gradient synchronisation).
    Absent FSDP2 (an older torch, another layout): attribution falls back to the running layer."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except Exception:  # noqa: BLE001
        return
    for meth, kind in (("unshard", "gather"), ("post_backward", "reduce")):
        orig = getattr(FSDPParamGroup, meth, None)
        if orig is None or hasattr(orig, "_ddptui_orig"):
            continue
        setattr(FSDPParamGroup, meth, _unit_wrapper(orig, kind))


def _unit_wrapper(orig, kind: str):
    def wrapper(self, *args, **kwargs):
        tap = _tap
        if tap is None:
            return orig(self, *args, **kwargs)
        prev = tap.unit
        tap.unit = (self.modules, kind)
        info = getattr(self, "mesh_info", None)  # (its mesh names the groups it runs on)
        if info is not None:
            tap.learn_mesh(getattr(info, "mesh", None))
        if kind == "reduce" and tap.on_reduce is not None:
            tap.on_reduce(self.modules)
        try:
            return orig(self, *args, **kwargs)
        finally:
            tap.unit = prev
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    wrapper.__name__ = orig.__name__
    return wrapper


# -- the functional collectives --------------------------------------------------------------
FUNCOL_OPS = {  # torch.distributed._functional_collectives function -> the collective it is
    "broadcast": "broadcast", "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_single": "all_gather", "all_gather_tensor": "all_gather",
    "all_gather_single_autograd": "all_gather", "all_gather_tensor_autograd": "all_gather",
    "all_gather_single_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single_autograd": "reduce_scatter", "reduce_scatter_tensor_autograd": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all",
}
_fc_state = threading.local()  # .depth: inside a wrapped functional collective (one calls another)
# id(the storage of the op's output) -> (Entered, a weak reference to that storage, its in-flight
# entry): ended by the first wait_tensor of a tensor on that storage. By storage, not tensor, as
# the backend's own registry of works: what is waited on is often a view of the result made by
# AsyncCollectiveTensor's dispatch (DTensor's to_local(): `view_as`, RowwiseParallel's
# forward output), a tensor object of its own. A storage's Python object lives exactly as long
# as the storage (PyTorch preserves it), so a weak reference to it says the key is still it.
_fc_waits: dict = {}
_FC_WAITS_MAX = 256  # (results never waited on are dropped past this; their spans end at issue)


def _install_funcol() -> None:
    try:
        import torch.distributed._functional_collectives as funcol
    except Exception:  # noqa: BLE001 (a torch without them)
        return
    for name, op in FUNCOL_OPS.items():
        orig = getattr(funcol, name, None)
        if orig is None or hasattr(orig, "_ddptui_orig"):
            continue
        setattr(funcol, name, _funcol_wrapper(funcol, name, op, orig))
    orig = getattr(funcol, "wait_tensor", None)
    if orig is not None and not hasattr(orig, "_ddptui_orig"):
        setattr(funcol, "wait_tensor", _wait_wrapper(orig))


def _group_arg(args, kwargs, name: str):
    """(the functional collective's group argument, its tag): the arguments before `group` in
    its signature (the tensor or tensors, then reduceOp / src / gather_dim / scatter_dim /
    split sizes), then group and tag. (all_gather_inplace is not wrapped: it calls
    all_gather_single, which is.)"""
    if name.endswith("_coalesced") and name.startswith("all_gather"):
        before = 1  # (self, group, tag)
    elif name.startswith("reduce_scatter") or name.startswith("all_to_all"):
        before = 3  # (self, reduceOp, scatter_dim, group) / (self, out splits, in splits, group)
    else:
        before = 2  # (self, reduceOp | src | gather_dim, group)
    group = kwargs["group"] if "group" in kwargs else (args[before] if len(args) > before else None)
    tag = kwargs["tag"] if "tag" in kwargs else (args[before + 1] if len(args) > before + 1 else "")
    return group, tag


def _traced(op: str):
    """The mark a functional collective traced into a compiled graph runs there, each time the
    graph runs (ranks.core.markop, registered once a process, never while Dynamo traces): it
    is counted, by op, with its input's bytes (`CollTap.traced`), not timed."""
    def run(x) -> None:
        tap = _tap
        if tap is not None and tap.rec.cur is not None:
            got = tap.traced.get(op)
            nb = x.numel() * x.element_size()
            tap.traced[op] = (1, nb) if got is None else (got[0] + 1, got[1] + nb)
    return run


def _funcol_wrapper(funcol, name: str, op: str, orig):
    tracing = getattr(funcol, "_are_we_tracing", None) or (lambda: False)
    from ranks.core import markop
    code = markop.register(_traced(op), None)

    def wrapper(*args, **kwargs):
        tap = _tap
        if tap is None or tap.suspended or getattr(_fc_state, "depth", 0):
            return orig(*args, **kwargs)
        if tracing():  # traced into a compiled graph: counted where it runs, not timed
            if args and isinstance(args[0], torch.Tensor):
                args = (markop.marked(args[0], code),) + args[1:]
            return orig(*args, **kwargs)
        try:
            group, tag = _group_arg(args, kwargs, name)
            pg = dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(group, tag))
        except Exception:  # noqa: BLE001 (a group form not known here): not timed
            return orig(*args, **kwargs)
        mesh = group[0] if isinstance(group, tuple) and group else group  # (DTensor's: (mesh, dim))
        if hasattr(mesh, "mesh_dim_names"):
            tap.learn_mesh(mesh)
        # the collective's buffer, as for the process group's methods: the gathered output of
        # an all-gather, the input of a reduce-scatter, the tensor of the others
        n = (_nbytes(args[0]) if args else 0) * (pg.size() if op == "all_gather" else 1)
        token = tap.enter(op, n, pg, True)
        _fc_state.depth = 1
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            tap.left(token)
            raise
        finally:
            _fc_state.depth = 0
        elems = [getattr(t, "elem", None) for t in (out if isinstance(out, (list, tuple)) else (out,))]
        elems = [e for e in elems if isinstance(e, torch.Tensor)]
        if not elems:  # (already waited for: traced, or a result that is not asynchronous)
            tap.left(token)
            return out
        if len(_fc_waits) >= _FC_WAITS_MAX:  # (results dropped unwaited: their tensors are gone)
            for k, v in list(_fc_waits.items()):  # (a copy: another thread may issue meanwhile)
                if v[1]() is None:
                    _fc_waits.pop(k, None)
            if len(_fc_waits) >= _FC_WAITS_MAX:
                _fc_waits.clear()
        # the rank is not inside it while the script goes on (a hang names the collective a
        # rank is blocked in): in flight again only while a wait_tensor blocks on it
        entry = tap.inflight.pop(token.key, None)
        for e in elems:  # (weakly: a result never waited on is not kept alive by ddptui)
            try:
                st = e.untyped_storage()
            except Exception:  # noqa: BLE001 (a result without storage): ends at issue
                continue
            _fc_waits[id(st)] = (token, weakref.ref(st), entry)
        return out
    wrapper.__name__ = name
    wrapper.__qualname__ = f"_functional_collectives.{name}"
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    wrapper.__doc__ = orig.__doc__
    return wrapper


def _wait_wrapper(orig):
    def wait_tensor(tensor):
        if not _fc_waits:
            return orig(tensor)
        try:
            st = tensor.untyped_storage()
        except Exception:  # noqa: BLE001 (no storage: not a result ddptui saw)
            return orig(tensor)
        got = _fc_waits.pop(id(st), None)
        if got is None or got[1]() is not st:
            return orig(tensor)
        token = got[0]
        for k, v in list(_fc_waits.items()):  # a coalesced call's others (a copy: threads)
            if v[0] is token:
                _fc_waits.pop(k, None)
        if got[2] is not None:  # blocked in it now: in flight for a hang's report
            token.tap.inflight[token.key] = got[2]
        rec = token.tap.rec
        if token.step is not None and token.step is rec.cur:  # (the compute waits from here)
            rec.comm_wait(token.step, token.slot)
        try:
            return orig(tensor)
        finally:
            token.tap.left(token)  # (its span's end, and out of flight)
    wait_tensor.__wrapped__ = wait_tensor._ddptui_orig = orig
    wait_tensor.__doc__ = orig.__doc__
    return wait_tensor


class Entered:
    """One collective entered: its recorder slot (None outside a step), its in-flight entry;
    `grad`: a parameter's gradient reduced by hand (a COMM span, as naive's)."""

    __slots__ = ("tap", "step", "slot", "key", "grad")

    def __init__(self, tap, step, slot, key, grad=False):
        self.tap, self.step, self.slot, self.key, self.grad = tap, step, slot, key, grad

    def done(self, fut):
        """The Work's future completed (on the backend's thread): the span's end."""
        tap = self.tap
        if self.step is not None:
            tap.rec.comm_done(self.step, self.slot)
        tap.inflight.pop(self.key, None)
        if tap.p2p_at:
            tap.p2p_at.pop(self.key, None)
        return None


class CollTap:
    """A rank's view of its collectives (one a process, made by RankSession): the table of
    signatures, the collectives in flight, a sequence number per group."""

    def __init__(self, rec, layer_of=None, phase_of=None, on_reduce=None):
        self.rec = rec  # a Recorder: comm_issue / comm_done, cur (and `at`: a UserRecorder's)
        self.at = getattr(rec, "at", None) or (lambda: -1)
        self.on_reduce = on_reduce  # (FSDP unit's modules) -> None: before its reduce-scatter
        self.layer_of = layer_of or (lambda modules: -1)  # FSDP unit modules -> internal layer
        self.phase_of = phase_of  # () -> the phase now (spec.COLL_PHASES)
        self.table: dict[tuple, int] = {}  # signature -> row id
        self.rows: list[tuple] = []  # by id: (op, bytes, group size, group, internal layer, phase, async)
        self.sent = 0  # rows already sent (a colls frame carries the rest)
        self.inflight: dict[int, tuple] = {}  # key -> (op, seq, bytes, internal layer, issued ns)
        self.bucket_of: dict[int, int] = {}  # key -> DDP bucket, of the in-flight bucket AllReduces
        self.seq: dict[int, int] = {}  # id(group) -> collectives issued on it
        self.entered = 0
        self.p2p_of = None  # tensor -> (direction, peer, stage, microbatch) of a pipeline's P2P op (PipeTap's)
        self.p2p_at: dict[int, tuple] = {}  # in-flight key -> that, for a pipeline's send or receive
        self.blocked = None  # the in-flight key whose Work's wait() the rank stands in, if any
        self.unit = None  # (FSDP unit's modules, "gather" | "reduce") while FSDP2 issues
        self.suspended = False  # inside ddptui's own DDP comm hook: its bucket is a COMM span
        self._names: dict[int, tuple[int, str]] = {}  # id(group) -> (size, name)
        self._dims: dict[int, str] = {}  # id(group) -> the mesh dimension it is (learn_mesh)
        self._meshes: set[int] = set()  # id() of the device meshes learnt
        # this rank's inputs a copy of another rank's: not first along a mesh dimension whose
        # ranks see the same samples (tensor, context, sequence or pipeline parallel:
        # SAME_BATCH_DIMS), so that the ranks' batches add up to the global batch (learn_mesh)
        self.batch_copy = False
        # functional collectives traced into a compiled graph, run inside steps: op -> (count,
        # bytes), since the tap began (`_traced`)
        self.traced: dict[str, tuple[int, int]] = {}
        # a model no wrapper synchronises (data parallelism written by hand): tensor -> (its
        # parameter's global index, internal layer) where it is a parameter's .grad, else None.
        # Such an all_reduce is the step's gradient synchronisation: a COMM span of that
        # parameter, as the built-in naive and interleaved strategies draw theirs
        self.grad_of = None
        self.grad_phases: dict[str, int] = {}  # gradient all_reduces by phase (the first step's form)

    def activate(self) -> None:
        global _tap
        install()
        _tap = self

    def deactivate(self) -> None:
        global _tap
        if _tap is self:
            _tap = None

    def learn_mesh(self, mesh) -> None:
        """The process groups of a device mesh (and of its root mesh, flattened dimensions
        included) by the names of their dimensions: a dimension over every rank runs on the
        default group (DeviceMesh reuses it), which says nothing of its dimension itself. Once
        a mesh (the first FSDP2 unit or DTensor collective on it); any failure: not learnt."""
        if mesh is None or id(mesh) in self._meshes:
            return
        self._meshes.add(id(mesh))
        try:
            root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else None
            meshes = [root, mesh] if root is not None and root is not mesh else [mesh]
            if root is not None:
                meshes += list(getattr(root, "_flatten_mapping", {}).values())
            for m in meshes:
                for i, dim in enumerate(m.mesh_dim_names or ()):
                    gid = id(m.get_group(i))
                    if gid not in self._dims:
                        self._dims[gid] = str(dim)
                        self._names.pop(gid, None)  # (named anew by its dimension from now)
        except Exception:  # noqa: BLE001 (another layout of DeviceMesh: its groups' own names)
            pass
        try:  # (the root mesh's dimensions along which this rank's inputs repeat another's)
            top = (mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else None) or mesh
            names, coord = top.mesh_dim_names or (), top.get_coordinate()
            if coord is not None and any(coord[i] != 0 for i, d in enumerate(names) if str(d) in SAME_BATCH_DIMS):
                self.batch_copy = True
        except Exception:  # noqa: BLE001 (not told: every rank's batch counted)
            pass

    def _group(self, pg) -> tuple[int, str]:
        """(size, name) of a process group: `mesh_<dim>` for a device mesh's dimension (as
        DeviceMesh describes its groups), else its description, `world` for the default group
        or another over every rank, `group<n>` for an undescribed one. A group of some of the
        ranks (a mesh dimension's: one of several of the same name) ends in `@<its lowest
        rank>`, which tells its instances apart across ranks (model/collectives.group_parts)."""
        got = self._names.get(id(pg))
        if got is None:
            size, world = int(pg.size()), dist.get_world_size()
            dim = self._dims.get(id(pg))
            try:
                name = pg.group_desc if hasattr(pg, "group_desc") else ""
                name = name or getattr(pg, "group_name", "") or ""
            except Exception:  # noqa: BLE001
                name = ""
            if dim:
                name = f"mesh_{dim}"
            elif name in ("default_pg", "undefined", "", "mesh_default"):
                name = "world" if size == world else f"group{len(self._names)}"
            name = str(name)[:56]
            if size < world:
                try:
                    name += f"@{min(dist.get_process_group_ranks(pg))}"
                except Exception:  # noqa: BLE001 (its ranks unknown: its instances not told apart)
                    pass
            got = self._names[id(pg)] = (size, name)
        return got

    def enter(self, op: str, nbytes: int, pg, is_async: bool = True, tensors=None) -> Entered:
        """A collective is handed to the backend now (the training thread or the autograd
        engine's): its span starts, its in-flight entry is made."""
        self.entered += 1
        gid = id(pg)
        seq = self.seq[gid] = self.seq.get(gid, 0) + 1
        unit = self.unit
        rec = self.rec
        if self.grad_of is not None and op == "all_reduce" and unit is None:
            t = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
            got = self.grad_of(t) if isinstance(t, torch.Tensor) else None
            if got is not None:
                key = self.entered
                self.inflight[key] = (op, seq, nbytes, got[1], now_ns())
                cur = rec.cur
                if cur is None:
                    return Entered(self, None, 0, key)
                phase = self.phase_of() if self.phase_of is not None else "step"
                self.grad_phases[phase] = self.grad_phases.get(phase, 0) + 1
                return Entered(self, cur, rec.comm_issue(got[0]), key, True)
        if unit is not None:
            layer = self.layer_of(unit[0])
            # FSDP2 gathers a unit for its forward (or a prefetch in the forward) or, in a
            # backward, for its backward; it reduce-scatters after a unit's backward
            phase = "backward" if unit[1] == "reduce" or _graph_task() != -1 else "forward"
        else:
            layer = self.at()
            phase = self.phase_of() if self.phase_of is not None else "step"
        key = self.entered
        t = now_ns()
        self.inflight[key] = (op, seq, nbytes, layer, t)
        cur = rec.cur
        if cur is None:
            return Entered(self, None, 0, key)
        size, name = self._group(pg)
        if self.p2p_of is not None and (op == "send" or op == "recv"):
            # a pipeline's: activations forward, gradients backward, to or from its peer
            tt = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            got = self.p2p_of(tt)
            if got is not None:
                phase = got[0]
                name = f"{name}{'>' if op == 'send' else '<'}{got[1]}"[:64]
                self.p2p_at[key] = got
        sig = (op, nbytes, size, name, layer, phase, is_async)
        rid = self.table.get(sig)
        if rid is None:
            rid = self.table[sig] = len(self.rows)
            self.rows.append(sig)
        # FSDP's reduce-scatter after a unit's backward synchronises gradients (a step's mark),
        # and so does its all-reduce (HSDP's across replicas: alone where a shard is one rank)
        synced = unit is not None and unit[1] == "reduce" and op in ("reduce_scatter", "all_reduce")
        slot = rec.comm_issue(rid, COLL, synced)
        return Entered(self, cur, slot, key)

    def enter_bucket(self, bucket: int, nbytes: int, layer: int, pg) -> int:
        """DDP's AllReduce of `bucket` is handed to the backend now (ddptui's comm hook, which
        times it as a COMM span): in flight until `left_bucket(key)`, counted among those
        entered and in its group's sequence (every rank issues DDP's buckets in one order)."""
        self.entered += 1
        gid = id(pg)
        seq = self.seq[gid] = self.seq.get(gid, 0) + 1
        key = self.entered
        self.bucket_of[key] = bucket
        self.inflight[key] = ("all_reduce", seq, nbytes, layer, now_ns())
        return key

    def left_bucket(self, key: int) -> None:
        self.inflight.pop(key, None)
        self.bucket_of.pop(key, None)

    def left(self, token: Entered) -> None:
        """A collective that finished in its call (no Work to wait for)."""
        token.done(None)

    def waiting(self) -> tuple | None:
        """The oldest collective entered and not left: (op, seq, bytes, internal layer, ns)."""
        fl = self.inflight
        if not fl:
            return None
        try:
            return fl[min(fl)]
        except (ValueError, KeyError):  # (a callback removed it meanwhile)
            return None

    def waiting_bucket(self) -> tuple[tuple | None, int | None]:
        """(waiting(), the DDP bucket it is an AllReduce of, or None)."""
        w, bucket, _ = self.waiting_more()
        return w, bucket

    def waiting_more(self) -> tuple[tuple | None, int | None, tuple | None]:
        """(waiting(), the DDP bucket it is an AllReduce of, or None, the pipeline P2P it is:
        (direction, peer, stage, microbatch), or None)."""
        fl = self.inflight
        if not fl:
            return None, None, None
        try:
            key = self.blocked
            if key is None or key not in fl:
                # the oldest entered; a pipeline's sends and receives only while waited on (the
                # schedule issues them and computes on: a stage hung in its compute is inside
                # no collective, whatever it sent)
                p2p = self.p2p_at
                key = min(fl) if not p2p else min((k for k in fl if k not in p2p), default=None)
                if key is None:
                    return None, None, None
            return fl[key], self.bucket_of.get(key), self.p2p_at.get(key)
        except (ValueError, KeyError):  # (a callback removed it meanwhile)
            return None, None, None

    def new_rows(self) -> list[tuple]:
        """Rows not sent yet (marked sent)."""
        rows = self.rows[self.sent:]
        self.sent = len(self.rows)
        return rows


def suspended() -> "_Suspend":
    """(context) collectives inside ddptui's DDP comm hook are the bucket's COMM span, not COLL."""
    return _Suspend()


class _Suspend:
    __slots__ = ("tap", "prev")

    def __enter__(self):
        self.tap = t = _tap
        if t is not None:
            self.prev = t.suspended
            t.suspended = True
        return self

    def __exit__(self, *exc):
        if self.tap is not None:
            self.tap.suspended = self.prev
        return False


__all__ = ["install", "CollTap", "METHOD_OPS", "suspended", "COMM", "COLL"]
