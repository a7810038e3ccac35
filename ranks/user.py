"""Your own model under ddptui: ``ddptui.instrument(ddp_model, ...)`` (imports torch, never Textual).

    handle = ddptui.instrument(ddp_model, layers="auto", optimizer=opt)
    for x, y in data:
        with handle.step():          # or no `with`: a step starts at the DDP forward and
            loss = loss_fn(ddp_model(x), y)  # ends after optimizer.step() (optimizer= given)
            loss.backward()
            opt.step()
    handle.close()

What is timed, through the same Recorder as the built-in workers (ranks.instrument: host
CLOCK_MONOTONIC on CPU, pooled CUDA events mapped by GpuTimeMap on GPU; `comm_starts` for
gloo's concurrent collectives):
- forward and backward of the chosen modules (`layers`): "auto" (the model's blocks:
  top-level children, containers such as ModuleList/Sequential/ModuleDict opened, wrappers
  opened until >= 4 blocks hold the parameters: `auto_layers`), an int
  depth (the modules at that depth, and leaves above it), or a list of module names. Spans
  are a module's first call start to its last call end in a step (a module called twice,
  e.g. a shared block, is one span); nested choices overlap. Backward starts when the
  first gradient of the module's output is ready and ends when the gradient of its input
  is, or its last parameter gradient is accumulated;
- every DDP bucket's AllReduce, through a comm hook that wraps the user's (registered
  after instrument(), or passed as comm_hook=): an fp16/bf16 compression hook keeps
  compressing, its cast is inside the timed span, and the bytes shown are the bytes handed
  to all_reduce inside the hook;
- the optimizer step (optimizer=: step pre/post hooks) and the whole step.

Steps under `no_sync()` have no AllReduce and are shown as such. DDP's bucket rebuild
(after the first step) is reported as a new layout, as the built-in DDP strategy does.

Where spans go: started by ``ddptui run`` (DDPTUI_SOCKET set) to the app, through the
Emitter; otherwise to a per-rank recording ``<dir>/rank<r>.ddptui`` (record= or
DDPTUI_RECORD=dir; default ./runs/<script>-<time>/): ``ddptui summary|replay|export DIR``
read the directory as one run. Hot path as in the workers: hooks take a timestamp; spans
are resolved after the step and handed to a queue; a background thread sends or writes.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from . import frames, spec, wire
from .emitter import FrameQueue
from .commhook import CommState, timed_hook
from .instrument import CpuClock, CudaClock
from .userlayers import UserRecorder, attach_module_hooks, choose_layers

STRATEGY = spec.USER_STRATEGY  # a user's DDP run is drawn in the DDP pane (buckets, figures, stragglers)


class FileSink(FrameQueue):
    """A rank's own recording (no app): the Emitter's interface (put, send_now, close),
    frames written by a background thread; the file is opened at the first hello."""

    def __init__(self, path: str, rank: int, meta: dict):
        super().__init__(1024)
        self.path, self.rank, self.meta = path, rank, meta
        self.step, self.phase, self.clock_residual_ns = -1, "starting", None
        self.app_gone = threading.Event()
        self.writer = None
        self._t = threading.Thread(target=self._loop, name="ddptui-file", daemon=True)
        self._t.start()

    def close(self, timeout: float = 3.0) -> None:
        self.q.put(None)
        self._t.join(timeout)

    def _loop(self) -> None:
        from .recfile import RecordWriter
        while True:
            item = self.q.get()
            if item is None:
                break
            if isinstance(item, tuple):  # a span batch: a Spans frame
                s, k, base, kinds, idxs, t0, t1, iss = item
                item = frames.spans_frame(self.rank, s, k, base, kinds, idxs, t0, t1, iss)
            if self.writer is None:
                if type(item) is not frames.Hello:
                    continue  # nothing is written before the run is described
                unset = frames.UNSET  # absent from the hello: None in the header
                meta = dict(self.meta, layers=None if item.layers is unset else item.layers,
                            params=None if item.params is unset else item.params,
                            batch=item.batch or 0, backend=item.backend or None,
                            torch=item.torch or None, host=item.host or None,
                            devices={str(self.rank): item.device or None})
                d = os.path.dirname(self.path)
                if d:
                    os.makedirs(d, exist_ok=True)
                self.writer = RecordWriter(self.path, meta)
            self.writer.write(item)
        if self.writer is not None:
            self.writer.close()


def _default_record_dir() -> str:
    script = os.path.splitext(os.path.basename(sys.argv[0] or "train"))[0] or "train"
    return os.path.join("runs", f"{script}-{time.strftime('%Y%m%d-%H%M%S')}")


# -- the handle ------------------------------------------------------------------------------
class Handle:
    """What ddptui.instrument returns: step() (a context manager), close(), and what it
    found: `layers` (names), `params` (names), `buckets` (the last layout reported)."""

    def __init__(self, ddp, layers="auto", optimizer=None, batch: int | None = None,
                 record: str | None = None, comm_hook=None, comm_state=None, name: str | None = None):
        from torch.nn.parallel import DistributedDataParallel as DDP
        if not isinstance(ddp, DDP):
            raise TypeError("ddptui.instrument wants a torch.nn.parallel.DistributedDataParallel model")
        if not dist.is_initialized():
            raise RuntimeError("ddptui.instrument: init the process group first")
        if getattr(ddp, "_ddptui", None) is not None:
            raise RuntimeError("ddptui.instrument: this model is instrumented already")
        self.ddp = ddp
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        model = ddp.module
        chosen = choose_layers(model, layers)
        self._names = [n for n, _ in chosen]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [n for n, _ in named]
        self.pindex = {id(p): i for i, (_, p) in enumerate(named)}
        # each parameter belongs to the innermost chosen module holding it (else the
        # nearest chosen module before it): for the end of backward and the params table
        owner: dict[int, int] = {}
        for i in sorted(range(len(chosen)), key=lambda i: len(self._names[i])):
            for p in chosen[i][1].parameters():  # the innermost (longest name) choice wins
                if id(p) in self.pindex:
                    owner[id(p)] = i
        self.param_layer = {id(p): (p, owner[id(p)]) for _, p in named if id(p) in owner}
        last = 0
        self._param_owner = []
        for _, p in named:
            last = owner.get(id(p), last)
            self._param_owner.append(last)
        device = _device_of(model)
        self.device = device
        backend = dist.get_backend()
        self.backend = backend
        clock = CudaClock(device, comm_on_host=backend == "gloo") if device.type == "cuda" else CpuClock()
        self.clock = clock
        self.rec = UserRecorder(clock, len(chosen))
        self.optimizer = optimizer
        self.batch = batch
        self.name = name or type(model).__name__
        self.k = 0
        self._explicit = False
        self._auto_open = False
        self._order: list[int] | None = None  # internal layer index -> forward-order index
        self.layout: list | None = None
        self.reported: list[int] | None = None
        self.stable = 0
        self.stop_asked = False
        self.closed = False
        self._handles = attach_module_hooks(chosen, self.rec, self.param_layer)
        self._sink = self._open_sink(record)
        # the comm hook: ours, around the user's (given now, or registered later)
        self.comm = CommState(self.rec, self.world, self.pindex, comm_hook, comm_state)
        if ddp._comm_hooks:
            raise RuntimeError("ddptui.instrument: a comm hook is registered already; call "
                               "instrument() first, or pass it as comm_hook=")
        from .strategies import quiet_runtime_stats
        quiet_runtime_stats(ddp)
        ddp.register_comm_hook(self.comm, timed_hook)
        ddp.register_comm_hook = self._set_user_hook  # the user's later hook goes inside ours
        ddp._ddptui = self
        self._handles.append(ddp.register_forward_pre_hook(self._ddp_forward))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(opt_step_pre(self.rec.opt_begin)))
            self._handles.append(optimizer.register_step_post_hook(self._after_opt))

    # -- set-up -------------------------------------------------------------------------
    def _open_sink(self, record):
        sock = os.environ.get("DDPTUI_SOCKET")
        if sock and record is None:
            from .emitter import Emitter
            return Emitter(sock, os.environ.get("DDPTUI_TOKEN", ""), self.rank,
                           on_control=self._on_control)
        d = record or os.environ.get("DDPTUI_RECORD") or _default_record_dir()
        meta = {"ddptui": "0.1.0", "created": time.time(), "model": self.name,
                "strategies": [STRATEGY], "world": self.world, "steps": 0,
                "device": self.device.type, "user": True}
        return FileSink(os.path.join(d, f"rank{self.rank}.ddptui"), self.rank, meta)

    def _on_control(self, msg: frames.Frame) -> None:
        if type(msg) is frames.Stop:
            self.stop_asked = True

    def _set_user_hook(self, state, hook) -> None:
        """ddp.register_comm_hook after instrument(): the hook runs inside ddptui's."""
        if self.comm.inner is not None:
            raise RuntimeError("register_comm_hook can only be called once")
        self.ddp._check_comm_hook(hook)
        self.ddp.logger._set_comm_hook_name(hook.__qualname__)
        self.comm.inner, self.comm.inner_state = hook, state

    # -- step boundaries ----------------------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """One training step (or one micro-step of gradient accumulation)."""
        if self._auto_open:
            self._end()
        self._explicit = True
        self._begin()
        try:
            yield self
        finally:
            self._explicit = False
            if self.rec.cur is not None:
                self._end()

    def _ddp_forward(self, module, args):
        if self._explicit:
            return
        if self._auto_open:
            self._end()
        self._auto_open = True
        self._begin()

    def _after_opt(self, opt, args, kwargs):
        self.rec.opt_end()
        if self._auto_open and not self._explicit:
            self._end()

    def _begin(self) -> None:
        self.comm.seen = []
        self.clock.maybe_calibrate()
        self._sink.clock_residual_ns = self.clock.residual_ns
        self._sink.step = self.k
        self.rec.begin(STRATEGY, self.k)

    def _end(self) -> None:
        self._auto_open = False
        self.rec.end()
        k = self.k
        self.k += 1
        if self._order is None:
            self._hello(self.rec.pending[0])
        self._emit(self.rec.poll())
        if self.comm.track and self.comm.seen:  # a no_sync step issues no AllReduce: nothing to learn
            self._layout_change(k)

    def _hello(self, first) -> None:
        """Layers in forward order (from the first step), then hello: the first frame."""
        n = len(self._names)
        if self.clock.cuda:  # events: read against the step's start once they are done
            torch.cuda.current_stream(self.device).synchronize()
            key = lambda t: first.step_start.elapsed_time(t)  # noqa: E731
        else:
            key = int
        firsts = [(0, 0, i) if t is None else (1, key(t), i) for i, t in enumerate(first.fwd_s)]
        ranked = sorted(firsts, key=lambda x: (-x[0], x[1], x[2]))
        self._order = [0] * n
        for pos, (_, _, i) in enumerate(ranked):
            self._order[i] = pos
        self.layers = [None] * n
        for i, name in enumerate(self._names):
            self.layers[self._order[i]] = name
        params = [(name, int(p.numel()), self._order[self._param_owner[j]])
                  for j, (name, p) in enumerate((nm, pp) for nm, pp in self.ddp.module.named_parameters()
                                                if pp.requires_grad)]
        dev = str(self.device) if self.device.type == "cuda" else "cpu"
        self._sink.send_now(frames.Hello(
            rank=self.rank, world=self.world,
            local_rank=int(os.environ.get("LOCAL_RANK", self.rank)), pid=os.getpid(),
            host=socket.gethostname(), device=dev, backend=self.backend, note="",
            torch=str(torch.__version__), model=self.name[:32], layers=self.layers,
            params=params, strategies=[STRATEGY],
            batch=int(self.batch) if self.batch else frames.UNSET,  # unknown: no samples/s
            steps=0, bucket_cap_mb=_cap_mb(self.ddp), threads=torch.get_num_threads(),
        ))
        self._sink.phase = "training"
        self._sink.send_now(frames.Phase(rank=self.rank, phase="training"))

    def _emit(self, items) -> None:
        order = self._order
        for item in items:
            s, k, base, kinds, idxs, t0, t1, iss = item
            idxs = [order[i] if kd <= wire.BWD else i for kd, i in zip(kinds, idxs)]
            self._sink.put((s, k, base, kinds, idxs, t0, t1, iss), n_spans=len(kinds))

    def _layout_change(self, k: int) -> None:
        from .strategies import ddp_reported_sizes
        seen = sorted(self.comm.seen)
        reported = ddp_reported_sizes(self.ddp)
        if seen == self.layout and reported == self.reported:
            self.stable += 1
            if self.stable >= 3:
                self.comm.track = False
            return
        self.layout, self.reported, self.stable = seen, reported, 0
        self._sink.send_now(frames.Buckets(rank=self.rank, strategy=STRATEGY, step=k,
                                           cap_mb=_cap_mb(self.ddp), ddp_reported=reported,
                                           buckets=[(b, ps, nb) for b, ps, nb in seen]),
                            timeout=0.5)

    @property
    def buckets(self) -> list[dict]:
        """The last bucket layout seen: index, parameter names, bytes sent."""
        return [{"index": b, "params": [self.params[i] for i in ps], "bytes": nb}
                for b, ps, nb in (self.layout or [])]

    def close(self, why: str = "done") -> None:
        """Flush the last steps and say goodbye (also at interpreter exit)."""
        if self.closed:
            return
        self.closed = True
        if self.rec.cur is not None:
            self._end()
        self._emit(self.rec.poll(wait=True))
        if self._order is not None:
            self._sink.phase = "done"
            self._sink.send_now(frames.Bye(rank=self.rank, why=why, dropped=self._sink.dropped_spans,
                                           dropped_frames=self._sink.dropped_frames))
        self._sink.close(timeout=3.0)
        for h in self._handles:
            h.remove()

    def error(self, exc: BaseException) -> None:
        """Report an exception of the training script (then close)."""
        import traceback
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=6))
        if self._order is None:  # the app needs to know the rank before an error
            self._hello_minimal()
        self._sink.send_now(frames.Error(rank=self.rank, msg=f"{type(exc).__name__}: {exc}".strip()[:500],
                                         tb=tb[-4000:]))
        self.closed = True
        self._sink.close(timeout=2.0)

    def _hello_minimal(self) -> None:
        self._order = list(range(len(self._names)))
        self.layers = list(self._names)
        self._sink.send_now(frames.Hello(rank=self.rank, world=self.world, pid=os.getpid(),
                                         backend=self.backend, strategies=[STRATEGY],
                                         layers=self.layers))


