"""Recordings: a versioned header, then the frames the ranks sent, in one zlib stream.

    magic  8 bytes  b"\\x89DDPTUI\\n"
    u16    format version (big-endian)
    u32    header length, then a msgpack map: run metadata
    ...    zlib stream of length-prefixed msgpack frames (see ranks.wire), sync-flushed
           at least once per step, so a file cut at any byte replays to its last flush

Reading never trusts a length: frame lengths are capped at wire.MAX_FRAME, the header at
MAX_HEADER, and decompression is bounded per chunk.
"""
from __future__ import annotations

import os
import struct
import threading
import time
import zlib

import msgpack

from ranks import wire

MAGIC = b"\x89DDPTUI\n"
FORMAT_VERSION = 1
MAX_HEADER = 4 * 1024 * 1024
_HDR = struct.Struct(">HI")
FLUSH_EVERY_S = 0.25


class RecordingError(Exception):
    """A recording that cannot be read (the message names the problem)."""


class RecordWriter:
    def __init__(self, path: str, meta: dict):
        self.path = path
        self.lock = threading.Lock()
        self.f = open(path, "wb")
        head = msgpack.packb(meta, use_bin_type=True)
        self.f.write(MAGIC + _HDR.pack(FORMAT_VERSION, len(head)) + head)
        self.f.flush()
        self.z = zlib.compressobj(6)
        self.frames = 0
        self.spans = 0
        self.raw_bytes = 0
        self.last_flush = time.monotonic()
        self.closed = False

    def write_body(self, body: bytes, frame: dict | None = None) -> None:
        with self.lock:
            if self.closed:
                return
            data = wire.LEN.pack(len(body)) + body
            self.f.write(self.z.compress(data))
            self.frames += 1
            self.raw_bytes += len(data)
            if frame is not None and frame.get("t") == "spans":
                self.spans += len(frame["kind"])
            if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
                self._flush()

    def write(self, frame: dict) -> None:
        self.write_body(msgpack.packb(frame, use_bin_type=True), frame)

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

    @property
    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0


def read_header(f, name: str) -> dict:
    head = f.read(len(MAGIC) + _HDR.size)
    if len(head) == 0:
        raise RecordingError(f"{name}: empty file, not a ddptui recording")
    if not head.startswith(MAGIC[: len(head)]) or len(head) < len(MAGIC):
        raise RecordingError(f"{name}: not a ddptui recording (wrong magic bytes)")
    if len(head) < len(MAGIC) + _HDR.size:
        raise RecordingError(f"{name}: truncated inside the header")
    version, n = _HDR.unpack_from(head, len(MAGIC))
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
        meta = msgpack.unpackb(body, raw=False, **wire.UNPACK_LIMITS)
    except Exception as e:  # noqa: BLE001
        raise RecordingError(f"{name}: corrupt header ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise RecordingError(f"{name}: corrupt header (not a map)")
    return meta


class Reader:
    """Reads a recording: header, then frames until the end or the first damage.

    >>> r = Reader(path); meta = r.meta
    >>> for body, frame in r: ...
    >>> r.damage  # None, or a one-line description of where and why reading stopped
    """

    def __init__(self, path: str, chunk: int = 1 << 20):
        self.path = path
        self.name = os.path.basename(path)
        self.chunk = chunk
        self.damage: str | None = None
        self.frames = 0
        try:
            self.f = open(path, "rb")
        except FileNotFoundError:
            raise RecordingError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise RecordingError(f"{path}: is a directory, not a recording") from None
        except OSError as e:
            raise RecordingError(f"{path}: cannot open ({e.strerror})") from None
        try:
            self.meta = read_header(self.f, path)
        except BaseException:
            self.f.close()
            raise

    def __iter__(self):
        z = zlib.decompressobj()
        reader = wire.FrameReader()
        try:
            while True:
                data = self.f.read(self.chunk)
                if not data:
                    break
                out = z.decompress(data, self.chunk * 8)
                while True:
                    for body in reader.feed(out):
                        try:
                            frame = wire.unpack_body(body)
                        except Exception as e:  # noqa: BLE001
                            self.damage = f"corrupt frame after {self.frames} frames ({type(e).__name__})"
                            return
                        self.frames += 1
                        yield body, frame
                    if not z.unconsumed_tail:
                        break
                    out = z.decompress(z.unconsumed_tail, self.chunk * 8)
                if z.eof:
                    break
            if not z.eof:
                self.damage = f"file ends early after {self.frames} frames (not finalised: the run was cut short or the file truncated)"
            elif reader.pending:
                self.damage = "trailing bytes after the last frame"
        except zlib.error:
            self.damage = f"corrupted bytes after {self.frames} frames"
        except ValueError as e:
            self.damage = f"{e} after {self.frames} frames"
        finally:
            self.f.close()
