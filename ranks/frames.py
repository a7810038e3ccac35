"""The protocol: one typed Struct per frame type, read and written by both sides.

A frame on the wire is a 4-byte big-endian length followed by a msgpack map whose ``t`` key
names its type (ranks.wire splits a byte stream into bodies). Here each type is a
``msgspec.Struct`` with readable attribute names mapped to the short wire keys
(``Hb.step`` travels as ``"k"``), its ranges and lengths declared on the fields, and all of
them one tagged union on ``t``: ``decode(body)`` decodes *and* validates a body in one C
call and returns the frame's Struct, or raises FrameError with a short reason
("invalid hb frame: k: expected int >= -1"). Keys a type does not declare are ignored, so
a newer peer may add fields; adding one here is one line, with a default.

What a field cannot say alone (a rank inside this run's world, a bucket listed twice, a
straggler's layer) is checked by ``check(frame, limits)`` after decoding, against the run's
``Limits``; nothing of a frame is trusted before both have passed. Span frames keep their
columnar fast path: their columns stay bytes here and ``check`` returns the decoded
``wire.SpanBatch`` (kind/idx columns checked with bytes.translate/count in C, no Python loop
per span).

Optional fields are of two kinds: those with a natural default (``Hb.dropped = 0``), and
those whose absence means "not known" (``msgspec.UNSET``, falsy; nil is still refused for
them, as it always was). Encoding omits fields at their default, so frames stay as small as
the dicts they replace and recordings made before this module read back unchanged.

Frame groups: RANK_FRAMES (a rank to the app), APP_FRAMES (the app's own, recorded with the
ranks'), CONTROL_FRAMES (the app to ranks), NET_FRAMES (node 0's join listener and
``ddptui join``, never recorded).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

from . import spec, wire
from .wire import FrameError

__all__ = [
    "UNSET", "FrameError", "Undecodable", "Invalid", "Limits", "NO_LIMITS", "decode",
    "decode_or_invalid", "validate", "encode", "check", "check_spans", "to_dict", "Frame",
]

MAX_RANK = 4095
_FMAX = 1.7976931348623157e308  # a float's bounds: a range with them refuses nan and inf

# -- field types (ranges and lengths declared once) -----------------------------------------
RankT = Annotated[int, Meta(ge=0, le=MAX_RANK)]
StepT = Annotated[int, Meta(ge=0, le=2**31 - 1)]
I64 = Annotated[int, Meta(ge=-2**63, le=2**63 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Ns = Annotated[int, Meta(ge=0, le=2**63 - 1)]  # a CLOCK_MONOTONIC reading in ns
U16 = Annotated[int, Meta(ge=0, le=0xFFFF)]
Num = Annotated[float, Meta(ge=-_FMAX, le=_FMAX)]  # any finite number
Wall = Annotated[float, Meta(ge=0, le=_FMAX)]  # seconds since the epoch
Text = Annotated[str, Meta(max_length=4000)]
Name = Annotated[str, Meta(max_length=256)]
Hex = Annotated[str, Meta(max_length=128)]
StrategyT = Literal[tuple(spec.WIRE_STRATEGIES)]  # type: ignore[valid-type]
CapMb = Annotated[float, Meta(gt=0, le=4096)]
SlowMs = Annotated[float, Meta(ge=0, le=60_000)]
Level = Literal["info", "warn", "error"]
OptNum = Union[Num, None]
NodeT = Annotated[int, Meta(ge=0, le=MAX_RANK)]  # a host's node rank (multi-node)


class Frame(Struct, tag_field="t", omit_defaults=True, kw_only=True):
    """Every frame: its type is its class (the wire's ``t``)."""

    @property
    def type(self) -> str:
        return TAG[type(self)]


# -- from ranks ------------------------------------------------------------------------------
class Auth(Frame, tag="auth", kw_only=True):
    """A connection's first frame: the run's token, the rank it speaks for, the protocol."""
    token: Annotated[str, Meta(max_length=256)]
    rank: RankT = field(name="r")
    version: Annotated[int, Meta(ge=0, le=2**16)] = field(name="v")
    pid: Count | UnsetType = UNSET


ParamRow = tuple[Name, Count, U16]  # (name, elements, layer index)


class PipeInfo(Struct, omit_defaults=True, kw_only=True):
    """A pipeline's schedule, as a rank runs it (ranks.core.pipetap): the strategy it is
    drawn as, its stages and microbatches, this rank's stage indices, and the schedule's
    planned idle share of this rank's step (each action one time unit; None: unknown)."""
    schedule: Literal[spec.PIPELINE_STRATEGIES]  # type: ignore[valid-type]
    stages: Annotated[int, Meta(ge=1, le=4096)]
    microbatches: Annotated[int, Meta(ge=1, le=1 << 20)]
    rank_stages: Annotated[list[Annotated[int, Meta(ge=0, le=4095)]], Meta(max_length=64)]
    plan_idle: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    # this rank's own layer names, stage-prefixed (the hello's `layers` are positions: "block 0"
    # is each rank's first block, whatever it holds)
    layers: Annotated[list[Name], Meta(max_length=0xFFFF)] | UnsetType = UNSET


class Hello(Frame, tag="hello", kw_only=True):
    """A rank's description of itself and of the run (rank 0's describes the run)."""
    rank: RankT = field(name="r")
    world: Annotated[int, Meta(ge=1, le=MAX_RANK + 1)]
    local_rank: RankT | UnsetType = UNSET
    pid: Count | None | UnsetType = UNSET
    host: Name | UnsetType = UNSET
    device: Name = ""
    backend: Annotated[str, Meta(max_length=16)] = ""
    note: Text = ""
    torch: Name | UnsetType = UNSET
    model: Annotated[str, Meta(max_length=32)] | UnsetType = UNSET
    layers: Annotated[list[Name], Meta(max_length=0xFFFF)] | UnsetType = UNSET
    params: Annotated[list[ParamRow], Meta(max_length=0xFFFF)] | UnsetType = UNSET
    strategies: Annotated[list[StrategyT], Meta(max_length=len(spec.WIRE_STRATEGIES))] | UnsetType = UNSET
    batch: Annotated[int, Meta(ge=1, le=2**31)] | UnsetType = UNSET
    # (a user's model, its global batch not given) this rank's samples in its first step:
    # the first dimension of the first tensor its model was called with, summed over the
    # step's forwards; 0: no input had one. The app sums the ranks' (RunInfo.take_hello).
    rank_batch: Annotated[int, Meta(ge=0, le=2**31)] | UnsetType = UNSET
    steps: Count | UnsetType = UNSET
    bucket_cap_mb: CapMb | None | UnsetType = UNSET
    seed: I64 | UnsetType = UNSET
    lr: Num | UnsetType = UNSET
    threads: Annotated[int, Meta(ge=1, le=1 << 16)] | UnsetType = UNSET
    uuid: Annotated[str, Meta(max_length=64)] | UnsetType = UNSET  # the GPU's UUID
    # this rank's training state in bytes after its first step: (parameters held, gradients
    # held, optimizer state held, the whole model's parameters): held = a shard under FSDP2,
    # everything under DDP; and the device allocator's peak so far (CUDA)
    memory: tuple[Count, Count, Count, Count] | UnsetType = field(name="mem", default=UNSET)
    mem_peak: Count | UnsetType = UNSET
    pipe: PipeInfo | UnsetType = UNSET  # a pipeline's schedule (its strategy one of PIPELINE_STRATEGIES)


class Phase(Frame, tag="phase", kw_only=True):
    """What a rank is doing now (rendezvous, building, training...)."""
    rank: RankT = field(name="r")
    phase: Annotated[str, Meta(max_length=32)] = field(name="ph")


class Spans(Frame, tag="spans", kw_only=True):
    """One rank's spans of one step of one strategy, as columns (spans_frame builds one):
    kind u8[n], idx u16[n], t0/t1 u32[n] µs after base_ns, iss u32[n_comm] (each
    AllReduce's issue time), wait u32[3 n_wait] (wire.WAIT: absent when empty). ``check``
    turns it into a wire.SpanBatch."""
    rank: RankT = field(name="r")
    strategy: StrategyT = field(name="s")
    step: StepT = field(name="k")
    base_ns: Ns = field(name="b")
    kind: bytes
    idx: bytes
    t0: bytes
    t1: bytes
    iss: bytes
    wait: bytes = field(name="w", default=b"")


BucketRow = tuple[U16, Annotated[list[U16], Meta(max_length=0xFFFF)], Count]  # (id, params, bytes)


class Buckets(Frame, tag="buckets", kw_only=True):
    """DDP's bucket assignment on a rank as of a step (and what DDP itself reports)."""
    rank: RankT = field(name="r")
    strategy: StrategyT = field(name="s")
    step: StepT = field(name="k")
    cap_mb: CapMb | None = None
    ddp_reported: Annotated[list[Count], Meta(max_length=0xFFFF)] | None = None
    buckets: Annotated[list[BucketRow], Meta(min_length=1, max_length=0xFFFF)]


CollOpT = Literal[spec.COLL_OPS]  # type: ignore[valid-type]
LayerRef = Annotated[int, Meta(ge=-1, le=0xFFFF)]  # a layer (forward order), -1: none
# (id, op, bytes, group size, group, issuing layer, phase, async): one row of a collectives table;
# group: `world`, a mesh dimension's `mesh_tp`, or one of a dimension's groups of some of the
# ranks `mesh_tp@2` (its lowest rank; ranks/core/colltap.py CollTap._group)
CollRow = tuple[U16, CollOpT, Count, Annotated[int, Meta(ge=1, le=MAX_RANK + 1)],
                Annotated[str, Meta(max_length=64)], LayerRef,
                Literal[spec.COLL_PHASES], bool]  # type: ignore[valid-type]


class Colls(Frame, tag="colls", kw_only=True):
    """New rows of a rank's collectives table: what each COLL span (its idx: the row's id)
    was. Sent before the first spans frame that uses them; rows are never changed."""
    rank: RankT = field(name="r")
    strategy: StrategyT = field(name="s")
    rows: Annotated[list[CollRow], Meta(min_length=1, max_length=0xFFFF)]


# (op, group sequence number, bytes, issuing layer, when it was issued: host ns)
Inflight = tuple[CollOpT, Count, Count, LayerRef, Ns]  # type: ignore[valid-type]


class Event(Frame, tag="event", kw_only=True):
    """A change applied at a step: DDP's bucket cap, or an injected straggler."""
    rank: RankT = field(name="r")
    step: StepT = field(name="k")
    what: Annotated[str, Meta(max_length=32)]
    value: Num
    slow_rank: RankT | UnsetType = field(name="rank", default=UNSET)
    layer: U16 | UnsetType = UNSET


class Hb(Frame, tag="hb", kw_only=True):
    """A rank's heartbeat: its step, phase, what it dropped, its CUDA clock residual."""
    rank: RankT = field(name="r")
    step: Annotated[int, Meta(ge=-1, le=2**31 - 1)] = field(name="k")
    phase: Annotated[str, Meta(max_length=32)] | UnsetType = field(name="ph", default=UNSET)
    dropped: Count = field(name="drop", default=0)
    dropped_frames: Count = field(name="dropf", default=0)
    ts: Ns | UnsetType = UNSET
    residual_ns: I64 | UnsetType = field(name="res", default=UNSET)
    # CUDA: how far a span's time may be off, the GPU timer's map to host time (CudaClock.bound_ns)
    bound_ns: I64 | UnsetType = field(name="cb", default=UNSET)
    # the oldest collective this rank has entered and not left (a hang names it), if any
    waiting: Inflight | UnsetType = field(name="w", default=UNSET)
    colls: Count | UnsetType = field(name="nc", default=UNSET)  # collectives entered so far
    # the DDP bucket `waiting` is the AllReduce of (ddptui's comm hook), if it is one
    bucket: Count | UnsetType = field(name="wb", default=UNSET)
    # a pipeline's send or receive `waiting` is (ranks.core.pipetap): activations ("forward")
    # or gradients ("backward"), the peer rank, this rank's stage, the microbatch
    p2p: tuple[Literal["forward", "backward"], Annotated[int, Meta(ge=-1, le=MAX_RANK)],
               Annotated[int, Meta(ge=0, le=4095)], Annotated[int, Meta(ge=0, le=1 << 20)]] | UnsetType = \
        field(name="wp", default=UNSET)


class Bye(Frame, tag="bye", kw_only=True):
    """A rank's last frame."""
    rank: RankT = field(name="r")
    why: Annotated[str, Meta(max_length=64)] = ""
    dropped: Count | UnsetType = field(name="drop", default=UNSET)
    dropped_frames: Count = field(name="dropf", default=0)


class Error(Frame, tag="error", kw_only=True):
    """A rank failed: the exception in one line, and its traceback."""
    rank: RankT = field(name="r")
    msg: Text
    tb: Annotated[str, Meta(max_length=8000)] = ""


# -- from the app (recorded with the ranks' frames) ------------------------------------------
class Status(Frame, tag="status", kw_only=True):
    """A line of the launcher's progress or the app's own news."""
    text: Text
    level: Level = "info"
    ts: Wall | UnsetType = UNSET


MAX_OUTPUT_LINE = 2000  # characters of a line of a rank's output (a longer one: split)
MAX_OUTPUT_LINES = 1000  # lines in one output frame


class Output(Frame, tag="output", kw_only=True):
    """Lines a rank's process wrote (the script's own prints: its stdout or stderr), and how
    many of that rank's lines before these were dropped (output beyond what a run records)."""
    rank: RankT = field(name="r")
    stream: Literal["out", "err"] = "out"
    lines: Annotated[list[Annotated[str, Meta(max_length=MAX_OUTPUT_LINE)]], Meta(max_length=MAX_OUTPUT_LINES)]
    dropped: Count = 0
    ts: Wall | UnsetType = UNSET


class Exit(Frame, tag="exit", kw_only=True):
    """A rank's process ended (the launcher saw it)."""
    rank: RankT = field(name="r")
    status: Annotated[str, Meta(max_length=200)]


class GpuSample(Struct, omit_defaults=True, kw_only=True):
    """One GPU's NVML readings at one moment (None: not supported there)."""
    index: Annotated[int, Meta(ge=0, le=1024)]
    name: Name = ""
    util: OptNum = None
    mem_used_mb: OptNum = None
    mem_total_mb: OptNum = None
    power_w: OptNum = None
    sm_clock_mhz: OptNum = None
    pcie_tx_mbs: OptNum = None
    pcie_rx_mbs: OptNum = None
    nvlink_tx_mbs: OptNum = None
    nvlink_rx_mbs: OptNum = None
    uuid: Annotated[str, Meta(max_length=96)] | None = None
    sm_active: OptNum = None


class Gpu(Frame, tag="gpu", kw_only=True):
    """NVML readings of every GPU at one moment (host CLOCK_MONOTONIC ns)."""
    ts: Ns
    gpus: Annotated[list[GpuSample], Meta(max_length=1024)]


class Cpu(Frame, tag="cpu", kw_only=True):
    """Each rank's CPU use at one moment (percent of a core; keys are ranks as text)."""
    ts: Ns
    ranks: Annotated[dict[Annotated[str, Meta(max_length=8)], OptNum], Meta(max_length=MAX_RANK + 1)]


class Reject(Frame, tag="reject", kw_only=True):
    """A frame or a connection the app refused, and why."""
    rank: RankT | None = field(name="r", default=None)
    frame_type: Annotated[str, Meta(max_length=32)] | None = field(name="ft", default=None)
    why: Text
    ts: Wall | UnsetType = UNSET


class Drop(Frame, tag="drop", kw_only=True):
    """A rank's connection closed (bye: after its bye frame)."""
    rank: RankT = field(name="r")
    why: Annotated[str, Meta(max_length=200)]
    bye: bool = False


class Node(Frame, tag="node", kw_only=True):
    """Multi-node: which host a rank runs on."""
    rank: RankT = field(name="r")
    node: NodeT
    host: Name | UnsetType = UNSET


class Clock(Frame, tag="clock", kw_only=True):
    """Multi-node: a host's clock against node 0's (ns), from exchanges and collectives."""
    node: NodeT
    host: Name
    offset_ns: I64 = field(name="off")
    uncertainty_ns: Count = field(name="unc")
    drift: Annotated[float, Meta(ge=-1, le=1)] | UnsetType = UNSET
    ref: I64 | UnsetType = UNSET
    samples: Count | UnsetType = field(name="n", default=UNSET)
    ntp_offset_ns: I64 | UnsetType = field(name="ntp_off", default=UNSET)
    ntp_uncertainty_ns: Count | UnsetType = field(name="ntp_unc", default=UNSET)
    collectives: Count | UnsetType = field(name="coll", default=UNSET)
    steps: Count | UnsetType = UNSET


# -- from the app to ranks -------------------------------------------------------------------
class Stop(Frame, tag="stop", kw_only=True):
    """Stop training, and why."""
    why: Annotated[str, Meta(max_length=200)] | UnsetType = UNSET


class Set(Frame, tag="set", kw_only=True):
    """Change a setting from a step on: DDP's bucket cap, or an injected straggler."""
    key: Literal["bucket_cap_mb", "slow_ms"]
    value: Annotated[float, Meta(ge=0, le=60_000)]
    seq: Annotated[int, Meta(ge=1, le=2**31 - 1)]
    slow_rank: RankT | UnsetType = field(name="rank", default=UNSET)
    layer: U16 | UnsetType = UNSET


class Dump(Frame, tag="dump", kw_only=True):
    """Write your Flight Recorder now into the run's dump directory (DDPTUI_FR_DIR): a hang was
    named, and the dumps say what ddptui does not time (the collectives C++ issues)."""
    why: Annotated[str, Meta(max_length=200)] | UnsetType = UNSET


# -- node 0's join listener and `ddptui join` (never recorded) -------------------------------
class Challenge(Frame, tag="challenge", kw_only=True):
    version: Annotated[int, Meta(ge=0, le=2**16)] = field(name="v")
    run: Annotated[str, Meta(max_length=64)]
    nonce: Hex


class Join(Frame, tag="join", kw_only=True):
    role: Literal["ctl", "rank"]
    node: NodeT
    rank: RankT | UnsetType = field(name="r", default=UNSET)
    host: Name
    run: Annotated[str, Meta(max_length=64)]
    cnonce: Hex
    mac: Hex


class Welcome(Frame, tag="welcome", kw_only=True):
    mac: Hex
    settings: dict[str, Any] | UnsetType = UNSET


class Ping(Frame, tag="ping", kw_only=True):
    seq: Annotated[int, Meta(ge=0, le=2**31)] = field(name="s")
    t1: I64


class Pong(Frame, tag="pong", kw_only=True):
    seq: Annotated[int, Meta(ge=0, le=2**31)] = field(name="s")
    t1: I64
    t2: I64
    t3: I64


class End(Frame, tag="end", kw_only=True):
    why: Annotated[str, Meta(max_length=200)] | UnsetType = UNSET


def spans_frame(rank: int, strategy: str, step: int, base_ns: int,
                kinds, idxs, t0_ns, t1_ns, iss_ns) -> Spans:
    """A spans frame from absolute ns lists (iss_ns: one per COMM span, in order); entries of
    kind wire.WAIT go to its wait column."""
    wait = b""
    if wire.WAIT in kinds:
        keep = [i for i, k in enumerate(kinds) if k != wire.WAIT]
        wait = wire.wait_column(base_ns, [(t0_ns[i], t1_ns[i], idxs[i]) for i, k in enumerate(kinds)
                                          if k == wire.WAIT])
        kinds, idxs = [kinds[i] for i in keep], [idxs[i] for i in keep]
        t0_ns, t1_ns = [t0_ns[i] for i in keep], [t1_ns[i] for i in keep]
    kind, idx, t0, t1, iss = wire.span_columns(base_ns, kinds, idxs, t0_ns, t1_ns, iss_ns)
    return Spans(rank=rank, strategy=strategy, step=step, base_ns=base_ns,
                 kind=kind, idx=idx, t0=t0, t1=t1, iss=iss, wait=wait)


RANK_TYPES = (Hello, Phase, Spans, Buckets, Colls, Event, Hb, Bye, Error)
APP_TYPES = (Status, Exit, Gpu, Cpu, Reject, Drop, Node, Clock, Output)
CONTROL_TYPES = (Stop, Set, Dump)
NET_TYPES = (Challenge, Join, Welcome, Ping, Pong, End)
ALL_TYPES = (Auth,) + RANK_TYPES + APP_TYPES + CONTROL_TYPES + NET_TYPES
BY_TAG: dict[str, type[Frame]] = {c.__struct_config__.tag: c for c in ALL_TYPES}  # type: ignore[misc]
TAG: dict[type, str] = {c: t for t, c in BY_TAG.items()}  # a frame's type name: TAG[type(f)]


def _names(types) -> frozenset[str]:
    return frozenset(c.__struct_config__.tag for c in types)


RANK_FRAMES = _names(RANK_TYPES)
APP_FRAMES = _names(APP_TYPES)
CONTROL_FRAMES = _names(CONTROL_TYPES)
NET_FRAMES = _names(NET_TYPES)
RECORDED_FRAMES = RANK_FRAMES | APP_FRAMES

AnyFrame = Union[ALL_TYPES]  # type: ignore[valid-type]
_decoder = msgspec.msgpack.Decoder(AnyFrame)
_encoder = msgspec.msgpack.Encoder()


def decoder() -> msgspec.msgpack.Decoder:
    """The union's decoder, for a hot loop that says its own errors through decode()."""
    return _decoder


# -- errors: msgspec's, said the way the app says them ----------------------------------------
def _reason(e: msgspec.ValidationError, body_type: str | None = None) -> str:
    """'Expected `int` >= -1 - at `$.k`' -> 'k: expected int >= -1'."""
    text = str(e)
    msg, _, at = text.partition(" - at `$")
    msg = msg.replace("`", "")
    msg = msg[:1].lower() + msg[1:]
    if at:
        path = at.rstrip("`").lstrip(".")
        if path == "t":
            return f"unknown frame type ({msg})"
        return f"{path}: {msg}"
    if msg.startswith("object missing required field"):
        return msg.replace("object missing required field", "without field")
    return msg


def _type_of_body(body: bytes) -> str | None:
    """The `t` of a body msgspec refused (for the message), if it can be read at all."""
    try:
        obj = msgspec.msgpack.decode(body)
    except Exception:  # noqa: BLE001
        return None
    t = obj.get("t") if type(obj) is dict else None
    return t if type(t) is str and t in BY_TAG else None


class Undecodable(FrameError):
    """Bytes that are not a msgpack map at all (not merely a frame that breaks its rules)."""


class Invalid:
    """A body that decodes but breaks its type's rules, as a reader of recordings yields it
    (the Feed rejects it with `why` and reading goes on): its type and rank when readable."""

    __slots__ = ("why", "type", "rank")

    def __init__(self, why: str, type_: str | None = None, rank: int | None = None):
        self.why, self.type, self.rank = why, type_, rank

    def __repr__(self) -> str:
        return f"Invalid({self.why!r})"


_NOT_A_MAP = object()


def _peek(body: bytes):
    """The type and rank of a body msgspec refused (for the message): (t, r), _NOT_A_MAP for
    a msgpack value that is not a map; raises Undecodable for bytes that are not msgpack."""
    try:
        obj = msgspec.msgpack.decode(body)
    except Exception as e:  # noqa: BLE001 - malformed, nested too deep, a length beyond the bytes
        raise Undecodable(f"undecodable frame ({e})") from None
    if type(obj) is not dict:
        return _NOT_A_MAP
    t, r = obj.get("t"), obj.get("r")
    return (t if type(t) is str else None), (r if type(r) is int and 0 <= r <= MAX_RANK else None)


def _refusal(e: msgspec.ValidationError, t: str | None) -> FrameError:
    if t is None:
        return FrameError(f"frame without a type ({_reason(e)})")
    if t not in BY_TAG:
        return FrameError(f"unknown frame type {t[:20]!r}")
    return FrameError(f"invalid {t} frame: {_reason(e)}")


def decode(body: bytes) -> Frame:
    """Decode and validate one frame body (types, ranges, lengths) in one call: its Struct.
    Raises FrameError with a short reason (Undecodable: not msgpack at all). Cross-field
    rules: ``check``."""
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as e:
        peek = _peek(body)
        if peek is _NOT_A_MAP:
            raise FrameError("frame is not a map") from None
        raise _refusal(e, peek[0]) from None
    except msgspec.DecodeError as e:
        raise Undecodable(f"undecodable frame ({e})") from None


def decode_or_invalid(body: bytes) -> Frame | Invalid:
    """decode(), but a frame that breaks its rules comes back as Invalid (readers of
    recordings go on past it); Undecodable still raises."""
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as e:
        peek = _peek(body)
        if peek is _NOT_A_MAP:
            return Invalid("frame is not a map")
        return Invalid(str(_refusal(e, peek[0])), *peek)
    except msgspec.DecodeError as e:
        raise Undecodable(f"undecodable frame ({e})") from None


def validate(obj) -> Frame:
    """A frame made in this process (a Struct, or a map from a test or a tool) checked as
    if it had come over the wire: encoded, then decoded. Raises FrameError."""
    if not isinstance(obj, (Frame, dict)):
        raise FrameError("frame is not a map")
    try:
        body = _encoder.encode(obj)
    except Exception as e:  # noqa: BLE001 - e.g. an integer beyond 64 bits
        raise FrameError(f"unencodable frame ({type(e).__name__}: {e})"[:200]) from None
    return decode(body)


def encode(frame: Frame) -> bytes:
    """One frame body (msgpack), without its length prefix."""
    return _encoder.encode(frame)


def to_dict(frame: Frame) -> dict:
    """The frame as its wire map (for JSON and for people)."""
    return msgspec.to_builtins(frame)


# -- the cross-field rules, against the run ----------------------------------------------------
class Limits:
    """What a frame is checked against beyond its own fields: the run's world size,
    strategies, layer and parameter counts (None: not known yet)."""

    __slots__ = ("world", "strategies", "n_layers", "n_params", "max_idx", "max_rank", "span_strategies")

    def __init__(self, world=None, strategies=None, n_layers=None, n_params=None):
        self.world, self.strategies = world, strategies
        self.n_layers, self.n_params = n_layers, n_params
        # largest span idx: a layer, a parameter or a bucket (never more buckets than params)
        self.max_idx = max(64, n_layers or 0, n_params or 0) if (n_layers or n_params) else 0xFFFF
        # for the spans fast path: one range check, one set lookup
        self.max_rank = world - 1 if world else MAX_RANK
        known = frozenset(spec.WIRE_STRATEGIES)
        self.span_strategies = known & strategies if strategies is not None else known

    @classmethod
    def of_meta(cls, meta: dict) -> "Limits":
        """From run metadata (a recording header, or the CLI's), trusted as already checked."""
        w = meta.get("world")
        strategies = meta.get("strategies")
        layers, params = meta.get("layers"), meta.get("params")
        return cls(w if type(w) is int and w > 0 else None,
                   frozenset(strategies) if isinstance(strategies, (list, tuple)) and strategies else None,
                   len(layers) if isinstance(layers, (list, tuple)) and layers else None,
                   len(params) if isinstance(params, (list, tuple)) and params else None)


NO_LIMITS = Limits()


def _rank_in_world(r, lim: Limits) -> None:
    if lim.world is not None and r is not None and r >= lim.world:
        raise FrameError(f"rank {r} is outside this run (world {lim.world})")


def _hello(f: Hello, lim: Limits) -> None:
    if f.rank >= f.world:
        raise FrameError(f"rank {f.rank} is outside its own world of {f.world}")
    if lim.world is not None and f.world != lim.world:
        raise FrameError(f"world {f.world} differs from this run's ({lim.world})")
    if f.params and f.layers is not UNSET and any(p[2] >= len(f.layers) for p in f.params):
        raise FrameError("a parameter names a layer that does not exist")


def _buckets(f: Buckets, lim: Limits) -> None:
    ids, seen = set(), set()
    n_params = lim.n_params
    for b, params, _ in f.buckets:
        if b in ids:
            raise FrameError(f"bucket {b} is listed twice")
        ids.add(b)
        for p in params:
            if p in seen or (n_params is not None and p >= n_params):
                raise FrameError(f"bucket {b} names parameter {p} twice or out of range")
            seen.add(p)


def _straggler(value: float, rank, layer, lim: Limits) -> None:
    if not 0 <= value <= 60_000:
        raise FrameError(f"value = {value} is out of range")
    if rank is UNSET or layer is UNSET:
        raise FrameError("a straggler needs its rank and layer")
    _rank_in_world(rank, lim)
    if lim.n_layers is not None and layer >= lim.n_layers:
        raise FrameError(f"layer {layer} does not exist")


def _cap(value: float) -> None:
    if not 0 < value <= 4096:
        raise FrameError(f"value = {value} is out of range")


def _event(f: Event, lim: Limits) -> None:
    if f.what == "bucket_cap_mb":
        _cap(f.value)
    elif f.what == "slow_ms":
        _straggler(f.value, f.slow_rank, f.layer, lim)
    elif f.what == "control_interval" and not 1 <= f.value <= 64:
        raise FrameError(f"value = {f.value} is out of range")
    elif f.what == "comm_timing" and f.value not in spec.COMM_TIMING_NAMES:
        raise FrameError(f"value = {f.value} is not a way of timing buckets")
    elif f.what == "fr_untimed" and not 0 <= f.value <= 2**31:
        raise FrameError(f"value = {f.value} is out of range")
    elif f.what == "captured_marks" and not 0 <= f.value <= 2**62:
        raise FrameError(f"value = {f.value} is out of range")
    elif f.what.startswith(("traced ", "traced_b ")):  # (collectives in a compiled graph)
        if f.what.partition(" ")[2] not in spec.COLL_OPS:
            raise FrameError(f"{f.what!r} names no collective")
        if not 0 <= f.value <= 2**62:
            raise FrameError(f"value = {f.value} is out of range")


def _set(f: Set, lim: Limits) -> None:
    if f.key == "bucket_cap_mb":
        _cap(f.value)
    else:
        _straggler(f.value, f.slow_rank, f.layer, lim)


def _colls(f: Colls, lim: Limits) -> None:
    ids = set()
    n_layers = lim.n_layers
    for row in f.rows:
        if row[0] in ids:
            raise FrameError(f"collective {row[0]} is listed twice")
        ids.add(row[0])
        if n_layers is not None and row[5] >= n_layers:
            raise FrameError(f"collective {row[0]} names layer {row[5]}, which does not exist")


_CROSS = {Hello: _hello, Buckets: _buckets, Colls: _colls, Event: _event, Set: _set}
_RANKED = frozenset(c for c in ALL_TYPES if "rank" in c.__struct_fields__)


def check(f: Frame, lim: Limits = NO_LIMITS):
    """The cross-field rules of a decoded frame, against the run: returns a wire.SpanBatch for
    spans (the columns checked and split), else the frame itself. Raises FrameError."""
    cls = type(f)
    if cls is Spans:
        return check_spans(f, lim)
    if cls in _RANKED:
        r = f.rank  # type: ignore[attr-defined]
        if r is not UNSET:
            _rank_in_world(r, lim)
    cross = _CROSS.get(cls)
    if cross is not None:
        cross(f, lim)
    return f


def check_spans(f: Spans, lim: Limits = NO_LIMITS) -> wire.SpanBatch:
    """The spans fast path: wire.decode_spans checks and splits the columns; the rules
    against the run (rank inside it, a strategy of it, single on rank 0 only) are one
    comparison chain here (the fields' own ranges were checked when it was decoded)."""
    b = wire.decode_spans(f, lim.max_idx)
    r, s = f.rank, f.strategy
    if r > lim.max_rank or s not in lim.span_strategies or (r and s == "single"):
        _spans_error(b, lim)
    return b


def _spans_error(b: wire.SpanBatch, lim: Limits) -> None:
    """Say what is wrong with a spans frame check_spans refused."""
    _rank_in_world(b.rank, lim)
    if b.rank >= spec.strategy_ranks(b.strategy, MAX_RANK + 1):
        raise FrameError("only rank 0 runs the single strategy")
    raise FrameError(f"strategy {b.strategy[:20]!r} is not one of this run's")
