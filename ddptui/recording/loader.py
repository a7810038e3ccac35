"""A recording (a file, or a directory of per-rank files) read into a Store at once: `load`."""
from __future__ import annotations

import copy

from ranks import frames
from ranks.recfile import RecordingError

from .rankset import open_reader


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
    """Read a recording into a Store (ddptui.model.store) through the one door (ddptui.ingest.feed), as
    a live run's frames are.

    on_frame(frame) is called for every frame the store took (a ranks.frames Struct). Damage
    policy (ddptui.ingest.feed): a frame that fails its checks is skipped and logged
    (`rejected`, `first_reject`); reading stops at bytes that are not frames (`damage` says
    what and where), with everything before them in the store. Raises RecordingError when the header is bad, or
    when no span could be read (nothing to show).
    """
    from ddptui.ingest.feed import Feed
    from ddptui.model.store import Store

    r = open_reader(path)
    st = store if store is not None else Store()
    st.set_meta(copy.deepcopy(r.meta))  # the store adds to its meta; keep the header as read
    got = Loaded(path, st, r.meta)
    feed = Feed(st)
    try:
        for body, frame in r:
            got.frames += 1
            if not feed.frame(frame, body=body):  # decoded and validated from body by the reader
                got.rejected.append(got.frames - 1)
                continue
            if type(frame) is frames.Spans:
                got.span_frames += 1
                got.spans += len(frame.kind)
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
