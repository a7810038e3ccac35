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

A write that fails (the disk full, the file removed) stops the recording alone: the file is cut
back to its last sync flush and its zlib stream ended there (an empty final block and the
checksum of what it holds, a few bytes where the cut just freed more), so it reads back
whole, without damage, up to there; nothing more is written, and the writer says so once
(`RecordingStopped`, or its `on_error`), with where it stopped and why.
"""
from __future__ import annotations

import os
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


class RecordingStopped(OSError):
    """Writing a recording failed: the file ends where it was last flushed (and reads back
    whole up to there); nothing more is written. The message says where and why."""


CHECK_LINK_S = 1.0  # how often a writer checks that its file is still there (not removed)
SYNCS_KEPT = 8  # sync points a failed writer may go back to (the latest with room for the end)


class RecordWriter:
    """Writes a recording. A write error (OSError) finalises the file at its last sync flush
    and closes the writer: then `error` says where it stopped and why, and that is raised once
    as RecordingStopped, or handed to `on_error(message)` when given (nothing raised)."""

    def __init__(self, path: str, meta: dict, on_error=None):
        self.path = path
        self.lock = threading.Lock()
        self.on_error = on_error
        self.error: str | None = None  # where and why writing stopped (a failed write)
        self.f = open(path, "wb", buffering=0)  # raw: a failed write leaves nothing buffered behind
        self.z = zlib.compressobj(6)
        self.frames = 0
        self.spans = 0
        self.size = 0  # bytes written to the file
        self.closed = False
        w = meta.get("world")
        self.world = w if isinstance(w, int) and w > 0 else 1
        self._ranks_in: dict[tuple, int] = {}  # (strategy, step) -> span frames written
        self._adler = 1  # the zlib checksum of the frames handed to the compressor
        self._done: dict[str, int] = {}  # strategy -> its last complete step written
        self._syncs: list[tuple] = []  # the last sync flushes: (file size, checksum, frames, _done)
        self._link_checked = time.monotonic()
        head = msgpack.packb(meta, use_bin_type=True)
        try:
            self._put(MAGIC + HDR.pack(FORMAT_VERSION, len(head)) + head)
            self._flush()  # (the stream's header at a sync point: a cut there still ends cleanly)
        except OSError as e:
            self._fail(e)

    def _completes_step(self, frame) -> bool:
        """True when this spans frame is the last rank's of its (strategy, step)."""
        key = (frame.strategy, frame.step)
        n = self._ranks_in.get(key, 0) + 1
        if n >= spec.strategy_ranks(key[0], self.world):
            self._ranks_in.pop(key, None)
            self._done[key[0]] = max(key[1], self._done.get(key[0], -1))
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
            try:
                data = wire.LEN.pack(len(body)) + body
                self._adler = zlib.adler32(data, self._adler)
                out = self.z.compress(data)
                if out:
                    self._put(out)
                self.frames += 1
                step_done = False
                if type(frame) is Spans:
                    self.spans += len(frame.kind)
                    step_done = self._completes_step(frame)
                if step_done or time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
                    self._flush()
            except OSError as e:
                self._fail(e)

    def write(self, frame) -> None:
        """One frame (a ranks.frames Struct; a plain map from a test is written as it is)."""
        self.write_body(wire.pack(frame)[4:], frame)

    def flush(self) -> None:
        with self.lock:
            if not self.closed:
                try:
                    self._flush()
                except OSError as e:
                    self._fail(e)

    def _put(self, data: bytes) -> None:
        """All of `data` to the file (a raw write may take part of it: the rest follows)."""
        view = memoryview(data)
        while view:
            n = self.f.write(view)
            self.size += n
            view = view[n:]

    def _flush(self) -> None:
        self._put(self.z.flush(zlib.Z_SYNC_FLUSH))
        self.last_flush = now = time.monotonic()
        if not self._syncs or self._syncs[-1][0] != self.size:
            self._syncs.append((self.size, self._adler, self.frames, dict(self._done)))
            del self._syncs[:-SYNCS_KEPT]
        if now - self._link_checked >= CHECK_LINK_S:  # removed: writing on fills the disk unseen
            self._link_checked = now
            if os.fstat(self.f.fileno()).st_nlink == 0:
                raise OSError(0, "the file was removed")

    def _fail(self, e: OSError) -> None:
        """A write failed: end the file's stream at its last sync flush (or, where the disk
        has no room for the end's 6 bytes there, at one before), close, say so once."""
        self.closed = True
        size, frames, done = self.size, 0, {}
        for size, adler, frames, done in reversed(self._syncs):
            try:  # the cut frees the bytes after the sync point: room for the stream's end
                os.ftruncate(self.f.fileno(), size)
                os.lseek(self.f.fileno(), size, os.SEEK_SET)
                self.size = size
                self._put(b"\x03\x00" + struct.pack(">I", adler & 0xFFFFFFFF))  # = Z_FINISH after a sync flush
                break
            except OSError:
                continue
        else:  # (not finalised: readers still read it up to the last sync point, and say so)
            if self._syncs:
                size, _adler, frames, done = self._syncs[-1]
                try:
                    os.ftruncate(self.f.fileno(), size)
                except OSError:
                    pass
        try:
            self.f.close()
        except OSError:
            pass
        why = e.strerror or str(e) or type(e).__name__
        steps = ", ".join(f"{s} step {k}" for s, k in done.items())
        kept = f"{steps} ({frames} frames, " if steps else f"its first {frames} frames ("
        self.error = (f"recording {self.path} stopped: {why}; it is kept up to {kept}"
                      f"{size / 1024:.0f} KB) and reads back up to there")
        if self.on_error is not None:
            self.on_error(self.error)
            return
        raise RecordingStopped(self.error) from e

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                self._put(self.z.flush(zlib.Z_FINISH))
                self.f.close()
                self.closed = True
            except OSError as e:
                self._fail(e)


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
