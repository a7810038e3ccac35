"""Replay a recording into a Store on a virtual clock: play, pause, speed, seek, loop.

The whole recording is read once at construction and kept as frame bodies with two small
indexes: each frame's time on the recording's clock (ns: `base_ns` of spans frames, `ts` of
gpu/cpu frames; frames without a time, and invalid ones, take the previous one) and, per
step, the frame where that step is complete on every rank. Bodies are decoded again only when ingested.
Playback starts at the first step (start-up chatter is ingested at once), idle
stretches longer than MAX_GAP_NS are shortened to it, and the start-up before the first
step is complete on every rank (rendezvous, building, a first step of seconds: panes that
only say "waiting") is cut to its last LEAD_NS: the virtual clock starts just before the
first complete step, at the start, on every loop and after a rewind; `skipped_start_ns`
says how much was cut (the status line says so).
"""
from __future__ import annotations

import os
import time
from array import array
from bisect import bisect_right

from ranks import spec
from ranks.frames import Cpu, Gpu, Spans

from ddptui.ingest.feed import Feed
from .rankset import open_reader
from .reader import Reader
from ddptui.model.store import Store

MIN_SPEED, MAX_SPEED = spec.SPEED_LADDER[0], spec.SPEED_LADDER[-1]
MAX_GAP_NS = 2_000_000_000
LEAD_NS = 500_000_000  # the start-up played before the first complete step (the rest is cut)
UPDATE_EVERY = 1000  # frames between store.update() calls while catching up


_MAX_NS = 2**63
MAX_STEP = 2**31 - 1  # ranks.frames' limit on step numbers


class StepEnds:
    """step k -> frames to ingest for step k to be complete on every rank (non-decreasing
    in k), a sequence of max step + 1 items stored for the steps present only: a file's
    step numbers are not trusted to be dense (one frame saying step 2**31 costs nothing)."""

    def __init__(self, ends: dict[int, int]):
        self.keys = array("q", sorted(ends))
        self.vals = array("q")
        last = 0
        for k in self.keys:
            last = max(last, ends[k])
            self.vals.append(last)

    def __len__(self) -> int:
        return self.keys[-1] + 1 if self.keys else 0

    def __getitem__(self, k: int) -> int:
        if not 0 <= k < len(self):
            raise IndexError(k)
        i = bisect_right(self.keys, k) - 1
        return self.vals[i] if i >= 0 else 0


def clamp_speed(x: float) -> float:
    return min(MAX_SPEED, max(MIN_SPEED, float(x)))


