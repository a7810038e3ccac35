"""A read-only view of a live run: follow its recording as the live app writes it.

The live app records every frame to a file, sync-flushed at each complete step (see
ddptui.recording.reader). FollowSource reads that file from its start and then whatever is
appended, like `tail -f`, into a Store: the same UI draws it, with no control over the
run (no bucket changes, no stopping it). `ddptui serve --attach` gives every browser tab
one of these: the run itself is started once, in a terminal, as usual.
"""
from __future__ import annotations

import zlib

from ddptui.ingest.feed import Feed
from .reader import Reader, _Frames
from ddptui.model.store import Store

READ_PER_POLL = 4 << 20  # bytes read per poll at most (a long run is taken up in slices)


class FollowSource:
    """A Source (store, start, poll, stop, state, message) over a growing recording."""

    def __init__(self, path: str):
        self.path = path
        reader = Reader(path)  # (checks the file and its header; RecordingError if bad)
        self.f, self.meta = reader.f, reader.meta  # the file, positioned after the header
        self.store = Store()
        self.store.set_meta(self.meta)
        self.feed = Feed(self.store)  # the one door, as every recording is read
        self.state, self.message = "created", ""
        self.skipped = 0
        self._z = zlib.decompressobj()
        self._frames = _Frames()

    def start(self) -> None:
        self.state = "running"
        self.message = f"following {self.path} (read-only)"

    def poll(self) -> bool:
        if self.state != "running":
            return True
        data = self.f.read(READ_PER_POLL)
        if data:
            try:
                out = self._z.decompress(data)
                for body in self._frames.feed(out):
                    if self.feed.body(body) is None:  # a frame the feed rejects: skipped, counted, logged
                        self.skipped += 1
            except (zlib.error, ValueError) as e:
                self.state, self.message = "failed", f"{self.path}: unreadable from here on ({e})"
                return True
            self.store.update()
        if self._z.eof:
            self.state, self.message = "finished", "the run ended (its recording is complete)"
            return True
        return False

    def stop(self, why: str = "") -> None:
        self.state = "stopped"
        self.message = why or self.message
        self.f.close()
