"""Recordings: a versioned header, then the frames the ranks sent, in one zlib stream.

    magic  8 bytes  b"\\x89DDPTUI\\n"
    u16    format version (big-endian)
    u32    header length, then a msgpack map: run metadata
    ...    zlib stream of length-prefixed msgpack frames (see ranks.wire), sync-flushed
           when a step is complete (the last rank's spans of a strategy step are written)
           and at least every FLUSH_EVERY_S when frames come, so a file cut at any byte
           (a run killed at any instant) replays to its last complete step

Reading never trusts a length: frame lengths are capped at wire.MAX_FRAME, the header at
MAX_HEADER, and the stream is inflated 16 KiB at a time (deflate bounds the output of each
piece); corrupt data keeps every frame before it.
"""
from __future__ import annotations

import copy
import os
import stat
import struct
import threading
import time
import zlib

import msgpack

from ranks import spec, wire

MAGIC = b"\x89DDPTUI\n"
FORMAT_VERSION = 1
MAX_HEADER = 4 * 1024 * 1024
_HDR = struct.Struct(">HI")
FLUSH_EVERY_S = 0.25
PIECE = 16 * 1024  # compressed bytes inflated at a time (bounds memory and salvage work)


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
        self.last_flush = time.monotonic()
        self.closed = False
        w = meta.get("world")
        self.world = w if isinstance(w, int) and w > 0 else 1
        self._ranks_in: dict[tuple, int] = {}  # (strategy, step) -> span frames written

    def _completes_step(self, frame: dict) -> bool:
        """True when this spans frame is the last rank's of its (strategy, step)."""
        key = (frame.get("s"), frame.get("k"))
        n = self._ranks_in.get(key, 0) + 1
        if n >= spec.strategy_ranks(key[0], self.world):
            self._ranks_in.pop(key, None)
            return True
        self._ranks_in[key] = n
        if len(self._ranks_in) > 4096:  # steps that never complete (dropped frames)
            self._ranks_in.pop(next(iter(self._ranks_in)))
        return False

    def write_body(self, body: bytes, frame: dict | None = None) -> None:
        with self.lock:
            if self.closed:
                return
            data = wire.LEN.pack(len(body)) + body
            self.f.write(self.z.compress(data))
            self.frames += 1
            step_done = False
            if frame is not None and frame.get("t") == "spans":
                self.spans += len(frame["kind"])
                step_done = self._completes_step(frame)
            if step_done or time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
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


class Reader:
    """Reads a recording: header, then frames until the end or the first damage.

    >>> r = Reader(path); meta = r.meta
    >>> for body, frame in r: ...
    >>> r.damage  # None, or a one-line description of where and why reading stopped
    """

    def __new__(cls, path: str = "", *a, **kw):
        if cls is Reader and isinstance(path, str) and os.path.isdir(path):
            from .kineto import KinetoReader, trace_files
            from .rankset import RankSetReader, _RANK_FILE  # a directory of per-rank files: one run
            if trace_files(path) and not any(_RANK_FILE.fullmatch(n) for n in os.listdir(path)):
                return KinetoReader(path, *a, **kw)  # torch.profiler traces, one per rank
            return super().__new__(RankSetReader)
        return super().__new__(cls)

    def __init__(self, path: str, chunk: int = 1 << 20):
        self.path = path
        self.name = os.path.basename(path)
        self.chunk = chunk
        self.damage: str | None = None
        self.frames = 0
        try:
            if not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path):
                raise RecordingError(f"{path}: not a regular file")  # a FIFO would block
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
        reader = _Frames()
        corrupt = False
        try:
            while not z.eof and not corrupt:
                data = self.f.read(self.chunk)
                if not data:
                    break
                for i in range(0, len(data), PIECE):
                    outs, z, corrupt = _inflate(z, data[i:i + PIECE])
                    for out in outs:
                        for body in reader.feed(out):
                            try:
                                frame = wire.unpack_body(body)
                            except Exception as e:  # noqa: BLE001
                                self.damage = f"corrupt frame {_at(self.frames)} ({_why(e)})"
                                return
                            self.frames += 1
                            yield body, frame
                    if corrupt or z.eof:
                        break
            if corrupt:
                self.damage = f"corrupted bytes {_at(self.frames)} (compressed data is invalid)"
            elif not z.eof:
                where = "mid-frame " if reader.pending else ""
                self.damage = (f"file ends {where}{_at(self.frames, 'before the first frame')} "
                               f"(not finalised: the run was cut short or the file truncated)")
            elif reader.pending:
                self.damage = f"stream ends mid-frame {_at(self.frames, 'before the first complete frame')}"
            elif z.unused_data or self.f.read(1):
                self.damage = f"unexpected bytes after the end of the recording ({self.frames} frames read)"
        except ValueError as e:  # a length prefix over the limit
            self.damage = f"corrupt frame {_at(self.frames)} ({e})"
        finally:
            self.f.close()

    def close(self) -> None:
        self.f.close()