class ReplaySource:
    """A source like LiveRun (store, start, poll, stop, state, message) plus transport.

    Raises RecordingError when the file cannot be read at all; a file damaged part-way
    replays what was read before the damage, described by `.damage`."""

    def __init__(self, path: str, speed: float = 1.0, loop: bool = False, clock=time.monotonic_ns):
        reader = open_reader(path)
        self.path = path
        self.name = os.path.basename(path)
        self.meta = reader.meta
        self.loop = loop
        self.speed = clamp_speed(speed)
        self._clock = clock
        self.bodies: list[bytes] = []
        self.times = array("q")
        self.step_end = StepEnds({})  # step k is complete once step_end[k] frames are ingested
        self._first_step_frame = 0
        self.skipped_start_ns = 0  # start-up cut before the first complete step (see LEAD_NS)
        self._index(reader)
        self.damage = reader.damage
        self._said = (f"recording damaged: {self.damage}; replaying what was read before it"
                      if self.damage else "")  # (what the message says when nothing else is)
        self.message = self._said
        self.state = "ready"  # ready | playing | paused | finished | stopped
        self.pos = 0  # frames ingested
        self.skipped = 0  # invalid frames met while ingesting (skipped, logged)
        self._fed: Feed | None = None
        self._vt = 0  # recording time at the anchor
        self._anchor = 0  # wall clock at the anchor
        self.store = self._new_store()

    # -- indexing ------------------------------------------------------------------------
    def _index(self, reader: Reader) -> None:
        ends: dict[int, int] = {}
        bodies, times = self.bodies, self.times
        t = shift = 0
        first_spans = None
        for body, f in reader:
            cls = type(f)
            ts = f.base_ns if cls is Spans else f.ts if cls is Gpu or cls is Cpu else None
            if ts.__class__ is int and 0 <= ts < _MAX_NS:
                adj = ts - shift
                if adj - t > MAX_GAP_NS and t:
                    shift += adj - t - MAX_GAP_NS
                    adj = ts - shift
                if adj > t:
                    t = adj
            if cls is Spans:
                k = f.step
                if 0 <= k <= MAX_STEP:
                    ends[k] = len(bodies) + 1
                    if first_spans is None:
                        first_spans = len(bodies)
            bodies.append(body)
            times.append(t)
        self.step_end = StepEnds(ends)
        self._first_step_frame = len(self.bodies) if first_spans is None else first_spans
        if ends:
            self._cut_start_up(self.step_end.vals[0] - 1)

    def _cut_start_up(self, done: int) -> None:
        """Frames before `done` (the one that completes the first step on every rank) take at
        least its time less LEAD_NS: the wait for the first complete step, however long
        the ranks took to start, plays in LEAD_NS."""
        times = self.times
        floor = times[done] - LEAD_NS
        start = self._first_step_frame
        at_start = times[start - 1] if start > 0 else times[0]  # (where the clock started)
        self.skipped_start_ns = max(0, floor - at_start)
        for i in range(done):
            if times[i] < floor:
                times[i] = floor

    @property
    def steps_total(self) -> int:
        return len(self.step_end)

    @property
    def position_step(self) -> int:
        """The last step the store holds completely (-1: none yet)."""
        return bisect_right(self.step_end, self.pos) - 1

    @property
    def playing(self) -> bool:
        return self.state == "playing"

    # -- feeding the store ---------------------------------------------------------------
    def _new_store(self) -> Store:
        st = Store()
        st.set_meta(self.meta)
        return st

    def _feed(self, st: Store, start: int, end: int) -> None:
        """Frames start..end into `st` through the one door (ddptui.ingest.feed): a frame that
        fails its checks is skipped and logged, the rest goes on, as recording.load does."""
        if self._fed is None or self._fed.store is not st:
            self._fed = Feed(st)
        feed, bodies = self._fed, self.bodies
        for i in range(start, end):
            if feed.body(bodies[i]) is None:
                self.skipped += 1
            if (i + 1) % UPDATE_EVERY == 0:
                st.update()
        st.update()

    def _ingest_to(self, end: int) -> None:
        self._feed(self.store, self.pos, end)
        self.pos = max(self.pos, end)

    def _rebuild_to(self, end: int) -> None:
        """A new store up to `end`, built aside and swapped in whole (the UI may be drawing)."""
        st = self._new_store()
        self.skipped = 0
        self._feed(st, 0, end)
        self.store, self.pos = st, end

    def _now_vt(self) -> int:
        if self.state != "playing":
            return self._vt
        return self._vt + int((self._clock() - self._anchor) * self.speed)

    def _anchor_at(self, vt: int) -> None:
        self._vt, self._anchor = vt, self._clock()

    def _vt_of(self, pos: int) -> int:
        return self.times[pos - 1] if pos > 0 else (self.times[0] if self.times else 0)

    # -- the source interface ------------------------------------------------------------
    def start(self) -> None:
        self._ingest_to(self._first_step_frame)
        self._anchor_at(self._vt_of(self.pos))
        self.state = "playing"

    def poll(self) -> bool:
        """Ingest what the virtual clock has reached; True once the end is reached (unless loop)."""
        if self.state == "playing":
            vt = self._now_vt()
            end = bisect_right(self.times, vt, lo=self.pos)
            self._ingest_to(end)
            if self.pos >= len(self.bodies):
                self._at_end()
        return self.state in ("finished", "stopped")

    def _at_end(self) -> None:
        if self.loop and self.steps_total:
            self._rebuild_to(self._first_step_frame)
            self._anchor_at(self._vt_of(self.pos))
        else:
            self.state = "finished"
            self._vt = self._vt_of(self.pos)
            self.message = self._said or "replay finished"

    def stop(self, why: str = "") -> None:
        self.state = "stopped"
        self.message = why or self.message

    # -- transport -----------------------------------------------------------------------
    def toggle_play(self) -> None:
        if self.state == "playing":
            self._vt = self._now_vt()
            self.state = "paused"
        elif self.state == "finished":
            self._rebuild_to(self._first_step_frame)
            self._anchor_at(self._vt_of(self.pos))
            self.state = "playing"
            self.message = self._said
        elif self.state in ("ready", "paused"):
            if self.state == "ready":
                self._ingest_to(self._first_step_frame)
                self._vt = self._vt_of(self.pos)
            self._anchor = self._clock()
            self.state = "playing"

    def set_speed(self, x: float) -> float:
        self._anchor_at(self._now_vt())
        self.speed = clamp_speed(x)
        return self.speed

    def seek(self, step: int) -> int:
        """Make the store hold everything up to `step` (clamped); going back rebuilds it."""
        if not self.steps_total:
            return -1
        step = min(max(0, int(step)), self.steps_total - 1)
        end = self.step_end[step]
        if end >= self.pos:
            self._ingest_to(end)
        else:
            self._rebuild_to(end)
        self._anchor_at(self._vt_of(self.pos))
        if self.state in ("finished", "ready"):
            self.state = "paused"
        if step < self.steps_total - 1 and self.message == "replay finished":
            self.message = self._said  # (moved back from the end: there is more to play)
        return step

    def step_by(self, n: int) -> int:
        """Move n steps from the current position; stepping pauses playback."""
        if self.state == "playing":
            self.toggle_play()
        return self.seek(self.position_step + n)
