"""Your own model under ddptui: ``ddptui.instrument(ddp_model, ...)`` (imports torch, never Textual).

    handle = ddptui.instrument(ddp_model, layers="auto", optimizer=opt)
    for x, y in data:
        with handle.step():          # or no `with`: a step starts at the DDP forward and
            loss = loss_fn(ddp_model(x), y)  # ends after the optimizer.step() that follows
                                             # its synchronising backward (optimizer= given)
            loss.backward()
            opt.step()
    handle.close()

What is timed, through the same Recorder as the built-in workers (ranks.core.instrument: host
CLOCK_MONOTONIC on CPU, pooled CUDA events mapped by GpuTimeMap on GPU; `comm_starts` for
gloo's concurrent collectives):
- forward and backward of the chosen modules (`layers`): "auto" (the model opened to its
  lists of repeated blocks at whatever depth they sit, `bert.encoder.layer.N`, with the
  modules around them that hold parameters; a model without such lists: its children,
  wrappers opened until >= 4 blocks hold the parameters: `auto_layers`), an int
  depth (the modules at that depth, and leaves above it), or a list of module names. Spans
  are a module's first call start to its last call end in a step (a module called twice,
  e.g. a shared block, is one span); nested choices overlap. Backward starts when the
  first gradient of the module's output is ready and ends when the gradient of its input
  is, or its last parameter gradient is accumulated (a parameter tied between two layers:
  the gradient of the one that runs first in the forward, whose backward ends last);
- every DDP bucket's AllReduce, through a comm hook that wraps the user's (registered
  after instrument(), or passed as comm_hook=): an fp16/bf16 compression hook keeps
  compressing, its cast is inside the timed span, and the bytes shown are the bytes handed
  to all_reduce inside the hook;
- the optimizer step (optimizer=: step pre/post hooks) and the whole step;
- the global batch, when batch= is not given: each rank counts the first dimension of the
  first tensor its model is called with (positional, then keyword arguments), summed over
  the first step's micro-steps, and says it in its hello (`rank_batch`); the app sums the
  ranks' (RunInfo). Looked at in the first step only: no cost after it.

A model no wrapper synchronises (a plain nn.Module: data parallelism written by hand) is
timed the same way, its steps ending at its optimizer's step; each all_reduce of one of its
parameters' `.grad` is that parameter's gradient AllReduce (a COMM span, as the built-in naive
strategy's), and the run is named naive or interleaved by when its first step issued them
(RankSession._form).

A step is one gradient synchronisation (RankSession): numbered by the synchronisations, the
same on every rank, never by a rank's own count of forwards. Micro-steps of gradient
accumulation (no_sync(), require_backward_grad_sync = False) are drawn inside the step
they belong to; forwards that synchronise nothing (no_grad evaluation, a forward no
backward follows) are not steps and are kept out of them: drawn as "other" time (OTHER
spans) on the rank's lane. Every DDP module of a rank is in one picture (several
`instrument()` calls, or `ddptui run --auto` on a model with several DDP modules, share one
RankSession): layers and parameters named after each module's
attribute path, buckets numbered after the modules before. DDP's bucket rebuild (after the
first step) is reported as a new layout, as the built-in DDP strategy does.

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

from ranks import frames, spec, wire
from ranks.clock import now_ns
from ranks.core.emitter import FrameQueue
from ranks.core import markop, pipetap
from ranks.core.colltap import CollTap
from ranks.core.recorder import NO_COMMS
from ranks.scripts.commhook import CommState, FrBuckets, timed_hook
from ranks.core.instrument import CpuClock, CudaClock
from ranks.scripts.userlayers import UserRecorder, attach_module_hooks, choose_layers, shown_name

STRATEGY = spec.USER_STRATEGY  # a user's DDP run is drawn in the DDP pane (buckets, figures, stragglers)
# a model whose gradients the script synchronises itself: named by the form its first step
# shows (RankSession._form), naive until then
PLAIN_STRATEGY = "naive"
_KIND_NAMES = {"ddp": "a DistributedDataParallel", "fsdp": "a fully_shard",
               "plain": "a hand-synchronised model"}


class _InOrder:
    """A finished step (Recorder.poll(lazy=True)) resolved where it is called, its layers'
    internal indices put in forward order (`order`) — on the sink's thread, not the training
    thread. A layer whose place is `shown` or beyond is not drawn (RankSession._hello: a
    module chosen by "auto" that the first step never called): its spans are left out."""

    __slots__ = ("item", "order", "shown")

    def __init__(self, item, order: list[int], shown: int):
        self.item, self.order, self.shown = item, order, shown

    def __call__(self) -> tuple:
        s, k, base, kinds, idxs, t0, t1, iss = self.item()
        order = self.order
        idxs = [order[i] if kd <= wire.BWD else i for kd, i in zip(kinds, idxs)]
        n = self.shown
        if n < len(order) and any(kd <= wire.BWD and i >= n for kd, i in zip(kinds, idxs)):
            keep = [j for j, (kd, i) in enumerate(zip(kinds, idxs)) if kd > wire.BWD or i < n]
            kinds, idxs, t0, t1 = ([x[j] for j in keep] for x in (kinds, idxs, t0, t1))  # (iss: COMM's)
        return s, k, base, kinds, idxs, t0, t1, iss

    @property
    def n_spans(self) -> int:
        return self.item.n_spans

    def drop(self) -> None:
        self.item.drop()


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
        from ranks.recfile import RecordWriter
        while True:
            item = self.q.get()
            if item is None:
                break
            got = item
            try:
                if callable(item):  # a step resolved here, off the training thread (_emit)
                    item = item()
                if isinstance(item, tuple):  # a span batch: a Spans frame
                    s, k, base, kinds, idxs, t0, t1, iss = item
                    item = frames.spans_frame(self.rank, s, k, base, kinds, idxs, t0, t1, iss)
            except Exception:  # noqa: BLE001 - one bad step must not end the recording
                self._could_not(got, "recording")
                continue
            item = self._final(item)
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
                self.writer = RecordWriter(self.path, meta, on_error=self._stopped)
            self.writer.write(item)
        if self.writer is not None:
            self.writer.close()

    def _stopped(self, why: str) -> None:
        """The file could not be written (a full disk): it ends where it got to, and training
        goes on unrecorded (the writer drops what follows); said once, on this rank's stderr."""
        # one write(2) of the whole line (this runs on the sink's thread, beside the script's
        # own output, and every rank shares torchrun's stderr: two ranks' lines were seen run
        # together on one line); under PIPE_BUF, so it is never cut by another's
        line = f"ddptui: rank {self.rank}: {why}; training goes on without it\n".encode(errors="replace")
        try:
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), line)
        except (OSError, ValueError, AttributeError):  # (no real stderr: a file-like object or none)
            print(line.decode().rstrip("\n"), file=sys.stderr, flush=True)


def _default_record_dir() -> str:
    script = os.path.splitext(os.path.basename(sys.argv[0] or "train"))[0] or "train"
    return os.path.join("runs", f"{script}-{time.strftime('%Y%m%d-%H%M%S')}")


