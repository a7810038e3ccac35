#!/usr/bin/env python
"""Make the README screenshots (SVG) with the app itself, from the demo recordings.

Replays demo/cpu-medium-2ranks.ddptui (and the H100 run, demo/gpu-h100-xlarge-2ranks-gloo.ddptui) headless, pauses, jumps to one step with the same
keys a user presses, and saves what the app draws:

    python demo/make_screenshots.py                 # demo/screenshots/*.svg at step 20
    python demo/make_screenshots.py --step 12 --out shots
    python demo/make_screenshots.py --only gpu-h100-xlarge-2ranks-200x50.svg   # the H100 run's
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
GPU_RECORDING = os.path.join(HERE, "gpu-h100-xlarge-2ranks-gloo.ddptui")
GPU_TITLE = "naive vs DDP · 2 ranks sharing one H100"
SHOTS = (  # file, terminal size, extra keys[, recording, title]
    ("main-80x24.svg", (80, 24), ()),
    ("main-120x40.svg", (120, 40), ()),
    ("main-200x50.svg", (200, 50), ()),
    ("main-300x80.svg", (300, 80), ()),
    ("help.svg", (120, 40), ("question_mark",)),
    # the first H100 pass's run: the GPU named, the GPU panel, why comm dwarfs compute
    ("gpu-h100-xlarge-2ranks-200x50.svg", (200, 50), (), GPU_RECORDING, GPU_TITLE),
)


async def shoot(name: str, size: tuple[int, int], keys: tuple[str, ...], step: int, out: str,
                recording: str = RECORDING, title: str = TITLE) -> str:
    app = DdpApp(ReplaySource(recording), title=title)
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
    p.add_argument("--only", metavar="FILE", help="just this screenshot (e.g. gpu-h100-xlarge-2ranks-200x50.svg)")
    a = p.parse_args()
    shots = [s for s in SHOTS if a.only in (None, s[0])]
    if not shots:
        p.error(f"--only {a.only}: no such screenshot ({', '.join(s[0] for s in SHOTS)})")
    os.makedirs(a.out, exist_ok=True)
    for name, size, keys, *src in shots:
        print(asyncio.run(shoot(name, size, keys, a.step, a.out, *src)))


if __name__ == "__main__":
    main()
