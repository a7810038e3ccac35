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
from .test_app import NotingApp

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


@pytest.mark.asyncio
async def test_keys_that_do_not_apply_are_not_offered_and_say_why():
    """`ddptui run`, attach and replays: no `b bucket− B bucket+ d straggler` in the footer; pressed
    anyway, one line says why (not "no rank is connected yet", which a script's run said at step
    166); ddptui's own run still offers them."""
    runs = ((lambda: ScriptRun(8, 2, "medium", ("ddp",), seed=7), "the script owns its DDP"),
            (Watched, "only watched"), (lambda: ReplaySource(FR, clock=still), "a replay"))
    for make, why in runs:
        for key in ("b", "d"):
            app = NotingApp(make())
            async with app.run_test(size=(120, 40)) as pilot:
                await app.workers.wait_for_complete()
                await pilot.pause()
                footer = app.screen._compositor.render_strips()[-1].text
                assert "bucket" not in footer and "straggler" not in footer, footer
                await pilot.press(key)
                await pilot.pause()
                app.redraw()
                await pilot.pause()
                status = app.screen._compositor.render_strips()[-2].text
            assert "b, B, d do not apply" in status and why in status, status
            assert not any("no rank is connected" in n for n in app.notes), app.notes
    own = await screen_of(SyntheticSource(8, 2, "medium", ("ddp",), seed=7), (120, 40))
    assert "bB bucket" in own[-1], own[-1]


@pytest.mark.asyncio
async def test_at_80_columns_the_keys_and_the_verdict_that_matter_survive():
    """At 80x24 attach's footer kept everything but `p profile` (the key docs/attach.md names),
    the FR replay's status line lost the verdict's gist, and a replay's footer its go-to key."""
    attach = await screen_of(Watched(), (80, 24))
    assert "p profile" in attach[-1] and "space pause" in attach[-1], attach[-1]
    fr = await screen_of(ReplaySource(FR, clock=still), (80, 24))
    assert "r1 never issued it" in fr[-2] and "REPLAY" in fr[-2][:10], fr[-2]  # (its badge, then the verdict)
    for key in ("[] speed", "g go to", "space pause", "←→ step"):
        assert key in fr[-1], fr[-1]
    script = await screen_of(ScriptRun(8, 2, "medium", ("ddp",), seed=7), (120, 40))
    assert script[-1].rstrip().endswith("s screenshot"), script[-1]


@pytest.mark.asyncio
async def test_a_2d_mesh_at_80x24_says_which_collectives_are_tp_and_dp():
    """tests/scripts/tp2d.py's run at 80x24: the header dropped `(dp 8 · tp 4)` for a note on
    blocks drawn a bar, and the legend had forward, backward and AR but neither AG nor RS."""
    small = await screen_of(ReplaySource(MESH, clock=still), (80, 24))
    header = next(line for line in small if line.startswith(" FSDP  step"))
    assert "12 collectives (dp 8 · tp 4)" in header, header
    legend = next(line for line in small if "██ forward" in line)
    assert all(f"██ {op} " in legend for op in ("AR", "AG", "RS")) and "1 cell =" in legend, legend
    wide = await screen_of(ReplaySource(MESH, clock=still), (160, 40))
    legend = next(line for line in wide if "██ forward" in line)
    assert "AG all-gather" in legend and "RS reduce-scatter" in legend, legend


@pytest.mark.asyncio
async def test_a_flight_recorder_run_has_no_device_samples_nor_what_if_and_says_it_once():
    """`GPU / CPU: waiting for samples…` and `what if: … (the recording has no parameter table)`
    meant nothing for a Flight Recorder run; the help's `p` line wrapped in its box."""
    text = "\n".join(await screen_of(ReplaySource(FR, clock=still), (120, 40)))
    assert "GPU / CPU: a Flight Recorder run has no device samples" in text, text
    assert "waiting for samples" not in text and "what if" not in text, text
    from rich.text import Text

    from ddptui.ui.widgets.screens import HELP
    lines = Text.from_markup(HELP.format(ladder="1 → 5 → 25 → 100")).plain.splitlines()
    assert max(len(line) for line in lines) <= 100, "the help box is 100 columns inside"
    assert any(line.startswith("  p          attach: a torch.profiler window") for line in lines)


def test_cli_help_says_what_each_verb_makes_of_a_file():
    from ddptui.cli import attach, export, replay, summary
    helps = {m.__name__.rsplit(".", 1)[1]: m.parser().format_help() for m in (attach, export, replay, summary)}
    assert "disagree on" in " ".join(helps["summary"].split())
    for verb in ("replay", "export"):
        assert "disagree on" not in " ".join(helps[verb].split()), helps[verb]
    assert "--runs-dir DIR" in helps["attach"] and "RUNS_DIR" not in helps["attach"]
