"""The one declared schema of every frame (see ranks.wire for the encoding).

Each frame type maps its fields to a type; a field whose name ends in ``?`` is optional.
``check(frame, limits)`` validates a decoded frame against it (types, ranges, lengths, then
the cross-field rules of its type) and raises FrameError with a short reason; nothing about
the frame is trusted before it returns. Keys the schema does not name pass untouched, so
a newer peer may add optional fields: adding one here is one line, e.g. ``"res?": I64``.

Span frames keep their columnar fast path: their header fields are checked here and their
columns by ``wire.decode_spans`` (no Python loop per span); ``check`` returns the
decoded ``SpanBatch`` for them, the frame itself for every other type.
"""
from __future__ import annotations

import math

from . import spec, wire
from .wire import FrameError


MAX_RANK = 4095


# -- field types -------------------------------------------------------------------------
class Int:
    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def check(self, v, where: str) -> None:
        if type(v) is not int:  # bool is not a number here
            raise FrameError(f"{where} is not an integer")
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise FrameError(f"{where} = {v} is out of range")


class Num:
    """A finite int or float in [lo, hi] (gt: lo itself excluded)."""

    def __init__(self, lo: float | None = None, hi: float | None = None, gt: bool = False):
        self.lo, self.hi, self.gt = lo, hi, gt

    def check(self, v, where: str) -> None:
        if type(v) is not float and type(v) is not int:
            raise FrameError(f"{where} is not a number")
        if not math.isfinite(v):
            raise FrameError(f"{where} is not finite")
        if self.lo is not None and (v <= self.lo if self.gt else v < self.lo):
            raise FrameError(f"{where} = {v} is out of range")
        if self.hi is not None and v > self.hi:
            raise FrameError(f"{where} = {v} is out of range")


class Str:
    def __init__(self, max_len: int = 256, choices=None):
        self.max_len, self.choices = max_len, choices

    def check(self, v, where: str) -> None:
        if type(v) is not str:
            raise FrameError(f"{where} is not a string")
        if len(v) > self.max_len:
            raise FrameError(f"{where} is longer than {self.max_len} characters")
        if self.choices is not None and v not in self.choices:
            raise FrameError(f"{where} = {v[:40]!r} is not one of {', '.join(self.choices)}")


class Bool:
    def check(self, v, where: str) -> None:
        if type(v) is not bool:
            raise FrameError(f"{where} is not true/false")


class Null:
    """The type, or nil."""

    def __init__(self, inner):
        self.inner = inner

    def check(self, v, where: str) -> None:
        if v is not None:
            self.inner.check(v, where)


class List:
    def __init__(self, item, max_len: int = 4096, min_len: int = 0):
        self.item, self.max_len, self.min_len = item, max_len, min_len

    def check(self, v, where: str) -> None:
        if type(v) is not list:
            raise FrameError(f"{where} is not a list")
        if not self.min_len <= len(v) <= self.max_len:
            raise FrameError(f"{where} has {len(v)} items (allowed {self.min_len}..{self.max_len})")
        for i, x in enumerate(v):
            self.item.check(x, f"{where}[{i}]")


class Tuple:
    """A list of fixed length, one type per position."""

    def __init__(self, *items):
        self.items = items

    def check(self, v, where: str) -> None:
        if type(v) is not list or len(v) != len(self.items):
            raise FrameError(f"{where} is not a list of {len(self.items)} items")
        for i, (t, x) in enumerate(zip(self.items, v)):
            t.check(x, f"{where}[{i}]")


class Map:
    """A map of declared fields (``name?`` optional); other keys pass."""

    def __init__(self, fields: dict):
        self.fields = [(k.rstrip("?"), k.endswith("?"), t) for k, t in fields.items()]

    def check(self, v, where: str) -> None:
        if type(v) is not dict:
            raise FrameError(f"{where} is not a map")
        for name, optional, t in self.fields:
            if name not in v:
                if optional:
                    continue
                raise FrameError(f"{where or 'frame'} without {name!r}")
            t.check(v[name], f"{where}.{name}" if where else name)


class MapOf:
    """A map with any keys of one type to values of one type."""

    def __init__(self, key, value, max_len: int = 4096):
        self.key, self.value, self.max_len = key, value, max_len

    def check(self, v, where: str) -> None:
        if type(v) is not dict:
            raise FrameError(f"{where} is not a map")
        if len(v) > self.max_len:
            raise FrameError(f"{where} has more than {self.max_len} entries")
        for k, x in v.items():
            self.key.check(k, f"{where} key")
            self.value.check(x, f"{where}[{k!r}]")


