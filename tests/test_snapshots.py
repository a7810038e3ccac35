"""SVG snapshots of the main screen (pytest-textual-snapshot). Deterministic: synthetic
data with a fixed seed, a fixed step, no clocks or paths on screen.

Regenerate after an intended change of the picture:
    pytest tests/test_snapshots.py --snapshot-update
"""
from __future__ import annotations

import pytest

from ddptui.app import DdpApp
from ddptui.store import Store
from ddptui.synthetic import SyntheticRun, fill_store


class FixedSource:
    """Eight steps of a synthetic naive-vs-DDP run on 4 ranks with GPU samples; never changes."""

    def __init__(self):
        self.store = Store()
        fill_store(self.store, SyntheticRun("large", 4, ("naive", "ddp"), seed=7), 8, gpu=True)
        self.state, self.message = "running", ""

    def start(self) -> None:
        pass

    def poll(self) -> bool:
        return False

    def set_bucket_cap(self, mb: float) -> int:
        return 0

    def stop(self, why: str = "") -> None:
        self.state = "stopped"


async def _settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.redraw()  # one frame after layout: panes know their widths
    await pilot.pause()


SIZES = [(80, 24), (120, 40), (200, 50), (300, 80)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_main_screen(snap_compare, size):
    assert snap_compare(DdpApp(FixedSource()), terminal_size=size, run_before=_settle)


@pytest.mark.asyncio
@pytest.mark.parametrize("world", [2, 4])
async def test_200x50_two_strategies_use_the_room(world):
    """At a projector's 200x50, naive vs DDP leaves at most 5 blank rows, and the panels
    below the lanes are all there."""
    src = FixedSource()
    src.store = Store()
    fill_store(src.store, SyntheticRun("large", world, ("naive", "ddp"), seed=7), 12, gpu=True)
    app = DdpApp(src)
    async with app.run_test(size=(200, 50)) as pilot:
        await _settle(pilot)
        screen = [strip.text for strip in app.screen._compositor.render_strips()]
    assert len(screen) == 50
    blank = [i for i, line in enumerate(screen) if not line.strip()]
    assert len(blank) <= 5, "\n".join(screen)
    text = "\n".join(screen)
    for needle in ("busy %", "step time", "DDP buckets", "GPU0", "r0  comp", f"r{world - 1}  comp"):
        assert needle in text
