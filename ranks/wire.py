"""The wire format shared by ranks, collector and recordings: framing and span columns.

A frame is a 4-byte big-endian length followed by a msgpack map with a type key ``t``; what
each type holds, and how a body is decoded and validated, is ranks.frames. Span frames are
columnar: one frame per (rank, strategy, step) with packed little-endian arrays, so that the
collector decodes them without a Python loop per span.

    {"t": "spans", "r": rank, "s": strategy, "k": step, "b": base_ns,
     "kind": u8[n], "idx": u16[n], "t0": u32[n], "t1": u32[n], "iss": u32[n_comm],
     "w": u32[3 * n_wait]}

n_comm: the COMM and COLL spans (collectives), each with its issue time in iss, in order.
w (absent when empty): the stretches in which the rank's compute stood waiting for a
collective's result (start, end, the collective's idx: `WAIT`): not compute in any figure.

t0/t1/iss are microseconds after base_ns (host CLOCK_MONOTONIC, shared by ranks on one host).
"""
from __future__ import annotations

import struct
import sys
from array import array

import msgspec

LEN = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024  # a frame claiming more than this is rejected unread
PROTOCOL_VERSION = 3  # 2: PASS spans (layers marked on a sample of steps) and COLL collectives; 3: MB and PIPE

# span kinds. OTHER: a rank's own work that synchronises nothing (an evaluation forward under
# no_grad, a forward no backward followed): drawn on its lane, in no figure of a step; idx 0.
# COMM: a gradient AllReduce (a DDP bucket, naive's per-parameter call; idx: the bucket or
# parameter). COLL: any other collective the rank issued (an all_reduce of its own, FSDP's
# all-gathers and reduce-scatters, all_to_all, broadcast, barrier...); idx: the row of the
# rank's collectives table (a `colls` frame: ranks.collectives) that says what it was.
# Both carry an issue time (the iss column) and are communication in every figure.
# PASS: a whole forward (idx 0) or backward (idx 1) of a step whose layers were not marked one
# by one (layer marks on a sample of steps: ranks.core.sampling.LAYER_SHARE); compute in every
# figure, in no per-layer one.
# MB: a pipeline stage's work on one microbatch (torch.distributed.pipelining: a chunk's
# forward, its full backward, or the input-grad and weight-grad halves of a zero-bubble
# schedule's): idx `mb_idx(stage, microbatch, part)`; it holds that microbatch's layer spans
# (FWD, BWD: the compute), in no figure itself but the pipeline's bubble. PIPE: a schedule's
# step() call on the rank (idx 0): what the bubble is a share of.
FWD, BWD, COMM, OPT, STEP, OTHER, COLL, PASS, MB, PIPE = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
KIND_NAMES = ("forward", "backward", "allreduce", "optimizer", "step", "other", "collective", "pass",
              "microbatch", "schedule")
MB_PARTS = ("F", "B", "I", "W")  # a microbatch span's part: forward, full backward, input-grad, weight-grad
MB_STAGE_MAX, MB_MAX = 63, 255


def mb_idx(stage: int, mb: int, part: int) -> int:
    """A microbatch span's idx: stage (< 64), microbatch (< 256, larger ones wrap) and part."""
    return (min(stage, MB_STAGE_MAX) << 10) | ((mb & MB_MAX) << 2) | part


def mb_of(idx: int) -> tuple[int, int, int]:
    """(stage, microbatch, part) of a microbatch span's idx."""
    return idx >> 10, (idx >> 2) & MB_MAX, idx & 3
PASS_FWD, PASS_BWD = 0, 1  # a PASS span's idx
PASS_NAMES = ("forward", "backward")  # by a PASS span's idx
N_KINDS = len(KIND_NAMES)
# WAIT: a stretch in which the rank's compute stood waiting for a collective's result (a
# functional collective's wait_tensor: from the wait's call to the result; on CUDA the
# training stream's). Never a span kind on the wire: a rank's resolved lists carry it (idx:
# the collective's table row), and ranks.frames.spans_frame moves such entries into the
# frame's `w` column, SpanBatch.waits (the figures take it out of the compute that holds it)
WAIT = 0xFE
COMM_KINDS = (COMM, COLL)
MAX_COLL_ID = 0xFFFF  # a COLL span's idx: any u16 (a table row; checked against the table by the Store)

_LITTLE = sys.byteorder == "little"

class FrameError(ValueError):
    """A frame that does not follow the protocol (ranks.frames); the message says how."""


_encode = msgspec.msgpack.Encoder().encode


def pack(obj) -> bytes:
    """One frame (a ranks.frames Struct, or a plain map: tests, tools) on the wire:
    length prefix + msgpack body."""
    body = _encode(obj)
    return LEN.pack(len(body)) + body


def _le(a: array) -> bytes:
    if not _LITTLE:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _from_le(code: str, data: bytes) -> array:
    a = array(code)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


