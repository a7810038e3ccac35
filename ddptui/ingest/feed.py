"""The one door from frames to a Store, with one damage policy.

Every source goes through it: the collector (frames from ranks), `recording.load` (summary,
export, replay --headless) and the replay UI's ReplaySource. A frame body is decoded and
validated against ranks.frames (one msgspec call), checked against the run (Store.ingest)
and applied, in that order, so a frame that fails changes nothing.

Damage policy, the same everywhere: a frame that cannot be decoded, does not follow the
schema, comes from the wrong source (a type or a rank it may not send) or makes ingestion
raise anything at all is *rejected*: it changes nothing, becomes a ``reject`` frame (frame
type, rank, reason) that the store logs and counts and the sink records, and ingestion of
everything else goes on. What else a rejection means is the caller's: the collector drops
that connection (its stream can no longer be trusted); a recording goes on with its next
frame. Bytes a recording cannot split into frames (corrupt compression, a bad length) are
not frames at all: the Reader stops there and calls it damage.

The sink (the live recorder) failing is not the frame's fault: the frame stands (the store
has it), the sink gets no more frames, and that is said once (`on_sink_error`, else a
warning in the store's log). Recording stops alone: no frame is rejected for it and no
connection dropped (a full disk must not end a run).
"""
from __future__ import annotations

import threading
import time

from ranks import frames, wire
from ranks.frames import Frame, FrameError, Invalid

MAX_WHY = 300
_decode = frames.decoder().decode
_TAG = frames.TAG


class Feed:
    """Frames into `store`; `sink(body, frame)` gets every frame taken and every reject
    frame made (the live recorder), or None."""

    def __init__(self, store, sink=None, on_sink_error=None):
        self.store = store
        self.sink = sink
        self.on_sink_error = on_sink_error  # called once with the sink's exception (None: logged here)
        self.sink_error: str | None = None  # why the sink was switched off
        self.seen = 0  # frames offered
        self.rejected = 0  # frames rejected
        self.first_reject: str | None = None  # "after N frames: why" of the first one
        # the store and the sink see frames in one order (a clock frame from the listener's
        # thread and a rank's spans: the recording must map every batch as the live run did)
        self._order = threading.RLock()

    def body(self, body: bytes, rank: int | None = None, types=frames.RECORDED_FRAMES) -> Frame | None:
        """Decode, validate and take one frame body; returns the frame, or None when rejected."""
        try:
            f = _decode(body)  # one C call: msgpack to the frame's Struct, every field checked
        except Exception:  # noqa: BLE001 - said again, with its reason, by frames.decode
            self._refused(body, rank)
            return None
        return f if self._take(f, body, rank, types) else None

    def _refused(self, body: bytes, rank: int | None) -> None:
        """A body the decoder refused: rejected with frames' reason (its type and rank when
        they can be read)."""
        self.seen += 1
        try:
            got = frames.decode_or_invalid(body)
        except frames.Undecodable as e:
            self.reject(rank, None, str(e))
            return
        if type(got) is Invalid:
            self.reject(self._rank_of(got, rank), got.type, got.why)
        else:  # (decodes now: cannot happen)
            self.reject(rank, None, "undecodable frame")

    def frame(self, f, rank: int | None = None, types=frames.RECORDED_FRAMES, body: bytes | None = None) -> bool:
        """Take one frame: a Struct made in this process (validated here as if it had come
        over the wire), or one a recording's reader yields (Invalid: rejected). False when
        rejected."""
        if type(f) is Invalid:
            self.seen += 1
            self.reject(self._rank_of(f, rank), f.type, f.why)
            return False
        if body is None:
            try:
                f = frames.validate(f)
            except FrameError as e:
                self.seen += 1
                self.reject(rank, getattr(f, "type", None) if isinstance(f, Frame) else None, str(e))
                return False
            body = frames.encode(f)
        return self._take(f, body, rank, types)

    def _take(self, f: Frame, body: bytes, rank: int | None, types) -> bool:
        """A decoded, validated frame: from `rank` only, of `types` only; into the store (its
        cross-field rules against the run checked there) and the sink."""
        self.seen += 1
        t = _TAG[f.__class__]
        try:
            if t not in types:
                raise FrameError(f"unexpected frame type {t[:20]!r}")
            if rank is not None and getattr(f, "rank", None) != rank:
                raise FrameError(f"rank {rank} sent a frame for rank {str(getattr(f, 'rank', None))[:20]}")
            if self.sink is None:  # (the store has its own lock; the order lock is for the sink)
                self.store.ingest(f, True)
            else:
                with self._order:
                    self.store.ingest(f, True)
                    sink = self.sink
                    if sink is not None:
                        try:
                            sink(body, f)
                        except Exception as e:  # noqa: BLE001 - recording stops, the frame stands
                            self.sink_failed(e)
        except FrameError as e:
            why = str(e) if str(e).startswith(("unexpected", "rank ", "invalid ")) else f"invalid {t} frame: {e}"
            self.reject(self._rank_of(f, rank), t, why)
            return False
        except Exception as e:  # noqa: BLE001 - a bug must not stop ingestion of the rest
            self.reject(self._rank_of(f, rank), t, f"internal error on a {t} frame ({_why(e)})")
            return False
        return True

    def _rank_of(self, f, rank: int | None) -> int | None:
        """The rank to name for a rejected frame: its connection's, else its own if real."""
        if rank is not None:
            return rank
        r, world = getattr(f, "rank", None), self.store.limits.world
        return r if type(r) is int and 0 <= r < (world or frames.MAX_RANK + 1) else None

    def reject(self, rank: int | None, ftype, why: str) -> None:
        """Refuse a frame or a connection: logged and counted by the store, recorded."""
        why = " ".join(why.split())[:MAX_WHY]
        self.rejected += 1
        if self.first_reject is None:
            n = self.seen - 1
            self.first_reject = (f"{why} (after {n} frames)" if n else f"{why} (at the first frame)")
        self.note(frames.Reject(rank=rank, frame_type=ftype[:32] if isinstance(ftype, str) else None,
                                why=why, ts=time.time()))

    def note(self, f: Frame) -> None:
        """A frame the app itself makes (reject, drop, node): into the store and the sink."""
        with self._order:
            self.store.ingest(f, validated=True)
            sink = self.sink
            if sink is not None:
                try:
                    sink(frames.encode(f), f)
                except Exception as e:  # noqa: BLE001 - the store has it
                    self.sink_failed(e)

    def sink_failed(self, e: BaseException) -> None:
        """The sink failed (a full disk, a removed file, a bug): it gets no more frames, and
        that is said once; the frame it failed on stands."""
        with self._order:
            if self.sink is None:
                return
            self.sink = None
            self.sink_error = _why(e)
            try:
                if self.on_sink_error is not None:
                    self.on_sink_error(e)
                    return
            except Exception as e2:  # noqa: BLE001 - said here instead
                self.sink_error += f" (then {_why(e2)})"
            self.store.add_log(f"recording stopped: {self.sink_error}", "warn")


def _why(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}"[:160] if text else type(e).__name__