# -- a rank: every DDP module of it in one picture --------------------------------------------
class RankSession:
    """What every DDP module of this process (one rank) shares: one recorder and clock, one
    sink (the app allows one connection a rank), one step count, one hello. Modules join
    until the first step is over (the hello names every layer and parameter); each adds its
    layers and parameters after the ones before it, and its buckets are numbered after theirs
    (CommState.offset).

    What a step is: the work of one gradient synchronisation, which every rank takes part in.
    A step opens at the first training forward (autograd on) of a DDP module; forwards under
    no_sync() / require_backward_grad_sync = False and their backwards are micro-steps inside
    it; it closes at the end of the optimizer step that follows its synchronising backward
    (or, without an optimizer, at the next training forward or at close). Steps are numbered
    by those synchronisations, the same on every rank; a rank's own extra forwards take no
    number and are in no figure: they are kept as OTHER spans (wire.OTHER, idx 0: drawn
    "other" on the rank's lane). A forward with autograd off (evaluation under no_grad) is one
    OTHER span from its start to its end, in the step it interrupted (an open step that has
    not synchronised yet) or else in the next step's frame, before its STEP span (the frame's
    base moves back to it); forwards that no backward followed (an evaluation with autograd
    on: the same module called again before any backward) are dropped from the step, which
    starts anew, and become one OTHER span from the first of them to the new step's start.
    An open step that synchronised nothing when the run ends is dropped, and OTHER spans not
    yet placed in a step with it."""

    def __init__(self, first: "Handle", record, batch, name):
        if dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:  # (a plain model trained by one process with no process group: a rank alone)
            self.rank, self.world = int(os.environ.get("RANK", "0")), 1
        self.device = first.device
        self.backend = backend_name(self.device)
        self.clock = CudaClock(self.device, comm_on_host=self.backend == "gloo") \
            if self.device.type == "cuda" else CpuClock()
        self.rec = UserRecorder(self.clock, 0)
        self.strategy = first.strategy  # ddp, or fsdp (an FSDP2 model: fully_shard), or naive
        self.kind = first.kind  # ddp, fsdp, plain (a model the script synchronises by hand)
        # every other collective of this rank (its own all_reduce, all_to_all, FSDP2's
        # all-gathers and reduce-scatters): COLL spans, attributed to the running layer
        self._mod_layer: dict[int, int] = {}  # id(module) -> internal layer holding it
        self.tap = CollTap(self.rec, self._unit_layer, self.rec.phase, on_reduce=self._unit_done)
        # a plain model's parameters (global index, parameter), last first (the order a backward
        # makes their gradients in), for `_grad_param`
        self._gparams: list = []
        self._grad_at: dict[int, tuple] = {}  # id(a gradient seen) -> (global index, internal layer, param)
        self._grad_shapes: set[tuple] = set()
        self._grad_cursor = 0
        if self.kind == "plain":
            self.tap.grad_of = self._grad_param
        self.tap.activate()
        # a pipeline (torch.distributed.pipelining imported by the script): its microbatches,
        # its schedule's step and its P2P ops seen (ranks.core.pipetap)
        self.pipe = None
        if "torch.distributed.pipelining" in sys.modules and pipetap.install():
            self.pipe = pipetap.PipeTap(self)
            self.tap.p2p_of = self.pipe.p2p_of
            pipetap.activate(self.pipe)
        self.mods: list[Handle] = []
        self.names: list[str] = []  # layer names by internal index (as chosen, unprefixed)
        self.param_names: list[str] = []  # by global parameter index (unprefixed)
        self.param_numel: list[int] = []
        self.param_owner: list[int] = []  # internal layer index of each parameter
        self.batch = batch
        # the samples of the first step, from the model's inputs (no batch= given): the first
        # dimension of the first tensor each training forward was called with (the first DDP
        # module's of a micro-step), summed; counted until the hello only
        self.step_batch = 0
        self.batch_looked = False  # a forward's inputs were looked at
        self.auto_idx: set[int] = set()  # layers chosen by "auto" (internal indices)
        self.layer_params: dict[int, set[int]] = {}  # their parameters (global indices)
        self._shown_n = 0  # layers drawn: those after it (auto, never called) are not
        self.name = name
        self.first_name = _class_name(first.module)
        self.k = 0  # the next step's number: synchronisations so far
        self.explicit = False  # inside `with handle.step():` (or a pipeline schedule's step())
        self.pipe_explicit = False  # what `explicit` was when the schedule's step() began
        self.fwd_mods: set[int] = set()  # DDP modules forwarded in the current micro-step
        self.stash = None  # the open step, while an evaluation forward (no_grad) runs
        self.other_s = None  # the start mark of the evaluation forward (no_grad) running now
        self.others: list = []  # (start, end) marks of evaluation forwards for the next step
        self.opt_seen = False  # an optimizer step has ended a step (then it ends every step)
        self._opts: set[int] = set()
        self._opt_objs: list = []  # the optimizers seen stepping (their state: the memory figure)
        self._order: list[int] | None = None  # internal layer index -> forward-order index
        self.layers: list[str] | None = None  # shown names, in forward order (the hello's)
        self.shown_params: list[str] | None = None
        self.stop_asked = False
        self.closed = False
        self.sink = self._open_sink(record)

    # -- set-up -------------------------------------------------------------------------
    def _open_sink(self, record):
        sock = os.environ.get("DDPTUI_SOCKET")
        if sock and record is None:
            from ranks.core.emitter import Emitter
            em = Emitter(sock, os.environ.get("DDPTUI_TOKEN", ""), self.rank,
                         on_control=self._on_control)
            em.collectives = self._collectives
            return em
        d = record or os.environ.get("DDPTUI_RECORD") or _default_record_dir()
        meta = {"ddptui": "0.1.0", "created": time.time(), "model": self.name or self.first_name,
                "strategies": [self.strategy], "world": self.world, "steps": 0,
                "device": self.device.type, "user": True}
        return FileSink(os.path.join(d, f"rank{self.rank}.ddptui"), self.rank, meta)

    def _grad_param(self, t) -> tuple[int, int] | None:
        """(global parameter index, internal layer) of the parameter whose `.grad` is `t`, else
        None: a plain model's gradient reduced by the script (the tap's `grad_of`). Gradients
        seen are kept by identity (checked: `param.grad is t`); a new one is looked for from
        where the last was found, in backward order, so that a backward's hooks (the
        interleaved form) and the loop after it (the naive form) each find theirs at once."""
        got = self._grad_at.get(id(t))
        if got is not None and got[2].grad is t:
            return got[0], got[1]
        if tuple(t.shape) not in self._grad_shapes:
            return None
        ps, at = self._gparams, self._grad_at
        n = len(ps)
        if len(at) > 4 * n:
            at.clear()
        i = self._grad_cursor % n if n else 0
        owner = self.param_owner
        for _ in range(n):
            j, p = ps[i]
            i = i + 1 if i + 1 < n else 0
            g = p.grad
            if g is not None:
                entry = at[id(g)] = (j, owner[j] if j < len(owner) else -1, p)
                if g is t:
                    self._grad_cursor = i
                    return entry[0], entry[1]
        return None

    def _form(self, c) -> None:
        """A plain model's first step: its strategy named by when its gradients were reduced
        (the course's forms): interleaved where an all_reduce of a gradient went during the
        backward, naive where all went after it; single where no collective ran at all (or
        one rank alone), said once."""
        ph = self.tap.grad_phases
        colls = c.comm_idx is not NO_COMMS and len(c.comm_idx) > 0
        if self.pipe is not None and self.pipe.sched is not None:  # a pipeline: its schedule
            name = pipetap.schedule_name(self.pipe.sched)
        elif self.world == 1:
            name = "single"
            if not colls:
                print(f"ddptui: {self.first_name} trains on one rank with no collective: drawn as single",
                      file=sys.stderr, flush=True)
        elif not colls:
            name = "naive"
            if self.rank == 0:
                print(f"ddptui: {self.first_name} trains with no collective between the {self.world} ranks: "
                      "each rank alone, their models apart (no gradient is synchronised)",
                      file=sys.stderr, flush=True)
        elif ph.get("backward"):
            name = "interleaved"
        else:
            name = "naive"
        self.strategy = c.strategy = name
        for m in self.mods:
            m.strategy = name
        meta = getattr(self.sink, "meta", None)
        if isinstance(meta, dict):
            meta["strategies"] = [name]

    def _hand_synced(self) -> None:
        """A plain model's step synchronises where its optimizer steps (or `with step()` ends)
        after a backward: what the script repeats is the step."""
        c = self.rec.cur
        if self.kind == "plain" and c is not None and not c.synced and (c.had_bwd or self.rec.bwd_since()):
            c.synced = 1

    def _unit_layer(self, modules) -> int:
        """An FSDP2 unit's layer (internal index): the chosen layer holding its first module."""
        ml = self._mod_layer
        for m in modules:
            got = ml.get(id(m))
            if got is not None:
                return got
        return -1

    def _unit_done(self, modules) -> None:
        """FSDP2's post-backward of a unit (its gradients are all there, their reduce-scatter
        comes next): the end of its layer's backward; of the root's unit, the end of each
        layer whose backward began and has no end yet (a first layer whose input needs no
        gradient, a token embedding: nothing else marks it)."""
        rec = self.rec
        c = rec.cur
        if c is None:
            return
        i = self._unit_layer(modules)
        if i >= 0:
            rec.bwd_end(i)
            return
        for j in range(rec.n_layers):
            if c.bwd_s[j] is not None and c.bwd_e[j] is None:
                rec.bwd_end(j)

    def _say_traced(self, k: int) -> None:
        """The functional collectives traced into compiled graphs so far (untimed), by op:
        their count over the steps so far (`traced <op>`, and their bytes `traced_b <op>`);
        the layer marks skipped in a CUDA graph's capture (`captured_marks`)."""
        if markop.captured[0]:
            self.sink.send_now(frames.Event(rank=self.rank, step=k, what="captured_marks",
                                            value=markop.captured[0]))
        for op, (n, nb) in sorted(self.tap.traced.items()):
            self.sink.send_now(frames.Event(rank=self.rank, step=k, what=f"traced {op}", value=n))
            self.sink.send_now(frames.Event(rank=self.rank, step=k, what=f"traced_b {op}", value=nb))

    def use_flight_recorder(self) -> None:
        """A DDP module's buckets timed by NCCL itself: the Flight Recorder read for them."""
        if self.rec.fr is None:
            from ranks.core.flightrec import flight_times_for
            self.rec.fr = flight_times_for(self.device.type)

    def _collectives(self):
        """(the collective this rank is inside, layer in forward order; entered so far; the DDP
        bucket it is an AllReduce of, or None; the pipeline send or receive it is, or None):
        the heartbeat's. Buckets timed by NCCL itself,
        in flight for over 2 s: the process group's own last completed one read first (a
        Flight Recorder dump, only then), those it completed out of flight."""
        tap = self.tap
        w, bucket, p2p = tap.waiting_more()
        fr = self.rec.fr
        if w is not None and bucket is not None and fr is not None and now_ns() - w[4] > 2_000_000_000:
            fr.refresh(force=True)
            for m in self.mods:
                if m.frb is not None and m.frb.group in fr.completed:
                    m.frb.settle(fr.completed[m.frb.group])
            w, bucket, p2p = tap.waiting_more()
        if w is not None:
            op, seq, nb, layer, t = w
            w = (op, seq, nb, self._place(layer), t)
        return w, tap.entered, bucket, p2p

    def _on_control(self, msg: frames.Frame) -> None:
        if type(msg) is frames.Stop:
            self.stop_asked = True

    def can_join(self) -> bool:
        return self._order is None and self.rec.cur is None and not self.closed

    def join(self, h: "Handle", chosen, named) -> tuple[int, int]:
        """A module's layers and parameters appended: (its first layer, its first parameter)."""
        base, pbase = len(self.names), len(self.param_names)
        self.names += [shown_name(n) for n, _ in chosen]  # (as the user named them: no _orig_mod.)
        if h.auto:
            self.auto_idx.update(range(base, base + len(chosen)))
        for i, (_, mod) in enumerate(chosen, base):
            for m in mod.modules():
                self._mod_layer.setdefault(id(m), i)
        self.rec.add_layers(len(chosen))
        for n, p in named:
            self.param_names.append(shown_name(n))
            self.param_numel.append(int(p.numel()))
        if h.kind == "plain":
            self._gparams[:0] = [(pbase + j, p) for j, (_, p) in reversed(list(enumerate(named)))]
            self._grad_shapes.update(tuple(p.shape) for _, p in named)
        self.mods.append(h)
        return base, pbase

    def add_optimizer(self, opt, handles: list) -> None:
        if id(opt) in self._opts:
            return
        self._opts.add(id(opt))
        handles.append(opt.register_step_pre_hook(opt_step_pre(self.opt_begin)))
        handles.append(opt.register_step_post_hook(self.after_opt))

    # -- step boundaries ----------------------------------------------------------------
    def forward_pre(self, ddp, args=(), kwargs=None, grad: bool | None = None) -> None:
        """A DDP module's forward begins (its forward pre-hook, with what it is called with;
        `grad`: whether autograd is on, where the caller knows it better: an op's)."""
        rec = self.rec
        if self.stash is not None:  # (an evaluation forward that raised)
            rec.cur, self.stash = self.stash, None
        self._drop_other_start()
        c = rec.cur
        if not (torch.is_grad_enabled() if grad is None else grad):  # an evaluation: no step, kept as OTHER time
            if c is not None:
                if c.synced and not self.explicit and not self.opt_seen:
                    self._end()  # the step was complete (no optimizer step to end it)
                else:
                    self.stash, rec.cur = c, None
            if self.rec.cur is None and self.stash is None and self.clock.cuda:
                self.clock.begin_step()  # (the stream a mark is recorded on)
            self.other_s = self.clock.mark()
            return
        me = id(ddp)
        if c is None:
            self._begin()
        elif c.synced and not self.explicit:  # the step has synchronised: this is the next one
            self._end()
            self._begin()
        elif rec.bwd_since():  # a backward ran since the micro-step began: the next micro-step
            rec.micro()
            self.fwd_mods.clear()
        elif me in self.fwd_mods:  # the same module again, no backward between: what ran
            if c.had_bwd:  # before was a forward no backward followed (an evaluation)
                rec.micro()
            else:
                start, kept = rec.discard(keep_start=True)  # ... the step so far: it starts
                self._begin()  # again here, its time kept as OTHER up to the new start
                rec.cur.micro += kept + [(wire.OTHER, 0, start, rec.cur.step_start)]
            self.fwd_mods.clear()
        if self._order is None and not self.fwd_mods:  # (the first step's: the hello's batch)
            n = _batch_of(args, kwargs)
            self.batch_looked = True
            if n:
                self.step_batch += n
        self.fwd_mods.add(me)

    def forward_post(self) -> None:
        if self.other_s is not None:  # an evaluation forward ends: its OTHER span
            span = (self.other_s, self.clock.mark())
            self.other_s = None
            if self.stash is not None:  # in the step it interrupted
                self.stash.micro.append((wire.OTHER, 0) + span)
            else:  # in the next step's frame, before its start
                self.others.append(span)
        if self.stash is not None:
            self.rec.cur, self.stash = self.stash, None

    def _drop_other_start(self) -> None:
        """An evaluation forward that raised (no forward_post): its start mark let go."""
        if self.other_s is not None:
            self.clock.release(self.other_s)
            self.other_s = None

    def opt_begin(self) -> None:
        self._hand_synced()
        self.rec.opt_begin()

    def after_opt(self, opt=None, args=None, kwargs=None) -> None:
        if opt is not None and self._order is None and all(o is not opt for o in self._opt_objs):
            self._opt_objs.append(opt)
        rec = self.rec
        c = rec.cur
        if c is None:
            return
        rec.opt_end()
        if c.synced and not self.explicit:
            self.opt_seen = True
            self._end()

    def step_enter(self) -> None:
        rec = self.rec
        if self.stash is not None:
            rec.cur, self.stash = self.stash, None
        self._drop_other_start()
        c = rec.cur
        if c is not None and not self.explicit and c.synced:
            self._end()
            c = None
        self.explicit = True
        if c is None:
            self._begin()
        elif rec.bwd_since():  # a block of an accumulation: the step's next micro-step
            rec.micro()
            self.fwd_mods.clear()

    def pipe_step_begin(self) -> None:
        """A pipeline schedule's step() begins: the rank's step starts here if none is open (a
        stage's wait for its first input is in it); one that has synchronised ends first."""
        rec = self.rec
        if self.stash is not None:
            rec.cur, self.stash = self.stash, None
        self._drop_other_start()
        c = rec.cur
        if c is not None and c.synced and not self.explicit:
            self._end()
            c = None
        if c is None:
            self._begin()
        self.fwd_mods.clear()
        # inside the schedule, a forward after a synchronising backward is the next microbatch
        # (a DDP stage's forwards run with its gradient sync on; only the last backward syncs):
        # the step ends at the optimizer's step, or at the next schedule step
        self.pipe_explicit, self.explicit = self.explicit, True

    def pipe_step_end(self) -> None:
        """The schedule's step() returned: the step goes on to the optimizer's."""
        self.explicit = self.pipe_explicit

    def step_exit(self) -> None:
        self.explicit = False
        self._hand_synced()
        c = self.rec.cur
        if c is not None and c.synced:
            self._end()

    def _begin(self) -> None:
        for m in self.mods:
            if m.comm is not None:
                m.comm.seen = []
        self.clock.maybe_calibrate()
        self.sink.clock_residual_ns = self.clock.residual_ns
        self.sink.clock_bound_ns = getattr(self.clock, "bound_ns", None)
        self.sink.step = self.k
        self.rec.begin(self.strategy, self.k)
        self.fwd_mods.clear()
        self.step_batch = 0
        if self.others:  # evaluation forwards since the last step: OTHER spans of this one
            self.rec.cur.micro += [(wire.OTHER, 0, a, z) for a, z in self.others]
            self.others = []

    def _end(self) -> None:
        rec = self.rec
        rec.end()
        c = rec.pending[-1]
        if not c.synced:  # synchronised nothing: not a step
            rec.drop_last()
            return
        if self._order is None and self.pipe is not None and self.pipe.stages and self.pipe.sched is None:
            # a pipeline's model found inside its schedule's step() (FSDP2's, at its first
            # forward): that step is partly seen; the first drawn is the next schedule's step
            rec.drop_last()
            return
        k = self.k
        self.k += 1
        if self._order is None:
            if self.kind == "plain":
                self._form(c)
            self._hello(c)
            ddps = [m for m in self.mods if m.comm is not None]
            if ddps:  # how DDP's buckets are timed (the summary says it): NCCL itself only
                by = "flight-recorder" if all(m.frb is not None for m in ddps) else "comm-hook"
                self.sink.send_now(frames.Event(rank=self.rank, step=k, what="comm_timing",
                                                value=spec.COMM_TIMING[by]))
        self._emit(rec.poll(lazy=True))
        if (self.tap.traced or markop.captured[0]) and (k < 2 or k % 50 == 0):
            self._say_traced(k)
        for m in self.mods:
            if m.frb is not None:  # (NCCL's own timing: every bucket done; the layout from DDP)
                m.frb.step_done()
                if m.comm.track:
                    m.fr_layout()
                if not m.frb.keys and k >= 2:  # (still unknown: ddptui's comm hook from now on)
                    m.fr_give_up()
                    if self.rank == 0:
                        print(f"ddptui: DDP's bucket layout could not be read after {k + 1} steps: its "
                              "buckets are timed by ddptui's comm hook from now on", file=sys.stderr)
                    self.sink.send_now(frames.Event(rank=self.rank, step=k, what="comm_timing",
                                                    value=spec.COMM_TIMING["comm-hook"]))
        if any(m.comm is not None and m.comm.track and m.comm.seen for m in self.mods):
            self._layout_change(k)

    # -- frames ---------------------------------------------------------------------------
    def _times(self, c, toks) -> list:
        """Comparable times of a step's marks (None stays None): CPU readings as they are;
        CUDA events against the step's start, once they are done (first step only)."""
        if not self.clock.cuda:
            return list(toks)
        torch.cuda.current_stream(self.device).synchronize()
        return [None if t is None else c.step_start.elapsed_time(t) for t in toks]

    def _hello(self, first) -> None:
        """Layers in forward order (from the first step), then hello: the first frame."""
        n = len(self.names)
        ff = first.first_fwd
        toks = [ff[i] if ff is not None and ff[i] is not None else first.fwd_s[i] for i in range(n)]
        times = self._times(first, toks)
        # a module "auto" chose that the first step never called, and whose every parameter a
        # layer that ran holds too (HF's `shared`, its weight each stack's `embed_tokens`'),
        # is not drawn: last, cut off
        held = {j for i, t in enumerate(times) if t is not None for j in self.layer_params.get(i, ())}
        idle = {i for i in self.auto_idx if times[i] is None and self.layer_params.get(i)
                and self.layer_params[i] <= held}
        firsts = [(i in idle, 0, 0, i) if t is None else (False, 1, t, i) for i, t in enumerate(times)]
        ranked = sorted(firsts, key=lambda x: (x[0], -x[1], x[2], x[3]))
        self._order = [0] * n
        for pos, (_, _, _, i) in enumerate(ranked):
            self._order[i] = pos
        self._shown_n = shown_n = n - len(idle)
        shown, pshown = list(self.names), list(self.param_names)
        model = self.name
        if len(self.mods) > 1:  # several DDP (or FSDP2) modules: names say which module
            labels, roots = [], []
            for j, m in enumerate(self.mods):
                label, root = module_label(m.ddp, j)
                labels.append(label)
                roots.append(root)
                for i in range(m.base, m.base + m.n_layers):
                    shown[i] = label if self.names[i] == "model" else f"{label}.{self.names[i]}"
                for i in range(m.pbase, m.pbase + m.n_params):
                    pshown[i] = f"{label}.{self.param_names[i]}"
                m.label = label
            if model is None and roots[0] is not None and all(r is roots[0] for r in roots):
                model = type(roots[0]).__name__  # the model that holds them
            elif model is None:
                model = "+".join(_class_name(m.module) for m in self.mods)
        model = model or self.first_name
        own = None
        if self.pipe is not None and self.pipe.mod_stage:
            # a pipeline: each rank holds other layers, and the app names a layer index once for
            # every rank: the hello's names are positions ("block 0": each rank's first block;
            # "v1 block 0" its second stage's), the rank's own names (stage-prefixed) in its pipe
            own = list(shown)
            ms = self.pipe.mod_stage  # (a stage's module: the model, or its DDP wrapper)
            stage_of = {id(m): ms.get(id(m.module), ms.get(id(m.ddp), -1)) for m in self.mods}
            slots = sorted(set(stage_of.values()))
            for m in self.mods:
                st = stage_of[id(m)]
                slot = slots.index(st)
                for j, i in enumerate(range(m.base, m.base + m.n_layers)):
                    own[i] = f"s{st}.{self.names[i]}" if st >= 0 else self.names[i]
                    shown[i] = f"block {j}" if len(slots) == 1 else f"v{slot} block {j}"
            model = f"{model} (pipeline)"
        self.layers = [None] * n
        for i, name in enumerate(shown):
            self.layers[self._order[i]] = name
        del self.layers[shown_n:]
        self.shown_params = pshown
        owner = list(range(n))  # a parameter of a layer not drawn: the nearest drawn one's
        for i in sorted(idle):
            near = [j for j in range(n) if j not in idle]
            owner[i] = min(near, key=lambda j: (abs(j - i), -j)) if near else i
        params = [(pshown[j], self.param_numel[j], self._order[owner[self.param_owner[j]]])
                  for j in range(len(pshown))]
        if self.batch:
            rank_batch = frames.UNSET  # (given: the hello's batch)
        else:
            rank_batch = self.step_batch if self.batch_looked else frames.UNSET
            if rank_batch is not frames.UNSET and self.tap.batch_copy:  # (a tensor-parallel peer's
                rank_batch = 0  # samples: counted by the first rank of its group)
        own_layers = None
        if own is not None:
            own_layers = [None] * n
            for i, name in enumerate(own):
                own_layers[self._order[i]] = name
            del own_layers[shown_n:]
        pipe = self.pipe.info(own_layers) if self.pipe is not None else None
        if pipe is not None and not self.batch:  # (the first stage's microbatches: the samples;
            # a later stage's inputs are those samples again; a tensor-parallel peer's too)
            rank_batch = 0 if self.tap.batch_copy else self.pipe.samples
        dev = str(self.device) if self.device.type == "cuda" else "cpu"
        ddp0 = self.mods[0].ddp
        memory, peak = self._memory()
        self._opt_objs = []
        self.sink.send_now(frames.Hello(
            rank=self.rank, world=self.world,
            local_rank=int(os.environ.get("LOCAL_RANK", self.rank)), pid=os.getpid(),
            host=socket.gethostname(), device=dev, backend=self.backend, note="",
            torch=str(torch.__version__), model=model[:32], layers=self.layers,
            params=params, strategies=[self.strategy],
            batch=int(self.batch) if self.batch else frames.UNSET,  # unknown: no samples/s
            rank_batch=rank_batch,
            steps=0, bucket_cap_mb=_cap_mb(ddp0), threads=torch.get_num_threads(),
            memory=memory, mem_peak=peak,
            pipe=frames.PipeInfo(**pipe) if pipe is not None else frames.UNSET,
        ))
        self.sink.phase = "training"
        self.sink.send_now(frames.Phase(rank=self.rank, phase="training"))

    def _memory(self):
        """((parameters, gradients, optimizer state this rank holds, the whole model's
        parameters) in bytes, the CUDA allocator's peak or UNSET): after the first step, once
        the optimizer has made its state. Held: a DTensor's local shard (FSDP2)."""
        def local(t):
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size()
        seen: set[int] = set()
        held = grads = full = opt = 0
        try:
            for m in self.mods:
                for p in m.module.parameters():
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                    held += local(p)
                    full += p.numel() * p.element_size()
                    if p.grad is not None:
                        grads += local(p.grad)
            for o in self._opt_objs:
                for st in o.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor) and v.numel() > 1:  # (not the step count)
                            opt += local(v)
        except Exception:  # noqa: BLE001 - a figure: never fail the run for it
            return frames.UNSET, frames.UNSET
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else frames.UNSET
        return (held, grads, opt, full), peak

    def _place(self, layer: int) -> int:
        """A layer's place in forward order (internal index in), -1 for none or one not drawn."""
        order = self._order
        if order is None or not 0 <= layer < len(order):
            return -1
        pos = order[layer]
        return pos if pos < self._shown_n else -1

    def _emit(self, items) -> None:
        order = self._order
        rows = self.tap.new_rows() if items and order is not None else None
        if rows:  # the collectives these spans name, before them
            first = self.tap.sent - len(rows)
            self.sink.send_now(frames.Colls(rank=self.rank, strategy=self.strategy, rows=[
                (first + j, op, nb, size, group, self._place(layer), phase, asy)
                for j, (op, nb, size, group, layer, phase, asy) in enumerate(rows)]))
        for item in items:  # (resolved on the sink's thread: on CUDA an elapsed_time per mark)
            self.sink.put(_InOrder(item, order, self._shown_n))  # (its n_spans counted if dropped)

    def _layout_change(self, k: int) -> None:
        """Every module's buckets as one layout (each module's newest), sent when one changed."""
        changed = False
        for m in self.mods:
            if m.comm is not None and m.comm.track and m.comm.seen and m.layout_update():
                changed = True
        if not changed:
            return
        rows = [tuple(r) for m in self.mods for r in (m.layout or [])]
        reported = [x for m in self.mods for x in (m.reported or [])]
        self.sink.send_now(frames.Buckets(rank=self.rank, strategy=self.strategy, step=k,
                                          cap_mb=_cap_mb(self.mods[0].ddp), ddp_reported=reported,
                                          buckets=[(b, ps, nb) for b, ps, nb in rows]),
                           timeout=0.5)

    # -- the end ------------------------------------------------------------------------
    def close(self, why: str = "done") -> None:
        """Flush the last steps and say goodbye (also at interpreter exit)."""
        if self.closed:
            return
        self.closed = True
        rec = self.rec
        if self.stash is not None:
            rec.cur, self.stash = self.stash, None
        self._drop_other_start()
        for a, z in self.others:  # evaluation forwards no step followed
            self.clock.release(a)
            self.clock.release(z)
        self.others = []
        if rec.cur is not None:
            if rec.cur.synced:
                self._end()
            else:
                rec.discard()
        self._emit(rec.poll(wait=True, lazy=True))
        if (self.tap.traced or markop.captured[0]) and self._order is not None:
            self._say_traced(max(0, self.k - 1))
        fr = rec.fr
        if fr is not None and self._order is not None:  # the last steps' buckets read now; once
            fr.refresh(force=True)  # every step is resolved, how many NCCL's timing missed
            last_k = max(0, self.k - 1)
            self.sink.send_now(lambda: frames.Event(rank=self.rank, step=last_k, what="fr_untimed",
                                                    value=min(rec.fr_untimed, 2**31)))
        if self._order is not None:
            self.sink.phase = "done"
            self.sink.send_now(frames.Bye(rank=self.rank, why=why))  # (counts: the sink's, FrameQueue._final)
        self.sink.close(timeout=3.0)
        self.tap.deactivate()
        if self.pipe is not None and pipetap.active() is self.pipe:
            pipetap.activate(None)
        for m in self.mods:
            m.remove_hooks()

    def error(self, exc: BaseException) -> None:
        """Report an exception of the training script (then close)."""
        import traceback
        if self.closed:
            return
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=6))
        if self._order is None:  # the app needs to know the rank before an error
            self._hello_minimal()
        self.sink.send_now(frames.Error(rank=self.rank, msg=f"{type(exc).__name__}: {exc}".strip()[:500],
                                        tb=tb[-4000:]))
        self.closed = True
        self.tap.deactivate()
        self.sink.close(timeout=2.0)

    def _hello_minimal(self) -> None:
        self._order = list(range(len(self.names)))
        self._shown_n = len(self.names)
        self.layers = list(self.names)
        dev = str(self.device) if self.device.type == "cuda" else "cpu"
        self.sink.send_now(frames.Hello(rank=self.rank, world=self.world, pid=os.getpid(),
                                        host=socket.gethostname(), device=dev,
                                        backend=self.backend, strategies=[self.strategy],
                                        layers=self.layers))


