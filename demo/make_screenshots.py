#!/usr/bin/env python
"""Make the README screenshots (SVG) with the app itself, from the demo recording.

Replays demo/cpu-medium-2ranks.ddptui headless, pauses, jumps to one step with the same
keys a user presses, and saves what the app draws:

    python demo/make_screenshots.py                 # demo/screenshots/*.svg at step 20
    python demo/make_screenshots.py --step 12 --out shots
    DDPTUI_BROWSER_SHOT=demo/screenshots/browser.png pytest tests/test_serve.py   # the browser one
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ddptui.ui.app import DdpApp  # noqa: E402
from ddptui.recording.replay import ReplaySource  # noqa: E402

RECORDING = os.path.join(HERE, "cpu-medium-2ranks.ddptui")
TITLE = "naive vs DDP · 2 CPU ranks"
SHOTS = (  # file, terminal size, extra keys
    ("main-80x24.svg", (80, 24), ()),
    ("main-120x40.svg", (120, 40), ()),
    ("main-200x50.svg", (200, 50), ()),
    ("main-300x80.svg", (300, 80), ()),
    ("help.svg", (120, 40), ("question_mark",)),
)


async def shoot(name: str, size: tuple[int, int], keys: tuple[str, ...], step: int, out: str) -> str:
    app = DdpApp(ReplaySource(RECORDING), title=TITLE)
    async with app.run_test(size=size) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("space", "g", *str(step), "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press(*keys)
        await pilot.pause()
        return app.save_screenshot(filename=name, path=out)


def main() -> None:
    p = argparse.ArgumentParser(description="README screenshots from the demo recording")
    p.add_argument("--out", default=os.path.join(HERE, "screenshots"), help="output folder")
    p.add_argument("--step", type=int, default=20, help="step to show (default 20)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, size, keys in SHOTS:
        print(asyncio.run(shoot(name, size, keys, a.step, a.out)))


if __name__ == "__main__":
    main()
