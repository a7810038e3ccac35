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


@pytest.mark.parametrize("size", [(120, 40), (200, 50), (80, 24)], ids=["120x40", "200x50", "80x24"])
def test_main_screen(snap_compare, size):
    assert snap_compare(DdpApp(FixedSource()), terminal_size=size, run_before=_settle)