# -- shared field types ------------------------------------------------------------------
RANK = Int(0, MAX_RANK)
STEP = Int(0, 2**31 - 1)
I64 = Int(-2**63, 2**63 - 1)
COUNT = Int(0, 2**63 - 1)
NS = Int(0, 2**63 - 1)  # a CLOCK_MONOTONIC reading in ns
WALL = Num(0)  # seconds since the epoch
TEXT = Str(4000)
NAME = Str(256)
STRATEGY = Str(16, spec.STRATEGIES)
CAP_MB = Num(0, 4096, gt=True)
LEVEL = Str(8, ("info", "warn", "error"))
OPT_NUM = Null(Num())
NODE = Int(0, MAX_RANK)  # a host's node rank (multi-node)

# -- the schema: frame type -> fields (``t`` itself is checked by check()) ----------------
SCHEMA: dict[str, Map] = {name: Map(fields) for name, fields in {
    # from ranks
    "auth": {"token": Str(256), "r": RANK, "v": Int(0, 2**16), "pid?": COUNT},
    "hello": {
        "r": RANK, "world": Int(1, MAX_RANK + 1), "local_rank?": RANK, "pid?": Null(COUNT),
        "host?": NAME, "device?": NAME, "backend?": Str(16), "note?": TEXT, "torch?": NAME,
        "model?": Str(32), "layers?": List(NAME, 0xFFFF),
        "params?": List(Tuple(NAME, COUNT, Int(0, 0xFFFF)), 0xFFFF),
        "strategies?": List(STRATEGY, len(spec.STRATEGIES)), "batch?": Int(1, 2**31),
        "steps?": COUNT, "bucket_cap_mb?": Null(CAP_MB), "seed?": I64, "lr?": Num(),
        "threads?": Int(1, 1 << 16), "uuid?": Str(64),
    },
    "phase": {"r": RANK, "ph": Str(32)},
    "spans": {"r": RANK, "s": STRATEGY, "k": STEP, "b": NS},  # + columns: wire.decode_spans
    "buckets": {
        "r": RANK, "s": STRATEGY, "k": STEP, "cap_mb?": Null(CAP_MB),
        "ddp_reported?": Null(List(COUNT, 0xFFFF)),
        "buckets": List(Tuple(Int(0, 0xFFFF), List(Int(0, 0xFFFF), 0xFFFF), COUNT), 0xFFFF, 1),
    },
    "event": {"r": RANK, "k": STEP, "what": Str(32), "value": Num(),
              "rank?": RANK, "layer?": Int(0, 0xFFFF)},
    "hb": {"r": RANK, "k": Int(-1, 2**31 - 1), "ph?": Str(32), "drop?": COUNT, "dropf?": COUNT,
           "ts?": NS, "res?": I64},  # res: CUDA clock residual, ns
    "bye": {"r": RANK, "why?": Str(64), "drop?": COUNT, "dropf?": COUNT},
    "error": {"r": RANK, "msg": TEXT, "tb?": Str(8000)},
    # from the app (recorded with the ranks' frames)
    "status": {"text": TEXT, "level?": LEVEL, "ts?": WALL},
    "exit": {"r": RANK, "status": Str(200)},
    "gpu": {"ts": NS, "gpus": List(Map({
        "index": Int(0, 1024), "name?": NAME, "util?": OPT_NUM, "mem_used_mb?": OPT_NUM,
        "mem_total_mb?": OPT_NUM, "power_w?": OPT_NUM, "sm_clock_mhz?": OPT_NUM,
        "pcie_tx_mbs?": OPT_NUM, "pcie_rx_mbs?": OPT_NUM, "nvlink_tx_mbs?": OPT_NUM,
        "nvlink_rx_mbs?": OPT_NUM, "uuid?": Null(Str(96)), "sm_active?": OPT_NUM}), 1024)},
    "cpu": {"ts": NS, "ranks": MapOf(Str(8), OPT_NUM, MAX_RANK + 1)},
    "reject": {"r?": Null(RANK), "ft?": Null(Str(32)), "why": TEXT, "ts?": WALL},
    "drop": {"r": RANK, "why": Str(200), "bye?": Bool()},
    # multi-node (ddptui/live/netlisten.py): a rank's host, and a host's clock estimate
    "node": {"r": RANK, "node": NODE, "host?": NAME},
    "clock": {"node": NODE, "host": NAME, "off": I64, "unc": COUNT, "drift?": Num(-1, 1), "ref?": I64,
              "n?": COUNT, "ntp_off?": I64, "ntp_unc?": COUNT, "coll?": COUNT,
              "steps?": COUNT},
    # from the app to ranks
    "stop": {"why?": Str(200)},
    "set": {"key": Str(32, ("bucket_cap_mb", "slow_ms")), "value": Num(0, 60_000),
            "seq": Int(1, 2**31 - 1), "rank?": RANK, "layer?": Int(0, 0xFFFF)},
}.items()}

