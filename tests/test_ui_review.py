"""What a user's-eye pass in tmux found: a Flight Recorder lane labelled `AR@group 1 group 1`;
footers offering b, B, d where they do not apply (answered "no rank is connected yet") and
losing the key that matters at 80 columns; the FR verdict cut off the status line; a 2D mesh's
per-dimension counts and AG/RS gone from an 80x24 screen; panels meaning nothing for a Flight
Recorder run; CLI help reusing summary's FILE text. The app under Pilot."""
from __future__ import annotations

import os

import pytest

from ddptui.recording.replay import ReplaySource
from ddptui.recording.synthetic import SyntheticSource
from ddptui.ui.app import DdpApp
from ddptui.ui.widgets.lanes import coll_look

from .helpers import ROOT

FR = os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo")
MESH = os.path.join(ROOT, "tests", "data", "tp2d-4ranks.ddptui")


def still() -> int:
    return 10**9  # (a clock that never moves: the replay goes only where a test sends it)


class ScriptRun(SyntheticSource):
    """What `ddptui run` is to the app: a live run whose script owns its DDP (cli/run.py's UserRun)."""
    owns_ddp = True


class Watched:
    """What `ddptui attach` is to the app: a live run it only watches, with p (ProfileControl)."""

    def __init__(self):
        self.inner = SyntheticSource(8, 2, "medium", ("ddp",), seed=7)
        self.store, self.state, self.message = self.inner.store, "running", ""

    def start(self) -> None:
        pass

    def poll(self) -> bool:
        return False

    def stop(self, why: str = "") -> None:
        self.state = "stopped"

    def pull_profile(self, seconds: float):
        raise RuntimeError("not here")


class NotingApp(DdpApp):
    """The real app, keeping the notifications it shows."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.notes: list[str] = []

    def notify(self, message, **kw):
        self.notes.append(str(message))
        return super().notify(message, **kw)


async def screen_of(src, size, keys=()) -> list[str]:
    """The whole screen, line by line, at the replay's last step, after `keys`."""
    app = DdpApp(src)
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        if isinstance(src, ReplaySource):
            src.seek(src.steps_total - 1)
        for k in keys:
            await pilot.press(k)
            await pilot.pause()
        app.redraw()
        await pilot.pause()
        return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]


def test_a_flight_recorder_lane_names_its_group_once():
    """The groups are a Flight Recorder run's "layers": `AR group 1`, not `AR@group 1 group 1`
    (as the Chrome trace got in a122421); a mesh dimension still says itself: `AR@tp layers.0`."""
    src = ReplaySource(FR, clock=still)
    src.seek(src.steps_total - 1)
    names = list(src.store.meta.layers)
    labels = {coll_look(row, names)[1] for r in (0, 1) for row in src.store.collective_tables("ddp")[r].values()}
    assert "AR group 1" in labels and not any("@" in x for x in labels), labels
    assert coll_look((0, "all_reduce", 64, 2, "mesh_tp@0", 0, "forward", False), ["layers.0"])[1] == "AR@tp layers.0"
    assert coll_look((0, "all_gather", 64, 2, "mesh_dp", -1, "forward", False), ["layers.0"])[1] == "AG@dp"
