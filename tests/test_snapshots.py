"""SVG snapshots of the main screen (pytest-textual-snapshot). Deterministic: synthetic
data with a fixed seed, a fixed step, no clocks or paths on screen.

Regenerate after an intended change of the picture:
    pytest tests/test_snapshots.py --snapshot-update
"""
from __future__ import annotations

import pytest

from ddptui.ui.app import DdpApp
from ddptui.recording.synthetic import SyntheticSource


def fixed_source(world: int = 4, steps: int = 8) -> SyntheticSource:
    """Steps of a synthetic naive-vs-DDP run (large, seed 7) with GPU samples; never changes."""
    return SyntheticSource(steps, world, "large", ("naive", "ddp"), gpu=True, seed=7)


async def _settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.redraw()  # one frame after layout: panes know their widths
    await pilot.pause()


SIZES = [(80, 24), (120, 40), (200, 50), (300, 80)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_main_screen(snap_compare, size):
    assert snap_compare(DdpApp(fixed_source()), terminal_size=size, run_before=_settle)


@pytest.mark.asyncio
@pytest.mark.parametrize("world", [2, 4])
async def test_200x50_two_strategies_use_the_room(world):
    """At a projector's 200x50, naive vs DDP leaves at most 5 blank rows, and the panels
    below the lanes are all there."""
    app = DdpApp(fixed_source(world, 12))
    async with app.run_test(size=(200, 50)) as pilot:
        await _settle(pilot)
        screen = [strip.text for strip in app.screen._compositor.render_strips()]
    assert len(screen) == 50
    blank = [i for i, line in enumerate(screen) if not line.strip()]
    assert len(blank) <= 5, "\n".join(screen)
    text = "\n".join(screen)
    for needle in ("busy %", "step time", "DDP buckets", "GPU0", "r0  comp", f"r{world - 1}  comp"):
        assert needle in text


def test_fsdp_beside_ddp_160x36(snap_compare):
    """`ddptui --strategies ddp,fsdp` at 160x36 (synthetic, seed 7): the fsdp pane's lanes with
    its all-gathers and reduce-scatters labelled by op where 'AG fc2' does not fit ('AG'), the
    legend naming them, the figures row 'AR+coll' 0+15, the waits panel speaking of
    collectives. (36 rows: no what-if panel, whose model changes on its own.)"""
    src = SyntheticSource(8, 2, "medium", ("ddp", "fsdp"), gpu=True, seed=7)
    assert snap_compare(DdpApp(src), terminal_size=(160, 36), run_before=_settle)


@pytest.mark.asyncio
async def test_fsdp_screen_speaks_of_collectives():
    """The fsdp pane as a user reads it: AG/RS labels on its comm lane at zoom 1x, the waits
    panel's title speaks of collectives, and fsdp alone has no AllReduce in its legend."""
    async def screen(strategies, size):
        app = DdpApp(SyntheticSource(8, 2, "medium", strategies, gpu=True, seed=7))
        async with app.run_test(size=size) as pilot:
            await _settle(pilot)
            return [strip.text for strip in app.screen._compositor.render_strips()]
    both = await screen(("ddp", "fsdp"), (160, 45))
    comm = [line[80:] for line in both if line[80:].lstrip().startswith("comm")]
    assert comm and all(" AG" in line.replace("█", " ") and "RS" in line for line in comm), "\n".join(both)
    text = "\n".join(both)
    assert "wait: own collective ready" in text and "own AllReduce ready" not in text
    assert "AllReduce" in next(line for line in both if "forward" in line and "backward" in line)
    alone = await screen(("fsdp",), (120, 40))
    legend = next(line for line in alone if "██ forward" in line)
    assert "AG all-gather" in legend and "AllReduce" not in legend and "last to arrive" not in legend