class _Frames:
    """Splits the inflated stream into frame bodies, yielding each good frame before
    raising ValueError at a length prefix over wire.MAX_FRAME (which is never allocated)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes):
        buf = self.buf
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (n,) = wire.LEN.unpack_from(buf, pos)
                if n > wire.MAX_FRAME:
                    raise ValueError(f"a length prefix claims {n} bytes (limit {wire.MAX_FRAME})")
                if len(buf) - pos - 4 < n:
                    break
                body = bytes(buf[pos + 4:pos + 4 + n])
                pos += 4 + n
                yield body
        finally:
            del buf[:pos]

    @property
    def pending(self) -> int:
        return len(self.buf)


def _inflate(z, piece: bytes):
    """Decompress one piece; on corrupt data, salvage the output of the bytes before the
    damage (byte by byte, from a copy of the state before the piece). The output of one
    piece is bounded by deflate's ratio (~1032:1), hence small pieces.
    Returns (outputs, decompressor to go on with, corrupt?)."""
    saved = z.copy()
    try:
        return [z.decompress(piece)], z, False
    except zlib.error:
        pass
    outs = []
    for j in range(len(piece)):
        try:
            out = saved.decompress(piece[j:j + 1])
        except zlib.error:
            break
        if out:
            outs.append(out)
        if saved.eof:
            break
    return outs, saved, True


def _at(frames: int, first: str = "at the first frame") -> str:
    return first if frames == 0 else f"after {frames} frames"


def _why(e: Exception) -> str:
    if isinstance(e, msgpack.exceptions.StackError):
        return "msgpack nested too deeply"
    text = str(e).strip() or type(e).__name__
    return text[:120]


class Loaded:
    """What load() read: the store (figures computed), header metadata, counts, damage."""

    def __init__(self, path: str, store, meta: dict):
        self.path = path
        self.store = store
        self.meta = meta
        self.frames = 0  # frames read (taken or rejected)
        self.span_frames = 0
        self.spans = 0
        self.damage: str | None = None  # where and why reading stopped (stream damage)
        self.rejected: list[int] = []  # indexes of the frames the feed rejected (skipped)
        self.first_reject: str | None = None

    def skipped_text(self) -> str | None:
        """One phrase about the frames skipped, or None when there were none."""
        if not self.rejected:
            return None
        n = len(self.rejected)
        return f"{n} invalid frame{'s' if n > 1 else ''} skipped (first: {self.first_reject})"

    def steps_read(self) -> dict[str, list[int]]:
        """Complete steps (every rank reported) per strategy, in order."""
        return {s: self.store.complete_steps(s) for s in self.store.strategies()
                if self.store.complete_steps(s)}

    def steps_text(self) -> str:
        parts = []
        for s, ks in self.steps_read().items():
            contiguous = ks == list(range(ks[0], ks[-1] + 1))
            rng = f"{ks[0]}–{ks[-1]}" if len(ks) > 1 else f"{ks[0]}"
            parts.append(f"{s} steps {rng}" + ("" if contiguous else f" ({len(ks)} steps)"))
        return ", ".join(parts) if parts else "no complete step"


def load(path: str, store=None, on_frame=None, update_every: int = 256) -> Loaded:
    """Read a recording into a Store (ddptui.store) through the one door (ddptui.feed), as
    a live run's frames are.

    on_frame(frame) is called for every frame the store took. Damage policy (ddptui.feed):
    a frame that fails its checks is skipped and logged (`rejected`, `first_reject`);
    reading stops at bytes that are not frames (`damage` says what and where), with
    everything before them in the store. Raises RecordingError when the header is bad, or
    when no span could be read (nothing to show).
    """
    from .feed import Feed
    from .store import Store

    r = Reader(path)
    st = store if store is not None else Store()
    st.set_meta(copy.deepcopy(r.meta))  # the store adds to its meta; keep the header as read
    got = Loaded(path, st, r.meta)
    feed = Feed(st)
    try:
        for _body, frame in r:
            got.frames += 1
            if not feed.frame(frame):
                got.rejected.append(got.frames - 1)
                continue
            if frame["t"] == "spans":
                got.span_frames += 1
                got.spans += len(frame["kind"])
            if on_frame is not None:
                on_frame(frame)
            if got.frames % update_every == 0:
                st.update()
    finally:
        r.close()
    got.damage = r.damage
    got.first_reject = feed.first_reject
    st.update()
    if not got.spans and (got.damage or got.rejected):
        raise RecordingError(f"{path}: {got.damage or got.first_reject}; nothing before the damage to show")
    return got
