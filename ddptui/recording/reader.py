"""Reading a recording (format: ranks.recfile): a versioned header, then the frames the ranks sent, in one zlib stream
(the format is described there).

Reading never trusts a length: frame lengths are capped at wire.MAX_FRAME, the header at
MAX_HEADER, and the stream is inflated 16 KiB at a time (deflate bounds the output of each
piece); corrupt data keeps every frame before it.
"""
from __future__ import annotations

import os
import stat
import zlib

import msgpack

from ranks import frames, wire
from ranks.recfile import RecordingError, read_header

PIECE = 16 * 1024  # compressed bytes inflated at a time (bounds memory and salvage work)


class Reader:
    """Reads a recording: header, then frames until the end or the first damage.

    >>> r = Reader(path); meta = r.meta   (a file; open_reader(path) takes a directory too)
    >>> for body, frame in r: ...   (frame: its ranks.frames Struct, decoded and validated
    ...                              from body, or a frames.Invalid the Feed rejects)
    >>> r.damage  # None, or a one-line description of where and why reading stopped
    """

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
                            frame = _decode(body)
                            if type(frame) is _Damage:
                                self.damage = f"corrupt frame {_at(self.frames)} ({frame.why})"
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


class _Damage:
    """A body that is no msgpack map at all (frames.Undecodable, and what is not a map):
    where reading stops, as it always did."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


# msgpack's own reading of a body, with the bounds frames were read with before ranks.frames
# (msgspec): only to say, in the words damage messages have always used, why a body is no map
_DESCRIBE = dict(raw=False, strict_map_key=True, max_str_len=1 << 20, max_bin_len=wire.MAX_FRAME,
                 max_array_len=1 << 20, max_map_len=1 << 12, max_ext_len=0)


def _decode(body: bytes):
    """One body as the reader yields it: its ranks.frames Struct, or a frames.Invalid (a map
    that breaks its type's rules: the Feed rejects it and reading goes on); a _Damage for bytes
    that are no msgpack map (frames.Undecodable, too deeply nested, not a map)."""
    try:
        frame = frames.decode_or_invalid(body)
    except Exception as e:  # noqa: BLE001 - frames.Undecodable, or anything a decoder raises
        return _Damage(_not_a_map(body) or _why(e))
    if type(frame) is frames.Invalid and frame.type is None:  # a map at all?
        why = _not_a_map(body)
        if why is not None:
            return _Damage(why)
    return frame


def _not_a_map(body: bytes) -> str | None:
    """Why a body is no msgpack map (None: it is one)."""
    try:
        obj = msgpack.unpackb(body, **_DESCRIBE)
    except Exception as e:  # noqa: BLE001
        return _why(e)
    return None if type(obj) is dict else "frame is not a map"


def _at(frames: int, first: str = "at the first frame") -> str:
    return first if frames == 0 else f"after {frames} frames"


def _why(e: Exception) -> str:
    if isinstance(e, msgpack.exceptions.StackError):
        return "msgpack nested too deeply"
    text = str(e).strip() or type(e).__name__
    return text[:120]