def span_columns(base_ns: int, kinds, idxs, t0_ns, t1_ns, iss_ns) -> tuple[bytes, ...]:
    """The columns of a spans frame from absolute ns lists (iss_ns: one per COMM span, in
    order): kind, idx, t0, t1, iss (ranks.frames.spans_frame builds the frame)."""
    def us(v):
        return array("I", [max(0, (x - base_ns) // 1000) for x in v])
    return bytes(kinds), _le(array("H", idxs)), _le(us(t0_ns)), _le(us(t1_ns)), _le(us(iss_ns))


def wait_column(base_ns: int, waits) -> bytes:
    """The `w` column of a spans frame from (start ns, end ns, idx) triples (idx: the COLL
    span's table row, or the COMM span's bucket, that the compute waited for)."""
    return _le(array("I", [v for a, z, i in waits for v in (max(0, (a - base_ns) // 1000),
                                                              max(0, (z - base_ns) // 1000), i)]))


_NO_WAITS = array("I")


class SpanBatch(msgspec.Struct, gc=False):
    """Decoded, validated columns of one spans frame (times in µs after base_ns): kind u8,
    idx u16, t0/t1 u32 per span, iss u32 per AllReduce; waits: u32 (start, end, idx)
    triples, the stretches the rank's compute waited for a collective (WAIT; idx: the
    collective's, as its span's; empty for most). (A Struct: made in C, once a frame.)"""

    rank: int
    strategy: str
    step: int
    base_ns: int
    kind: bytes
    idx: array
    t0: array
    t1: array
    iss: array
    waits: array = _NO_WAITS

    def __len__(self) -> int:
        return len(self.kind)


_KNOWN_KINDS = bytes(range(N_KINDS))  # bytes.translate deletes these; anything left is unknown
# (kind, idx, max_idx) -> allreduce spans in it, for column pairs that passed the checks:
# a rank sends the same kind/idx columns for a strategy every step, so most frames hit
_CHECKED: dict = {}
_CHECKED_MAX = 4096


def _check_kind_idx(kind: bytes, idx: bytes, max_idx: int, iss_len: int) -> int:
    """Validate the kind, iss and idx columns (lengths of kind/idx/t0/t1 already agree), in
    the order decode_spans always did; returns the number of COMM spans."""
    n = len(kind)
    if kind.translate(None, _KNOWN_KINDS):  # same as max(kind) >= N_KINDS
        raise FrameError("spans frame has an unknown span kind")
    n_coll = kind.count(COLL)
    n_comm = kind.count(COMM) + n_coll
    if iss_len != 4 * n_comm:
        raise FrameError("spans frame issue column does not match its allreduce spans")
    if n_coll or MB in kind:  # a collective's idx is a table row (any u16), a microbatch's its
        ia = _from_le("H", idx)  # stage, number and part: only the other spans' are checked
        if max((i for k, i in zip(kind, ia) if k != COLL and k != MB), default=0) > max_idx:
            raise FrameError("spans frame names a layer or parameter that does not exist")
    elif n:
        if 0 <= max_idx < 256:  # u16 little-endian: every high byte 0, every low byte <= max_idx
            bad = idx[1::2].count(0) != n or idx[0::2].translate(None, bytes(range(max_idx + 1)))
        else:
            bad = max(_from_le("H", idx)) > max_idx
        if bad:
            raise FrameError("spans frame names a layer or parameter that does not exist")
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[(kind, idx, max_idx)] = n_comm
    return n_comm


def decode_spans(f, max_idx: int = 0xFFFF) -> SpanBatch:
    """Check a spans frame's columns (a ranks.frames.Spans: its fields' types are already
    checked) and split them; raises FrameError with a short reason (the ranges of its header
    fields are checked by ranks.frames.check_spans).

    Columnar: no Python loop per span. The checks run on the raw little-endian bytes
    (bytes.translate / count in C) before the columns become arrays, and a kind/idx column
    pair already found good is not checked again."""
    kind, idx, t0, t1, iss = f.kind, f.idx, f.t0, f.t1, f.iss
    n = len(kind)
    if len(idx) != 2 * n or len(t0) != 4 * n or len(t1) != 4 * n:
        raise FrameError("spans frame columns disagree in length")
    n_comm = _CHECKED.get((kind, idx, max_idx))
    if n_comm is None:
        _check_kind_idx(kind, idx, max_idx, len(iss))
    elif len(iss) != 4 * n_comm:
        raise FrameError("spans frame issue column does not match its allreduce spans")
    w = f.wait
    waits = _NO_WAITS
    if w:
        if len(w) % 12:
            raise FrameError("spans frame wait column is not (start, end, idx) triples")
        waits = _from_le("I", w)
        if any(a > b for a, b in zip(waits[0::3], waits[1::3])):
            raise FrameError("spans frame has a wait that ends before it starts")
    if _LITTLE:
        ia = array("H"); ia.frombytes(idx)
        a0 = array("I"); a0.frombytes(t0)
        a1 = array("I"); a1.frombytes(t1)
        ai = array("I"); ai.frombytes(iss)
        return SpanBatch(f.rank, f.strategy, f.step, f.base_ns, kind, ia, a0, a1, ai, waits)
    return SpanBatch(f.rank, f.strategy, f.step, f.base_ns, kind, _from_le("H", idx), _from_le("I", t0),
                     _from_le("I", t1), _from_le("I", iss), waits)


class FrameReader:
    """Incremental splitter of a byte stream into frame bodies. Never allocates what a
    length prefix claims: a prefix above MAX_FRAME raises ValueError at once."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self.buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        out = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = LEN.unpack_from(buf, pos)
            if n > self.max_frame:
                if out:  # hand over the good frames first; the next feed() raises
                    break
                raise ValueError(f"frame length {n} exceeds the {self.max_frame}-byte limit")
            if len(buf) - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self.buf)
