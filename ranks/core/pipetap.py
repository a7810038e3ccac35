"""A pipeline's schedule seen from inside a rank (torch.distributed.pipelining; imports torch,
never the app).

Every schedule, single-stage (GPipe, 1F1B) or multi-stage (interleaved 1F1B, looped BFS, the
zero-bubble ones, DualPipeV), runs each microbatch through its stage objects' methods:
`forward_one_chunk(mb, ...)`, `backward_one_chunk(mb, ..., full_backward)` (the input-grad
half alone where full_backward is False) and `backward_weight_one_chunk(mb)`; the P2P ops it
sends and receives come from `get_fwd_send_ops` / `get_bwd_send_ops` / `get_fwd_recv_ops` /
`get_bwd_recv_ops`, and its `step()` is the pipeline's step. `install()` wraps those methods
of `_PipelineStageBase` and the two schedule bases once a process (one attribute read when
no tap is active, as the collective tap's wrappers); with a `PipeTap` active:

- each call of a chunk method is a microbatch span (wire.MB: its stage, microbatch and part),
  and closes the recorder's micro-step before and after it, so that each layer's spans are
  that microbatch's (a stage's blocks run once a microbatch);
- each schedule `step()` call is a PIPE span: what the bubble is measured against (the share
  of it in which the stage ran no microbatch), and starts the rank's step if none is open
  (a last stage's first wait for its input is in the step);
- each tensor of the P2P ops is noted (`p2p_of`): the collective tap names a send or
  receive of it by direction, activations forward or gradients backward, and peer.

The schedule (name, stages, microbatches, this rank's stage indices, the plan's idle share
of its step) is `info()`, for the hello.
"""
from __future__ import annotations

import threading

from ranks.wire import MB, PIPE, mb_idx

MB_FWD, MB_BWD, MB_BWD_IN, MB_BWD_W = 0, 1, 2, 3  # a microbatch span's part (ranks.wire.mb_idx)

_tap: "PipeTap | None" = None
_installed = False
_lock = threading.Lock()

# a schedule's class -> the strategy it is drawn as (ranks.spec.PIPELINE_STRATEGIES)
SCHEDULE_NAMES = {"ScheduleGPipe": "gpipe", "Schedule1F1B": "1f1b",
                  "ScheduleInterleaved1F1B": "interleaved1f1b", "ScheduleLoopedBFS": "loopedbfs",
                  "ScheduleInterleavedZeroBubble": "interleavedzb", "ScheduleZBVZeroBubble": "zbv",
                  "ScheduleDualPipeV": "dualpipev"}


def schedule_name(sched) -> str:
    """The strategy a schedule is drawn as: its class's, or its nearest known base's (a
    script's own subclass); single-stage ones unknown: 1f1b's family name, gpipe."""
    for cls in type(sched).__mro__:
        got = SCHEDULE_NAMES.get(cls.__name__)
        if got is not None:
            return got
    return "interleaved1f1b" if hasattr(sched, "_stages") else "gpipe"


def _chunk(part: int, orig):
    def wrapper(self, chunk_id, *args, **kwargs):
        tap = _tap
        if tap is None:
            return orig(self, chunk_id, *args, **kwargs)
        if part == MB_BWD and not kwargs.get("full_backward", args[1] if len(args) > 1 else True):
            p = MB_BWD_IN
        else:
            p = part
        token = tap.chunk_begin(self, chunk_id)
        if p == MB_FWD and self.stage_index == 0 and args:  # (the pipeline's samples: its inputs)
            tap.count_samples(args[0])
        try:
            return orig(self, chunk_id, *args, **kwargs)
        finally:
            tap.chunk_end(self, chunk_id, p, token)
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    wrapper.__name__ = orig.__name__
    return wrapper


def _ops(direction: str, orig):
    def wrapper(self, chunk_id, *args, **kwargs):
        ops = orig(self, chunk_id, *args, **kwargs)
        tap = _tap
        if tap is not None and ops:
            tap.note_ops(ops, direction, self.stage_index, chunk_id)
        return ops
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    wrapper.__name__ = orig.__name__
    return wrapper


def _step(orig):
    def wrapper(self, *args, **kwargs):
        tap = _tap
        if tap is None:
            return orig(self, *args, **kwargs)
        token = tap.step_begin(self)
        try:
            return orig(self, *args, **kwargs)
        finally:
            tap.step_end(token)
    wrapper.__wrapped__ = wrapper._ddptui_orig = orig
    wrapper.__name__ = orig.__name__
    return wrapper


