"""The recording file format, shared by the app (which writes a live run's recording and reads
recordings back) and the ranks (`ddptui.instrument` without the app writes one file per rank):

    magic  8 bytes  b"\\x89DDPTUI\\n"
    u16    format version (big-endian)
    u32    header length, then a msgpack map: run metadata
    ...    zlib stream of length-prefixed msgpack frames (see ranks.wire), sync-flushed
           when a step is complete (the last rank's spans of a strategy step are written)
           and at least every FLUSH_EVERY_S when frames come, so a file cut at any byte
           (a run killed at any instant) replays to its last complete step

`RecordWriter` writes it; `read_header` reads and checks the header (readers: ddptui.recording).
"""
from __future__ import annotations

import struct
import threading
import time
import zlib

import msgpack

from . import spec, wire
from .frames import Spans

MAGIC = b"\x89DDPTUI\n"
FORMAT_VERSION = 1
MAX_HEADER = 4 * 1024 * 1024
# the header is a plain msgpack map (the run's description), read with these bounds
HEADER_LIMITS = dict(max_str_len=1 << 20, max_bin_len=MAX_HEADER, max_array_len=1 << 20,
                     max_map_len=1 << 12, max_ext_len=0)
HDR = struct.Struct(">HI")
FLUSH_EVERY_S = 0.25


class RecordingError(Exception):
    """A recording that cannot be read (the message names the problem)."""


class RecordWriter:
    def __init__(self, path: str, meta: dict):
        self.path = path
        self.lock = threading.Lock()
        self.f = open(path, "wb")
        head = msgpack.packb(meta, use_bin_type=True)
        self.f.write(MAGIC + HDR.pack(FORMAT_VERSION, len(head)) + head)
        self.f.flush()
        self.z = zlib.compressobj(6)
        self.frames = 0
        self.spans = 0
        self.last_flush = time.monotonic()
        self.closed = False
        w = meta.get("world")
        self.world = w if isinstance(w, int) and w > 0 else 1
        self._ranks_in: dict[tuple, int] = {}  # (strategy, step) -> span frames written

    def _completes_step(self, frame) -> bool:
        """True when this spans frame is the last rank's of its (strategy, step)."""
        key = (frame.strategy, frame.step)
        n = self._ranks_in.get(key, 0) + 1
        if n >= spec.strategy_ranks(key[0], self.world):
            self._ranks_in.pop(key, None)
            return True
        self._ranks_in[key] = n
        if len(self._ranks_in) > 4096:  # steps that never complete (dropped frames)
            self._ranks_in.pop(next(iter(self._ranks_in)))
        return False

    def write_body(self, body: bytes, frame=None) -> None:
        """One frame body (and the frame it is, when known: a ranks.frames Struct)."""
        with self.lock:
            if self.closed:
                return
            data = wire.LEN.pack(len(body)) + body
            self.f.write(self.z.compress(data))
            self.frames += 1
            step_done = False
            if type(frame) is Spans:
                self.spans += len(frame.kind)
                step_done = self._completes_step(frame)
            if step_done or time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
                self._flush()

    def write(self, frame) -> None:
        """One frame (a ranks.frames Struct; a plain map from a test is written as it is)."""
        self.write_body(wire.pack(frame)[4:], frame)

    def flush(self) -> None:
        with self.lock:
            if not self.closed:
                self._flush()

    def _flush(self) -> None:
        self.f.write(self.z.flush(zlib.Z_SYNC_FLUSH))
        self.f.flush()
        self.last_flush = time.monotonic()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.f.write(self.z.flush(zlib.Z_FINISH))
            self.f.close()
            self.closed = True


def read_header(f, name: str) -> dict:
    head = f.read(len(MAGIC) + HDR.size)
    if len(head) == 0:
        raise RecordingError(f"{name}: empty file, not a ddptui recording")
    if not head.startswith(MAGIC[: len(head)]) or len(head) < len(MAGIC):
        raise RecordingError(f"{name}: not a ddptui recording (wrong magic bytes)")
    if len(head) < len(MAGIC) + HDR.size:
        raise RecordingError(f"{name}: truncated inside the header")
    version, n = HDR.unpack_from(head, len(MAGIC))
    if version > FORMAT_VERSION:
        raise RecordingError(f"{name}: format version {version} is newer than this ddptui "
                             f"reads ({FORMAT_VERSION}); upgrade ddptui")
    if version < 1:
        raise RecordingError(f"{name}: invalid format version {version}")
    if n > MAX_HEADER:
        raise RecordingError(f"{name}: header claims {n} bytes (limit {MAX_HEADER}); file is corrupt")
    body = f.read(n)
    if len(body) < n:
        raise RecordingError(f"{name}: truncated inside the header")
    try:
        meta = msgpack.unpackb(body, raw=False, **HEADER_LIMITS)
    except Exception as e:  # noqa: BLE001
        raise RecordingError(f"{name}: corrupt header ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise RecordingError(f"{name}: corrupt header (not a map)")
    bad = check_meta(meta)
    if bad:
        raise RecordingError(f"{name}: corrupt header ({bad})")
    return meta


def _is_int(v, lo=0, hi=None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)


def check_meta(meta: dict) -> str | None:
    """The header fields readers rely on, checked for type and range; returns what is
    wrong (one short phrase) or None. Fields may be absent; present ones must be sane."""
    def strs(v):
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    checks = (
        ("model", lambda v: isinstance(v, str)),
        ("world", lambda v: _is_int(v, 1, 4096)),
        ("batch", lambda v: _is_int(v, 0)),
        ("steps", lambda v: _is_int(v, 0)),
        ("strategies", strs),
        ("layers", strs),
        ("params", lambda v: isinstance(v, list) and len(v) <= 0xFFFF and all(
            isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and _is_int(p[1])
            and _is_int(p[2]) for p in v)),
        ("bucket_cap_mb", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
        ("devices", lambda v: isinstance(v, dict)),
        ("settings", lambda v: isinstance(v, dict)),
    )
    for key, ok in checks:
        v = meta.get(key)
        if v is not None and not ok(v):
            return f"field {key!r} has a wrong type or value"
    return None
