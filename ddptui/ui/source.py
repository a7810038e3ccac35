"""What the UI drives: a Source (live ranks, a replay, a recording being written).

Every source has a Store that it fills, and a small life cycle the app runs: `start()`
once (in a worker thread: it may take long), `poll()` at the frame rate (cheap; True once
the source has ended), `stop(why)` once (in a worker thread). `state` and `message` say
where it stands. The optional abilities are declared here, checked with isinstance:
`BucketControl` (a live run: DDP's bucket cap can be changed), `StragglerControl` (a live
run: a straggler switched on and off), `ProfileControl` (an attached job: a torch.profiler
window pulled from every rank) and `Transport` (a replay: play/pause, speed, seek). A live
run whose script owns its DDP (`ddptui run`) says so with `owns_ddp = True`: the first two
do not apply to it.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ddptui.model.store import Store


@runtime_checkable
class Source(Protocol):
    store: Store
    state: str  # created | starting | running | ready | playing | paused | finished | failed | stopped
    message: str

    def start(self) -> None: ...

    def poll(self) -> bool: ...

    def stop(self, why: str = "") -> None: ...


@runtime_checkable
class BucketControl(Source, Protocol):
    """A live run whose ranks take a new DDP bucket cap (returns how many ranks were asked)."""

    def set_bucket_cap(self, mb: float) -> int: ...


@runtime_checkable
class StragglerControl(Source, Protocol):
    """A live run whose ranks take a straggler on demand (ms 0: off; returns ranks asked)."""

    def set_straggler(self, ms: float, rank: int | None = None, layer: int | None = None) -> int: ...


@runtime_checkable
class ProfileControl(Source, Protocol):
    """An attached job (ddptui.live.attach.AttachRun): `pull_profile(seconds)` takes a window of
    torch.profiler from every rank and writes it as a traces directory (slow: call it off the
    event loop); its `lines()` say where, or why not."""

    def pull_profile(self, seconds: float): ...


@runtime_checkable
class Transport(Source, Protocol):
    """A replay: a virtual clock over a recording (ddptui.recording.replay.ReplaySource)."""

    name: str
    speed: float
    loop: bool
    skipped: int

    @property
    def steps_total(self) -> int: ...

    @property
    def position_step(self) -> int: ...

    @property
    def playing(self) -> bool: ...

    def toggle_play(self) -> None: ...

    def set_speed(self, x: float) -> float: ...

    def seek(self, step: int) -> int: ...

    def step_by(self, n: int) -> int: ...
