"""Hypothesis strategies: frames of every type that are valid msgpack maps but wrong.

Each type has a valid example (`valid(t, r)`) and, per field, values that are wrong for
it — written out here from what the frames mean, not read from ranks.frames, so tests
built on them check the protocol rather than repeat it. `bad_frame()` draws a type, then
either one field set to a wrong value, a required field left out, or a frame-level
inconsistency (columns that disagree, a rank outside the run, a bucket listed twice...).
The run they are checked against: model small, 2 ranks, strategies naive and ddp.
"""
from __future__ import annotations

import copy

from hypothesis import strategies as hs

from ddptui.recording import synthetic
import msgspec

from ranks import frames, spec
from ranks.wire import COMM, STEP

MODEL, WORLD, STRATEGIES = "small", 2, ("naive", "ddp")
N_PARAMS = len(spec.param_table(MODEL))
B = 10**9
NAN, INF = float("nan"), float("inf")


def as_map(f) -> dict:
    """A typed frame as the map it travels as (bytes stay bytes), to be broken by a test."""
    return f if type(f) is dict else msgspec.msgpack.decode(frames.encode(f))


def valid(t: str, r: int = 0) -> dict:
    """A frame of type t that follows the protocol, for rank r of the run above, as a map."""
    made = {
        "hello": lambda: synthetic.hello(r, WORLD, MODEL, STRATEGIES, batch=256),
        "phase": lambda: {"t": "phase", "r": r, "ph": "training"},
        "spans": lambda: frames.spans_frame(r, "naive", 3, B, [STEP, COMM], [0, 1], [B, B],
                                            [B + 9000, B + 4000], [B]),
        "buckets": lambda: {"t": "buckets", "r": r, "s": "ddp", "k": 0, "cap_mb": 25.0,
                            "buckets": [[0, [7, 6], 100], [1, [5, 4, 3, 2, 1, 0], 200]]},
        "event": lambda: {"t": "event", "r": r, "k": 3, "what": "bucket_cap_mb", "value": 5.0},
        "hb": lambda: {"t": "hb", "r": r, "k": 3, "ph": "training", "drop": 0, "dropf": 0, "ts": 1},
        "bye": lambda: {"t": "bye", "r": r, "why": "done", "drop": 0, "dropf": 0},
        "error": lambda: {"t": "error", "r": r, "msg": "boom", "tb": "Traceback ..."},
        "status": lambda: {"t": "status", "text": "hello", "level": "info", "ts": 1.0},
        "exit": lambda: {"t": "exit", "r": r, "status": "exited"},
        "output": lambda: {"t": "output", "r": r, "stream": "out", "lines": ["iter 3: loss 2.1"], "dropped": 0,
                           "ts": 1.0},
        "gpu": lambda: synthetic.SyntheticRun(MODEL, WORLD).gpu_frame(1),
        "cpu": lambda: {"t": "cpu", "ts": 1, "ranks": {"0": 50.0, "1": None}},
        "reject": lambda: {"t": "reject", "r": r, "ft": "hb", "why": "invalid hb frame", "ts": 1.0},
        "drop": lambda: {"t": "drop", "r": r, "why": "closed", "bye": False},
        "stop": lambda: {"t": "stop", "why": "user"},
        "set": lambda: {"t": "set", "key": "bucket_cap_mb", "value": 5.0, "seq": 1},
        "dump": lambda: {"t": "dump", "why": "hang"},
    }
    return as_map(made[t]())


# -- wrong values --------------------------------------------------------------------------
RANK = [-1, WORLD, 4096, 2**63, "0", None, 1.5, True, [0]]
STEP_ = [-1, 2**31, "3", None, 2.5, True, NAN]
COUNT = [-1, "1", None, 1.5, True]
TS_NS = [-1, "now", 1.5, None, True]
NUM = [NAN, INF, -INF, "1", None, True, [1.0]]
CAP = [0, 0.0, -1.0, 4097.0, NAN, INF, "5", None]


def strs(max_len: int, nullable_ok: bool = False) -> list:
    out = [5, 1.5, b"bytes", ["a"], {"a": 1}, True, "x" * (max_len + 1)]
    return out if nullable_ok else out + [None]