RANK_FRAMES = frozenset(("hello", "phase", "spans", "buckets", "event", "hb", "bye", "error"))
APP_FRAMES = frozenset(("status", "exit", "gpu", "cpu", "reject", "drop", "node", "clock"))
CONTROL_FRAMES = frozenset(("stop", "set"))
RECORDED_FRAMES = RANK_FRAMES | APP_FRAMES


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
        known = frozenset(spec.STRATEGIES)
        self.span_strategies = known & strategies if strategies is not None else known

    @classmethod
    def of_meta(cls, meta: dict) -> "Limits":
        """From run metadata (a recording header, or the CLI's), trusted as already checked."""
        w = meta.get("world")
        strategies = meta.get("strategies")
        layers, params = meta.get("layers"), meta.get("params")
        return cls(w if type(w) is int and w > 0 else None,
                   frozenset(strategies) if isinstance(strategies, list) and strategies else None,
                   len(layers) if isinstance(layers, list) and layers else None,
                   len(params) if isinstance(params, list) and params else None)


NO_LIMITS = Limits()


def _rank_in_world(r, lim: Limits) -> None:
    if lim.world is not None and r is not None and r >= lim.world:
        raise FrameError(f"rank {r} is outside this run (world {lim.world})")


def _hello(f: dict, lim: Limits) -> None:
    if f["r"] >= f["world"]:
        raise FrameError(f"rank {f['r']} is outside its own world of {f['world']}")
    if lim.world is not None and f["world"] != lim.world:
        raise FrameError(f"world {f['world']} differs from this run's ({lim.world})")
    layers, params = f.get("layers"), f.get("params")
    if params and layers is not None and any(p[2] >= len(layers) for p in params):
        raise FrameError("a parameter names a layer that does not exist")


def _buckets(f: dict, lim: Limits) -> None:
    ids, seen = set(), set()
    n_params = lim.n_params
    for b, params, _ in f["buckets"]:
        if b in ids:
            raise FrameError(f"bucket {b} is listed twice")
        ids.add(b)
        for p in params:
            if p in seen or (n_params is not None and p >= n_params):
                raise FrameError(f"bucket {b} names parameter {p} twice or out of range")
            seen.add(p)


SLOW_MS = Num(0, 60_000)


def _straggler(f: dict, lim: Limits) -> None:
    SLOW_MS.check(f["value"], "value")
    if "rank" not in f or "layer" not in f:
        raise FrameError("a straggler needs its rank and layer")
    _rank_in_world(f["rank"], lim)
    if lim.n_layers is not None and f["layer"] >= lim.n_layers:
        raise FrameError(f"layer {f['layer']} does not exist")


def _event(f: dict, lim: Limits) -> None:
    if f["what"] == "bucket_cap_mb":
        CAP_MB.check(f["value"], "value")
    elif f["what"] == "slow_ms":
        _straggler(f, lim)


def _set(f: dict, lim: Limits) -> None:
    if f["key"] == "bucket_cap_mb":
        CAP_MB.check(f["value"], "value")
    else:
        _straggler(f, lim)


CROSS = {"hello": _hello, "buckets": _buckets, "event": _event, "set": _set}
_RANKED = frozenset(t for t, m in SCHEMA.items() if any(n == "r" for n, _, _ in m.fields))


def check(frame, lim: Limits = NO_LIMITS):
    """Validate one decoded frame; returns a SpanBatch for spans, else the frame itself."""
    if type(frame) is not dict:
        raise FrameError("frame is not a map")
    t = frame.get("t")
    if t == "spans":
        return check_spans(frame, lim)
    m = SCHEMA.get(t) if type(t) is str else None
    if m is None:
        raise FrameError(f"unknown frame type {str(t)[:20]!r}")
    m.check(frame, "")
    if t in _RANKED:
        _rank_in_world(frame.get("r"), lim)
    cross = CROSS.get(t)
    if cross is not None:
        cross(frame, lim)
    return frame


MAX_STEP, MAX_NS = 2**31 - 1, 2**63 - 1


def check_spans(f: dict, lim: Limits = NO_LIMITS) -> wire.SpanBatch:
    """The spans fast path: wire.decode_spans checks the columns and the header's types;
    the ranges of SCHEMA["spans"] and the cross-field rules (rank inside the run, a
    strategy of the run, single on rank 0 only) are one comparison chain here."""
    b = wire.decode_spans(f, lim.max_idx)
    r, s = b.rank, b.strategy
    if not (0 <= r <= lim.max_rank and 0 <= b.step <= MAX_STEP and 0 <= b.base_ns <= MAX_NS) \
            or s not in lim.span_strategies or (r and s == "single"):
        _spans_error(f, b, lim)
    return b


def _spans_error(f: dict, b: wire.SpanBatch, lim: Limits) -> None:
    """Say what is wrong with a spans frame check_spans refused."""
    SCHEMA["spans"].check(f, "")  # names a field out of its range
    _rank_in_world(b.rank, lim)
    if b.rank >= spec.strategy_ranks(b.strategy, MAX_RANK + 1):
        raise FrameError("only rank 0 runs the single strategy")
    raise FrameError(f"strategy {b.strategy[:20]!r} is not one of this run's")