def install() -> bool:
    """Wrap the stage's chunk and P2P methods and the schedules' step() (once a process;
    idempotent). False where torch has no pipelining."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from torch.distributed.pipelining import schedules, stage
        except Exception:  # noqa: BLE001 - a torch without it
            return False
        base = stage._PipelineStageBase
        for name, part in (("forward_one_chunk", MB_FWD), ("backward_one_chunk", MB_BWD),
                           ("backward_weight_one_chunk", MB_BWD_W)):
            orig = getattr(base, name, None)
            if orig is not None and not hasattr(orig, "_ddptui_orig"):
                setattr(base, name, _chunk(part, orig))
        for name, direction in (("get_fwd_send_ops", "forward"), ("get_fwd_recv_ops", "forward"),
                                ("get_bwd_send_ops", "backward"), ("get_bwd_recv_ops", "backward")):
            orig = getattr(base, name, None)
            if orig is not None and not hasattr(orig, "_ddptui_orig"):
                setattr(base, name, _ops(direction, orig))
        for cls_name in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
            cls = getattr(schedules, cls_name, None)
            orig = getattr(cls, "step", None) if cls is not None else None
            if orig is not None and "step" in vars(cls) and not hasattr(orig, "_ddptui_orig"):
                cls.step = _step(orig)
        _installed = True
        return True


def plan_idle(sched) -> float | None:
    """The schedule's planned idle share of this rank's step, each action one time unit:
    GPipe and 1F1B `(p - 1) / (m + p - 1)` (p stages, m microbatches, a forward and a
    backward each); the others from their `pipeline_order` (the rank's empty slots over its
    slots, to its last action; the rank as the schedule counts it, in its pipeline group).
    None where neither is known."""
    stages = getattr(sched, "_num_stages", None)
    m = getattr(sched, "_n_microbatches", None)
    if schedule_name(sched) in ("gpipe", "1f1b") and stages and m:
        return (stages - 1) / (m + stages - 1)
    order = getattr(sched, "pipeline_order", None)
    me = getattr(sched, "rank", None)
    if not isinstance(order, dict) or me not in order:
        return None
    acts = [a for a in order[me] if a is None or str(getattr(a, "computation_type", "")).split(".")[-1]
            in ("F", "B", "I", "W", "FORWARD", "FULL_BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "OVERLAP_F_B")]
    while acts and acts[-1] is None:
        acts.pop()
    return sum(a is None for a in acts) / len(acts) if acts else None


class PipeTap:
    """A rank's view of its pipeline (one a process, made by RankSession once a schedule is
    seen): `rec` a UserRecorder, `session` the RankSession whose step a schedule's step is."""

    def __init__(self, session):
        self.session = session
        self.rec = session.rec
        self.sched = None  # the schedule last stepped
        self.stages: dict[int, int] = {}  # id(stage object) -> its stage index
        self.mod_stage: dict[int, int] = {}  # id(a stage's module) -> its stage index
        self.p2p: dict[int, tuple] = {}  # id(tensor) -> (direction, peer, stage, microbatch), this step's
        self.steps = 0  # schedule steps seen
        self.samples = 0  # the first stage's microbatch samples, in the step before the hello

    # -- the schedule's step ------------------------------------------------------------
    def step_begin(self, sched):
        self.sched = sched
        self.steps += 1
        if self.session._order is None:  # (the samples counted are the step's: the hello's)
            self.samples = 0
        s = self.session
        s.pipe_step_begin()
        rec = self.rec
        if rec.cur is None:
            return None
        return rec.clock.mark()

    def step_end(self, token) -> None:
        rec = self.rec
        self.p2p.clear()
        self.session.pipe_step_end()
        c = rec.cur
        if c is None or token is None:
            return
        rec.micro()
        self.session.fwd_mods.clear()
        c.micro.append((PIPE, 0, token, rec.clock.mark()))

    # -- a microbatch -------------------------------------------------------------------
    def chunk_begin(self, stage, mb: int):
        if id(stage) not in self.stages:
            self.stages[id(stage)] = stage.stage_index
            self.mod_stage[id(getattr(stage, "submod", None))] = stage.stage_index
        rec = self.rec
        if rec.cur is None:
            return None
        rec.micro()
        self.session.fwd_mods.clear()
        return rec.clock.mark()

    def chunk_end(self, stage, mb: int, part: int, token) -> None:
        rec = self.rec
        c = rec.cur
        if c is None or token is None:
            return
        t = rec.clock.mark()
        rec.micro()
        self.session.fwd_mods.clear()
        c.micro.append((MB, mb_idx(stage.stage_index, mb, part), token, t))

    def count_samples(self, inputs) -> None:
        """The first stage's microbatch inputs: their first dimension, counted into the step's
        samples until the hello (every other stage's inputs are these samples again)."""
        s = self.session
        if s._order is not None:
            return
        t = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else inputs
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) > 0:
            self.samples += int(shape[0])

    # -- its sends and receives ---------------------------------------------------------
    def note_ops(self, ops, direction: str, stage: int, mb: int) -> None:
        p2p = self.p2p
        for op in ops:
            t = getattr(op, "tensor", None)
            if t is not None:
                peer = getattr(op, "peer", None)
                p2p[id(t)] = (direction, int(peer) if peer is not None else -1, int(stage), int(mb))

    def p2p_of(self, t) -> tuple[str, int, int, int] | None:
        """(direction, peer, stage, microbatch) of a tensor a P2P op of the schedule sends or
        receives, else None."""
        return self.p2p.get(id(t))

    def info(self, layers: list[str] | None = None) -> dict | None:
        """The schedule, for the hello: name, stages, microbatches, this rank's stage indices,
        the plan's idle share of its step, and `layers`: this rank's own layer names (each rank
        holds other layers)."""
        sched = self.sched
        if sched is None:
            return None
        out = {"schedule": schedule_name(sched), "stages": max(1, int(getattr(sched, "_num_stages", 1) or 1)),
               "microbatches": max(1, int(getattr(sched, "_n_microbatches", 1) or 1)),
               "rank_stages": sorted(set(self.stages.values())),
               "plan_idle": plan_idle(sched)}
        if layers is not None:
            out["layers"] = [str(x)[:64] for x in layers]
        return out


def activate(tap: "PipeTap | None") -> None:
    global _tap
    _tap = tap


def active() -> "PipeTap | None":
    return _tap


__all__ = ["install", "PipeTap", "activate", "active", "schedule_name", "plan_idle", "MB_FWD", "MB_BWD",
           "MB_BWD_IN", "MB_BWD_W"]