_session: RankSession | None = None


# -- the handle ------------------------------------------------------------------------------
class Handle:
    """What ddptui.instrument returns for one DDP module: step() (a context manager), close()
    (this rank's recording: every DDP module of it), and what it found: `layers` (names, in
    forward order), `params` (names), `buckets` (the last layout reported). Several DDP
    modules of one rank share one RankSession: one step, one picture."""

    def __init__(self, ddp, layers="auto", optimizer=None, batch: int | None = None,
                 record: str | None = None, comm_hook=None, comm_state=None, name: str | None = None):
        global _session
        from torch.nn.parallel import DistributedDataParallel as DDP
        fsdp = is_fsdp(ddp)
        plain = not fsdp and not isinstance(ddp, DDP)
        if plain and not isinstance(ddp, nn.Module):
            raise TypeError("ddptui.instrument wants a model: a torch.nn.parallel.DistributedDataParallel, "
                            "an FSDP2 model (the module fully_shard was applied to last), or an nn.Module "
                            "whose gradients the script synchronises itself")
        if not dist.is_initialized() and not plain:  # (a plain model trains alone without one)
            raise RuntimeError("ddptui.instrument: init the process group first")
        if getattr(ddp, "_ddptui", None) is not None:
            raise RuntimeError("ddptui.instrument: this model is instrumented already")
        if plain and comm_hook is not None:
            raise TypeError("ddptui.instrument: comm_hook is for DistributedDataParallel; this model's "
                            "gradients are the script's own to synchronise")
        if not fsdp and not plain and ddp._comm_hooks:
            raise RuntimeError("ddptui.instrument: a comm hook is registered already; call "
                               "instrument() first, or pass it as comm_hook=")
        if fsdp and comm_hook is not None:
            raise TypeError("ddptui.instrument: comm_hook is for DistributedDataParallel, not FSDP2")
        self.ddp = ddp  # the wrapper: a DDP, or the FSDP2 root itself, or a plain model itself
        # what synchronises its gradients: DDP, FSDP2, or the script by hand ("plain": drawn as
        # naive or interleaved, by when its gradients' all_reduces go: RankSession._form)
        self.kind = "fsdp" if fsdp else "plain" if plain else "ddp"
        self.strategy = spec.USER_FSDP_STRATEGY if fsdp else PLAIN_STRATEGY if plain else STRATEGY
        self._hooks: list = []
        self.closed = False
        self.by_auto = False  # made by `ddptui run --auto` (the script's own instrument() returns it)
        self.label: str | None = None
        self.module = model = ddp if fsdp or plain else ddp.module
        self.comm: CommState | None = None
        self.frb: FrBuckets | None = None  # NCCL's own timing of the buckets (no comm hook)
        self.timing, self.timing_why = "comm-hook", None  # how the buckets are timed, and why
        self.device = _device_of(model)
        self.auto = isinstance(layers, str) and layers == "auto"
        chosen = choose_layers(model, layers)  # (a ValueError here leaves nothing behind)
        s = _session
        if s is None or s.closed:
            s = _session = RankSession(self, record, batch, name)
        elif not s.can_join() or s.kind != self.kind:
            # a DDP built once training has begun: the hello has named the layers already
            what = {"fsdp": "an FSDP2", "ddp": "a DDP", "plain": "a hand-synchronised"}
            why = "built after training began" if s.kind == self.kind else \
                f"beside {what[s.kind]} model (one kind a rank)"
            print(f"ddptui: {_KIND_NAMES[self.kind]} of "
                  f"{type(model).__name__} {why} is not drawn", file=sys.stderr)
            self.session = None
            ddp._ddptui = self
            return
        elif batch and not s.batch:
            s.batch = batch
        self.session = s
        self.rank, self.world = s.rank, s.world
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._named = named  # (DDP's own parameter order)
        self.base, self.pbase = s.join(self, chosen, named)
        self.n_layers, self.n_params = len(chosen), len(named)
        self._names = [n for n, _ in chosen]
        self.pindex = {id(p): self.pbase + i for i, (_, p) in enumerate(named)}
        if self.auto:
            for i, (_, mod) in enumerate(chosen, self.base):
                s.layer_params[i] = {self.pindex[id(p)] for p in mod.parameters() if id(p) in self.pindex}
        param_ends = self._owners(chosen, named)
        if plain:
            self._plain_params = [p for _, p in named]
        if fsdp:  # FSDP2 accumulates gradients on unsharded copies and sets the sharded
            # parameter's after its reduce-scatter (the root's last): its hooks would end a
            # layer's backward there. A layer's backward ends at its input's gradient.
            param_ends = []
        self._hooks += attach_module_hooks(chosen, s.rec, self.base, param_ends)
        self.layout: list | None = None
        self.reported: list[int] | None = None
        self.stable = 0
        ddp._ddptui = self
        self._register_op_codes(ddp)
        if fsdp:
            # FSDP2's own pre-forward hook on the root all-gathers: the step begins before it
            self._hooks.append(ddp.register_forward_pre_hook(self._forward_pre, prepend=True, with_kwargs=True))
        elif plain:  # (its gradients' collectives are the script's: the tap times them, RankSession)
            self._hooks.append(ddp.register_forward_pre_hook(self._forward_pre, prepend=True, with_kwargs=True))
        else:
            # the comm hook: ours, around the user's (given now, or registered later)
            self.comm = CommState(s.rec, s.world, self.pindex, comm_hook, comm_state, offset=self.pbase,
                                  owner=s.param_owner, pg=ddp.process_group)
            from ranks.builtin.strategies import comm_timing_for, quiet_runtime_stats
            quiet_runtime_stats(ddp)
            timing, self.timing_why = comm_timing_for(self.device) if comm_hook is None else \
                ("comm-hook", "the script's own comm hook")
            if timing == "flight-recorder":  # (NCCL's own timing: DDP's C++ AllReduce, untouched)
                s.use_flight_recorder()
                self.frb = FrBuckets(self.comm, ddp.process_group.group_name,
                                     ddp.process_group._get_backend(self.device))
            else:
                ddp.register_comm_hook(self.comm, timed_hook)
            self.timing = timing
            ddp.register_comm_hook = self._set_user_hook  # the user's later hook goes inside ours
            self._hooks.append(ddp.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        self._hooks.append(ddp.register_forward_hook(self._forward_post))
        self._outer = self._hooks[-2:]  # (the wrapper's own hooks: moved if it is compiled whole)
        if not fsdp and not plain:
            _watch_compile()
        if optimizer is not None:
            s.add_optimizer(optimizer, self._hooks)

    def _owners(self, chosen, named) -> list:
        """Which layer each parameter's gradient ends the backward of (and the params table's
        layer): the innermost chosen module holding it; a parameter that several modules hold
        side by side (a tied embedding and output layer) belongs to the one that uses it first
        in the forward, whose backward accumulates its gradient last (autograd runs the graph
        backwards), found from the first forward's marks (until then: the first registered).
        A parameter no chosen module holds goes with the nearest chosen module before it."""
        s = self.session
        names = self._names
        holders: dict[int, list[int]] = {}
        for i, (_, mod) in enumerate(chosen):
            for p in mod.parameters():
                if id(p) in self.pindex:
                    holders.setdefault(id(p), []).append(i)
        owner: dict[int, int] = {}
        self._tied: list[list[int]] = []  # each tied parameter's candidate layers (global)
        self._tied_owner: list[int] = []
        self._tied_params: list[int] = []  # their global parameter indices
        ends = []
        for _, p in named:
            hs = holders.get(id(p))
            if not hs:
                continue
            inner = [i for i in hs  # (nested choices: the innermost)
                     if not any(j != i and names[j].startswith(names[i] + ".") for j in hs)] or hs
            owner[id(p)] = inner[0]
            if len(inner) > 1:
                slot = len(self._tied)
                self._tied.append([self.base + i for i in inner])
                self._tied_owner.append(self.base + inner[0])
                self._tied_params.append(self.pindex[id(p)])
                ends.append((p, lambda t=self._tied_owner, j=slot: t[j]))
            else:
                ends.append((p, self.base + inner[0]))
        last = 0
        for _, p in named:
            last = owner.get(id(p), last)
            s.param_owner.append(self.base + last)
        return ends

    def _fix_tied(self) -> None:
        """After the first forward: each tied parameter's layer is the first of its holders to run."""
        s = self.session
        c = s.rec.cur
        cand = sorted({i for t in self._tied for i in t})
        ff = c.first_fwd
        toks = [ff[i] if ff is not None and ff[i] is not None else c.fwd_s[i] for i in cand]
        when = dict(zip(cand, s._times(c, toks)))
        for j, layers in enumerate(self._tied):
            ran = [i for i in layers if when.get(i) is not None]
            if ran:
                first = min(ran, key=lambda i: (when[i], i))
                self._tied_owner[j] = first
                s.param_owner[self._tied_params[j]] = first
        self._tied = []

    def _forward_pre(self, module, args, kwargs=None):
        if torch.compiler.is_compiling():  # (the module compiled: its hooks traced, no graph
            # break: the same at run time, from an op on its first input; ranks.core.markop)
            got = markop.marked(args, self._op_codes(module)[0 if torch.is_grad_enabled() else 1])
            return None if got is None else (got, kwargs or {})
        self.session.forward_pre(self.ddp, args, kwargs)
        if self.frb is not None:
            self._fr_unseen_sync(torch.is_grad_enabled())

    def _fr_unseen_sync(self, grad: bool) -> None:
        """NCCL's own timing, a forward with autograd on: whether its backward synchronises the
        gradients (DDP's `require_backward_grad_sync`, off under no_sync(): read here, where
        DDP's forward reads it) arms the buckets' hooks or not (FrBuckets.armed); and before
        DDP's buckets are known (its first step) no hook sees them go, yet the backward
        synchronises: the step counts it now, so that it ends as one (its buckets untimed, as
        DDP's first)."""
        if not grad:  # (an evaluation's forward: the next backward is the training one's)
            return
        sync = self.frb.armed = bool(self.ddp.require_backward_grad_sync)
        c = self.session.rec.cur
        if c is not None and not self.frb.keys and sync:
            c.synced += 1

    def _forward_post(self, module, args, out):
        if torch.compiler.is_compiling():
            return markop.marked(out, self._op_codes(module)[2 if torch.is_grad_enabled() else 3])
        self._forward_ended(torch.is_grad_enabled())

    def compiled_whole(self, opt) -> None:
        """torch.compile(ddp) made `opt` (its OptimizedModule): DDP's own forward breaks the
        graph around its reducer (prepare_for_forward, _inside_ddp_forward), and a hook on the
        DDP module, traced with it, changes what Dynamo does there (any hook, even one that does
        nothing: a break counted twice; an op of ours in those frames: a graph of its own where
        alone there is none). The DDP forward's own hooks move to `opt`, whose hooks run
        eagerly around the compiled call: its start and end marked where eager ones are, the
        DDP module traced as it is alone. (A call of the DDP module itself is no longer timed
        as a step's forward: a script calls what torch.compile returned.)"""
        if self.session is None or self.closed or getattr(self, "_moved", False):
            return
        self._moved = True
        for hd in self._outer:
            hd.remove()
        self._hooks.append(opt.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        self._hooks.append(opt.register_forward_hook(self._forward_post))

    def _forward_ended(self, grad: bool) -> None:
        s = self.session
        s.forward_post()
        if self._tied and s.rec.cur is not None and grad:
            self._fix_tied()

    def _op_codes(self, module) -> tuple[int, int, int, int]:
        """The ops' codes of this module's forward start and end, with autograd on and off
        (known while compiling; an op runs where autograd is off). Registered with the hooks,
        never while Dynamo traces (its side effects are replayed, its closures rebuilt)."""
        return self._codes

    def _register_op_codes(self, ddp) -> None:
        s = self.session

        def start(grad):
            def run(x):
                s.forward_pre(ddp, (x,), None, grad=grad)
                if self.frb is not None:
                    self._fr_unseen_sync(grad)
            return run
        self._codes = (markop.register(start(True), None), markop.register(start(False), None),
                       markop.register(lambda x: self._forward_ended(True), None),
                       markop.register(lambda x: self._forward_ended(False), None))

    def _set_user_hook(self, state, hook) -> None:
        """ddp.register_comm_hook after instrument(): the hook runs inside ddptui's (timed by
        NCCL until then: from now on by ddptui's comm hook, the script's collectives being its
        own to choose)."""
        if self.comm.inner is not None:
            raise RuntimeError("register_comm_hook can only be called once")
        self.ddp._check_comm_hook(hook)
        self.ddp.logger._set_comm_hook_name(hook.__qualname__)
        self.comm.inner, self.comm.inner_state = hook, state
        if self.frb is not None:
            self.frb.clear()
            self.frb = None
            self.timing, self.timing_why = "comm-hook", "the script's own comm hook"
            type(self.ddp).register_comm_hook(self.ddp, self.comm, timed_hook)

    def fr_give_up(self) -> None:
        """NCCL's own timing, DDP's buckets still unknown after its first steps (a layout this
        torch's DDP does not report): ddptui's comm hook times them from the next step on."""
        self.frb.clear()
        self.frb = None
        self.timing, self.timing_why = "comm-hook", "DDP's bucket layout could not be read"
        type(self.ddp).register_comm_hook(self.ddp, self.comm, timed_hook)

    def fr_layout(self) -> None:
        """NCCL's own timing: DDP's buckets as it reports them once rebuilt (its logging data:
        each bucket's parameter indices in arrival order, its bytes), as the comm hook would
        have seen them go by (`comm.seen`), and each bucket's ready hook (FrBuckets)."""
        from ranks import seams
        from ranks.builtin.strategies import ddp_reported_sizes
        ddp_reported_sizes(self.ddp)  # (its runtime stats taken here, between steps)
        if seams.ddp_layout_hidden():
            return
        data = self.ddp._get_ddp_logging_data()
        idx, sizes = data.get("rebuilt_per_bucket_param_indices") or "", data.get("rebuilt_bucket_sizes") or ""
        named = self._named
        params = [p for _, p in named]
        arrival = True
        try:
            per = [[int(x) for x in part.split()] for part in idx.split(",")] if idx else []
            nbytes = [int(x) for x in sizes.split(",")] if sizes else []
        except ValueError:
            return
        if not per and self.ddp.find_unused_parameters and not self.ddp.static_graph:
            # (a DDP that never rebuilds its buckets: its first layout, kept; any other
            # rebuilds them in its second forward, read once it has)
            per = self._first_layout(params) or []
            nbytes = [sum(params[i].numel() * params[i].element_size() for i in ps) for ps in per]
            arrival = False
        if not per or len(per) != len(nbytes) or any(not ps or max(ps) >= len(named) for ps in per):
            return
        self.comm.seen = [(b + self.pbase, [self.pindex[id(params[i])] for i in ps], n)
                          for b, (ps, n) in enumerate(zip(per, nbytes))]
        self.frb.set(per, params, nbytes, arrival=arrival)

    def _first_layout(self, params: list) -> list[list[int]] | None:
        """DDP's first bucket layout, which it keeps where it never rebuilds (find_unused_parameters
        without static_graph): assigned again as DDP assigned it when it was made (its own
        assignment function, its size limits, its parameters), each bucket's indices into
        `params`, in the reducer's bucket order. None where it cannot be told."""
        ddp = self.ddp
        try:
            mine, sparse = ddp._build_params_for_reducer()
            cfg = getattr(ddp, "_bucket_config", None)
            if cfg is not None:  # (torch 2.12 and on)
                limits, _ = cfg.compute_bucket_size_limits(static_graph=bool(ddp.static_graph),
                                                           find_unused_parameters=bool(ddp.find_unused_parameters))
            elif ddp.static_graph or not ddp.find_unused_parameters:
                limits = [sys.maxsize]
            elif getattr(ddp, "bucket_bytes_cap_default", False):
                limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, ddp.bucket_bytes_cap]
            else:
                limits = [ddp.bucket_bytes_cap]
            got, _ = dist._compute_bucket_assignment_by_size(mine, limits, sparse)
            pos = {id(p): i for i, p in enumerate(params)}
            return [[pos[id(mine[i])] for i in ps] for ps in reversed(got)]
        except Exception:  # (another torch's DDP: its layout unknown; untimed, said)
            return None

    def layout_update(self) -> bool:
        """This module's buckets as seen in the step just ended: True if they changed."""
        from ranks.builtin.strategies import ddp_reported_sizes
        # (a bucket reduced twice in one step, its last: a pipeline stage's first step, where
        # DDP reduces before its first bucket rebuild and again after)
        seen = sorted({b[0]: b for b in self.comm.seen}.values())
        reported = ddp_reported_sizes(self.ddp)
        if seen == self.layout and reported == self.reported:
            self.stable += 1
            if self.stable >= 3:
                self.comm.track = False
            return False
        self.layout, self.reported, self.stable = seen, reported, 0
        return True

    # -- what it found ------------------------------------------------------------------
    @property
    def layers(self) -> list[str]:
        """This module's layers, in forward order (once the first step is over)."""
        s = self.session
        if s is None or s._order is None:
            return list(getattr(self, "_names", []))
        order = s._order
        mine = sorted(range(self.base, self.base + self.n_layers), key=lambda i: order[i])
        return [s.layers[order[i]] for i in mine if order[i] < len(s.layers)]

    @property
    def params(self) -> list[str]:
        s = self.session
        if s is None:
            return []
        names = s.shown_params or s.param_names
        return names[self.pbase:self.pbase + self.n_params]

    @property
    def buckets(self) -> list[dict]:
        """The last bucket layout seen: index, parameter names, bytes sent."""
        s = self.session
        if s is None:
            return []
        names = s.shown_params or s.param_names
        return [{"index": b, "params": [names[i] for i in ps], "bytes": nb}
                for b, ps, nb in (self.layout or [])]

    @property
    def stop_asked(self) -> bool:
        return bool(self.session and self.session.stop_asked)

    # -- step boundaries ----------------------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """One training step, or one micro-step of gradient accumulation: a block whose
        backward synchronises nothing (no_sync()) goes on into the next block's step."""
        s = self.session
        if s is None:
            yield self
            return
        s.step_enter()
        try:
            yield self
        finally:
            s.step_exit()

    def close(self, why: str = "done") -> None:
        """Flush the last steps and say goodbye: this rank's recording, every DDP module of it."""
        self.closed = True
        if self.session is not None:
            self.session.close(why)

    def error(self, exc: BaseException) -> None:
        """Report an exception of the training script (then close)."""
        self.closed = True
        if self.session is not None:
            self.session.error(exc)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def module_label(ddp, index: int) -> tuple[str, object]:
    """A DDP module's name in the picture: its attribute path in the module that holds it
    (`bot_l`, `model.encoder`), else the script's global name for it, else its wrapped
    module's class and an index (`Sequential1`); and the outermost module found holding it."""
    import gc
    main = sys.modules.get("__main__")
    mods = [v for v in (vars(main).values() if main is not None else ()) if isinstance(v, nn.Module)]
    for top in mods:  # the script's own models first (cheap): a path inside one of them
        if top is ddp:
            continue
        for path, m in top.named_modules(remove_duplicate=False):
            if m is ddp and path:
                return path, top
    path, root, cur = [], None, ddp
    try:  # else whoever holds it (gc's referrers: a scan of the heap, once a module)
        for _ in range(16):
            got = _parent_of(cur, gc)
            if got is None:
                break
            parent, attr = got
            path.append(attr)
            root = cur = parent
    except Exception:  # noqa: BLE001 - a name is a nicety: never fail the run for it
        path = []
    if path:
        return ".".join(reversed(path)), root
    for k, v in (vars(main).items() if main is not None else ()):
        if v is ddp and not k.startswith("_"):
            return k, None
    return f"{type(getattr(ddp, 'module', ddp)).__name__}{index}", None


def _parent_of(mod, gc):
    """(the nn.Module whose child `mod` is, the attribute name) or None (gc's referrers)."""
    for d in gc.get_referrers(mod):
        if not isinstance(d, dict):
            continue
        attr = next((k for k, v in d.items() if v is mod), None)
        if not isinstance(attr, str):
            continue
        for o in gc.get_referrers(d):
            if isinstance(o, nn.Module) and o.__dict__.get("_modules") is d and o is not mod:
                return o, attr
            if type(o) is dict and o.get("_modules") is d:  # a module's own __dict__
                for m in gc.get_referrers(o):
                    if isinstance(m, nn.Module) and m.__dict__ is o and m is not mod:
                        return m, attr
    return None


def _batch_of(args, kwargs) -> int:
    """The batch of a forward: the first dimension of the first tensor (of one or more
    dimensions) in its positional arguments, then its keyword arguments (a tuple, list or
    dict one level down looked into: a (x, y) pair, HF's batch dict); 0 for none."""
    for group in (args, kwargs.values() if kwargs else ()):
        for a in group:
            if isinstance(a, torch.Tensor):
                if a.dim():
                    return int(a.shape[0])
                continue
            inner = a.values() if isinstance(a, dict) else a if isinstance(a, (tuple, list)) else ()
            for x in inner:
                if isinstance(x, torch.Tensor) and x.dim():
                    return int(x.shape[0])
    return 0


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


def backend_name(device) -> str:
    """The backend this rank's collectives on `device` run on: dist.get_backend(), or where it
    says "undefined" (a group made per device type, as init_device_mesh and an
    init_process_group without a backend make it) the default group's backend for the device."""
    if not dist.is_initialized():
        return "none"
    name = dist.get_backend()
    if name and name != "undefined":
        return name
    try:
        return str(dist.group.WORLD._get_backend(torch.device(device.type)).name())
    except Exception:  # noqa: BLE001 (a build or group without it: what torch said)
        return name or "undefined"


def _class_name(model) -> str:
    """A model's class name; for an FSDP2 model, the user's class (fully_shard makes a class
    `FSDP<name>` of FSDPModule and it)."""
    cls = type(model)
    if is_fsdp(model):
        from torch.distributed.fsdp import FSDPModule
        for base in cls.__bases__:
            if not issubclass(base, FSDPModule):
                return base.__name__
    return cls.__name__


def is_fsdp(model) -> bool:
    """An FSDP2 model (fully_shard applied to it)?"""
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:  # noqa: BLE001 - a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _cap_mb(ddp) -> float | None:
    """DDP's bucket_cap_mb, as the script gave it: DDP keeps int(MB * 2**20) bytes (0.05
    comes back 0.0499992): the shortest decimal DDP would have kept as those bytes."""
    b = getattr(ddp, "bucket_bytes_cap", None)
    if not b:
        return None
    for digits in range(1, 12):
        m = float(f"{(b + 0.5) / (1 << 20):.{digits}g}")
        if int(m * (1 << 20)) == b:
            return m
    return b / (1 << 20)


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


# -- the public entry ------------------------------------------------------------------------
_handles: list[Handle] = []
_auto_noted: list[bool] = []  # (the note that --auto is not needed: once a rank)


_watching: list[bool] = []


def _watch_compile() -> None:
    """torch.compile of an instrumented DDP module (its OptimizedModule made): the DDP
    forward's hooks moved to it (Handle.compiled_whole). Once a process."""
    if _watching:
        return
    _watching.append(True)
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # (a torch without Dynamo)
        return
    real = OptimizedModule.__init__

    def init(self, mod, *a, **kw):
        real(self, mod, *a, **kw)
        h = mod.__dict__.get("_ddptui")
        if h is not None and h.comm is not None:
            h.compiled_whole(self)

    OptimizedModule.__init__ = init


def instrument(ddp_model, layers="auto", optimizer=None, batch: int | None = None,
               record: str | None = None, comm_hook=None, comm_state=None,
               name: str | None = None) -> Handle:
    """Time a DistributedDataParallel model's layers, buckets and steps (see the module doc);
    an FSDP2 model's layers and collectives; or a plain nn.Module whose gradients the script
    reduces itself (each all_reduce of a parameter's .grad its gradient AllReduce; its steps
    end at the optimizer's step or at the end of `with handle.step():`).

    layers: "auto" | depth (int) | [module names]; optimizer: its step() is timed and ends a
    step when `with handle.step():` is not used; batch: the global batch of one step (of
    all its micro-steps under accumulation: samples/s);
    record: a directory for this rank's recording when not under ddptui (else DDPTUI_RECORD,
    else ./runs/<script>-<time>/); comm_hook/comm_state: a comm hook to run inside ddptui's
    (one registered later with ddp_model.register_comm_hook is taken the same way).

    Under `ddptui run --auto` a model is instrumented as it is built: instrument() on it
    returns the handle --auto made (its batch taken when --auto had none), with a note."""
    made = getattr(ddp_model, "_ddptui", None)
    if made is not None and getattr(made, "by_auto", False):
        if batch and made.session is not None and not made.session.batch:
            made.session.batch = batch
        if not _auto_noted:
            _auto_noted.append(True)
            if int(os.environ.get("RANK", "0")) == 0:
                print("ddptui: this script calls ddptui.instrument itself: --auto is not needed "
                      "(instrument() returns the handle --auto made)", file=sys.stderr, flush=True)
        return made
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