def opt_step_pre(begin):
    """An optimizer step pre-hook that starts the optimizer's span (`begin()`) now or, when
    step() is given a closure (Lightning's automatic optimization, LBFGS), when the closure
    returns: the closure runs the forward and backward inside step()."""
    def pre(opt, args, kwargs):  # args: (the optimizer, *step's positional arguments)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            begin()
            return None

        def timed_closure():
            try:
                return closure()
            finally:
                begin()
        if "closure" in kwargs:
            return args, dict(kwargs, closure=timed_closure)
        return (args[0], timed_closure, *args[2:]), kwargs
    return pre


def _cap_mb(ddp) -> float | None:
    b = getattr(ddp, "bucket_bytes_cap", None)
    return b / (1024 * 1024) if b else None


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


# -- the public entry ------------------------------------------------------------------------
_handles: list[Handle] = []


def instrument(ddp_model, layers="auto", optimizer=None, batch: int | None = None,
               record: str | None = None, comm_hook=None, comm_state=None,
               name: str | None = None) -> Handle:
    """Time a DistributedDataParallel model's layers, buckets and steps (see the module doc).

    layers: "auto" | depth (int) | [module names]; optimizer: its step() is timed and ends a
    step when `with handle.step():` is not used; batch: the global batch (samples/s);
    record: a directory for this rank's recording when not under ddptui (else DDPTUI_RECORD,
    else ./runs/<script>-<time>/); comm_hook/comm_state: a comm hook to run inside ddptui's
    (one registered later with ddp_model.register_comm_hook is taken the same way)."""
    h = Handle(ddp_model, layers, optimizer, batch, record, comm_hook, comm_state, name)
    if not _handles:
        _install_exit_hooks()
    _handles.append(h)
    return h


def _install_exit_hooks() -> None:
    import atexit
    prev = sys.excepthook

    def hook(t, e, tb):
        for h in list(_handles):
            if not h.closed:
                h.error(e)
        prev(t, e, tb)
    sys.excepthook = hook
    atexit.register(_close_all)


def _close_all() -> None:
    for h in list(_handles):
        try:
            h.close()
        except Exception:  # noqa: BLE001 - interpreter exit: never raise here
            pass


def report_error(exc: BaseException) -> None:
    """(ddptui run's bootstrap) an exception ended the script: every handle says so."""
    for h in list(_handles):
        if not h.closed:
            h.error(exc)


__all__ = ["instrument", "Handle", "choose_layers", "STRATEGY", "spec"]