FIELDS: dict[str, dict[str, list]] = {
    "hello": {"r": RANK, "world": [0, 3, -1, "2", None, 2.0], "local_rank": [-1, "0"],
              "pid": [-1, "1"], "host": strs(256), "device": strs(256), "backend": strs(16),
              "model": strs(32), "layers": ["fc1", [1, 2], None, [None]],
              "params": ["x", [["w", 10]], [["w", -1, 0]], [["w", 10, 99]], [[1, 10, 0]], None],
              "strategies": ["naive", ["warp"], [1], None], "batch": [0, -1, "256", 1.5, None],
              "steps": [-1, "0"], "bucket_cap_mb": [0, -5.0, NAN, INF, "25"], "seed": ["1", 1.5, 2**64 - 1],
              "lr": [NAN, INF, "0.1", None], "threads": [0, "1", None], "uuid": strs(64)},
    "phase": {"r": RANK, "ph": strs(32)},
    "buckets": {"r": RANK, "s": ["warp", 5, None], "k": STEP_, "cap_mb": [0, -1.0, NAN, "1"],
                "ddp_reported": ["x", [-1], [1.5]],
                "buckets": [[], "x", None, [[0]], [[0, [1], 5.0]], [[0, [N_PARAMS], 5]],
                            [[0, [1], 5], [0, [2], 5]], [[0, [1], 5], [1, [1], 5]], [[0, [1], -5]],
                            [[-1, [1], 5]], [[0, "1", 5]]]},
    "event": {"r": RANK, "k": STEP_, "what": strs(32), "value": NUM + [0, -1.0, 1e9]},
    "hb": {"r": RANK, "k": [-2, 2**31, "3", None, 2.5, NAN], "ph": strs(32), "drop": COUNT,
           "dropf": COUNT, "ts": TS_NS, "wb": COUNT},
    "bye": {"r": RANK, "why": strs(64), "drop": COUNT, "dropf": COUNT},
    "error": {"r": RANK, "msg": strs(4000), "tb": strs(8000)},
    "status": {"text": strs(4000), "level": ["panic", 1, None], "ts": [-1.0, NAN, "now", None]},
    "exit": {"r": RANK, "status": strs(200)},
    "output": {"r": RANK, "stream": ["in", 1, None], "lines": ["x", None, [5], [None], ["x" * 2001], ["x"] * 1001],
               "dropped": COUNT, "ts": [NAN, -1.0, "now"]},
    "gpu": {"ts": TS_NS, "gpus": ["x", None, [{"index": -1}], [{"index": 0, "util": NAN}],
                                  [{"index": 0, "name": 5}], [{"index": 0, "mem_used_mb": "1"}],
                                  [{"util": 5.0}], [5]]},
    "cpu": {"ts": TS_NS, "ranks": [[1.0], "x", None, {"0": "x"}, {"0": INF}, {"0": [1]}]},
    "reject": {"r": [-1, "0", 1.5, 4096], "ft": [5, "x" * 33], "why": strs(4000), "ts": [NAN, -1.0]},
    "drop": {"r": RANK, "why": strs(200), "bye": ["yes", 1, None]},
    "stop": {"why": strs(200)},
    "dump": {"why": strs(200)},
    "set": {"key": ["lr", 5, None], "value": CAP + [1e9], "seq": [0, -1, "1", 1.5, None]},
}
OPTIONAL = {"hello": {"local_rank", "pid", "host", "device", "backend", "model", "layers",
                      "params", "strategies", "batch", "steps", "bucket_cap_mb", "seed", "lr",
                      "threads", "uuid", "note", "torch"},
            "hb": {"ph", "drop", "dropf", "ts", "wb"}, "bye": {"why", "drop", "dropf"},
            "error": {"tb"}, "status": {"level", "ts"}, "buckets": {"cap_mb", "ddp_reported"},
            "reject": {"r", "ft", "ts"}, "drop": {"bye"}, "stop": {"why"}, "dump": {"why"}, "output": {"stream", "dropped", "ts"}}


def _spans_columns(f: dict, how: str) -> dict:
    f = dict(f)
    if how == "unknown-kind":
        f["kind"] = bytes([STEP, 9])
    elif how == "t0-short":
        f["t0"] = f["t0"][:-4]
    elif how == "t1-long":
        f["t1"] = f["t1"] + b"\0\0\0\0"
    elif how == "idx-odd":
        f["idx"] = f["idx"][:-1]
    elif how == "iss-missing":
        f["iss"] = b""
    elif how == "iss-extra":
        f["iss"] = f["iss"] * 2
    elif how == "idx-too-big":
        f["idx"] = b"\0\0\xff\xff"
    elif how == "kind-not-binary":
        f["kind"] = [STEP, COMM]
    elif how == "times-as-text":
        f["t0"] = "0000" * 2
    elif how == "single-on-rank-1":
        f["s"], f["r"] = "single", 1
    elif how == "strategy-not-in-run":
        f["s"] = "interleaved"
    return f


SPANS_COLUMNS = ("unknown-kind", "t0-short", "t1-long", "idx-odd", "iss-missing", "iss-extra",
                 "idx-too-big", "kind-not-binary", "times-as-text", "single-on-rank-1",
                 "strategy-not-in-run")
SPANS_FIELDS = {"r": RANK, "s": ["warp", 5, None], "k": STEP_, "b": [-1, "0", 1.5, None, 2**64 - 1]}

TYPES = tuple(FIELDS) + ("spans",)


@hs.composite
def bad_frame(draw, types=TYPES, ranks=(0, 1)) -> dict:
    """One frame of a type in `types`, wrong in one way."""
    t = draw(hs.sampled_from(types))
    f = valid(t, draw(hs.sampled_from(ranks)))
    fields = SPANS_FIELDS if t == "spans" else FIELDS[t]
    required = [k for k in fields if k not in OPTIONAL.get(t, ())]
    ways = ["field"] + (["missing"] if required else []) + (["columns"] if t == "spans" else [])
    way = draw(hs.sampled_from(ways))
    if way == "columns":
        return _spans_columns(f, draw(hs.sampled_from(SPANS_COLUMNS)))
    if way == "missing":
        del f[draw(hs.sampled_from(required))]
        return f
    k = draw(hs.sampled_from(sorted(fields)))
    f[k] = copy.deepcopy(draw(hs.sampled_from(fields[k])))
    return f


def frame_rank(f: dict) -> int:
    """The rank a client sending f authenticates as: f's own when it is a real one."""
    r = f.get("r")
    return r if type(r) is int and 0 <= r < WORLD else 0
