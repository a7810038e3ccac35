#!/usr/bin/env python
"""P3 — drawing cost of the UI.

(a) One full frame at 200×50 of 2 strategies × 8 ranks (xlarge, synthetic): the app's
    redraw from the store (views, scale, figures, GPU panel) plus every line of every
    timeline pane with the strip cache cleared first, so each render really draws.
    Median CPU time of this thread over many renders (wall time printed too).
    Goal: <= 4 ms.
(b) CPU share of one core used by the whole app (Textual included) drawing 64 ranks of
    synthetic data at 30 fps while new steps keep arriving, headless via run_test:
    process CPU time / wall time over the run. Frames are made beforehand, so the share
    is what the app spends ingesting, computing figures (the store's work grows with the
    ranks) and drawing. Steps arrive at 5 per second by default: 64 ranks on one host
    share its GPUs over gloo and do not step faster (--steps-per-s to try others).
    Goal: <= 20 %.

    python benchmarks/p3_drawing.py            # 300 frames; 5 s at 30 fps
    python benchmarks/p3_drawing.py --quick    # 60 frames; 2 s
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _common import result_line

from ddptui.ui.app import DdpApp  # noqa: E402
from ddptui.recording.synthetic import SyntheticSource  # noqa: E402
from ddptui.ui.widgets import TimelinePane  # noqa: E402

GOAL_FRAME_MS = 4.0
GOAL_CPU_PCT = 20.0


async def frame_times(renders: int) -> tuple[list[float], list[float]]:
    """CPU time (this thread's: robust on a busy machine) and wall time per frame, ms."""
    app = DdpApp(SyntheticSource(2, 8, "xlarge", gpu=True, seed=5))
    cpu, wall = [], []
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        panes = list(app.query(TimelinePane))
        shown = sum(len(p.fit()[0]) for p in panes)
        assert shown == 16, f"expected 2 x 8 ranks on screen, got {shown}"
        for _ in range(renders):
            t, c = time.perf_counter(), time.thread_time()
            app._views.clear()  # views and strips made afresh: a new step's frame
            app.redraw()
            for p in panes:
                p.clear_cache()
                for y in range(p.size.height):
                    p.render_line(y)
            cpu.append((time.thread_time() - c) * 1e3)
            wall.append((time.perf_counter() - t) * 1e3)
    return cpu, wall


async def cpu_share(seconds: float, steps_per_s: float, ranks: int = 64) -> tuple[float, int, int]:
    steps = int(seconds * steps_per_s) + 5
    src = SyntheticSource(2, ranks, "xlarge", gpu=True, seed=5, ahead=steps, per_s=steps_per_s)
    app = DdpApp(src, fps=30)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        first = src.store.latest_complete("ddp")
        c0, w0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - c0, time.monotonic() - w0
        last = src.store.latest_complete("ddp")
    return 100.0 * cpu / wall, last - first, app._ticks


def main() -> None:
    p = argparse.ArgumentParser(description="P3: UI drawing cost")
    p.add_argument("--quick", action="store_true", help="short run for CI")
    p.add_argument("--steps-per-s", type=float, default=5.0, help="(b) new steps per second (default 5)")
    p.add_argument("--ranks", type=int, default=64,
                   help="(b) ranks (default 64; past what fits, the panes draw aggregated lanes)")
    a = p.parse_args()
    renders = 60 if a.quick else 300
    seconds = 2.0 if a.quick else 5.0

    cpu, wall = asyncio.run(frame_times(renders))
    med = statistics.median(cpu)
    print(f"P3a full frame, 200x50, naive + ddp x 8 ranks, uncached, {renders} renders: "
          f"median {med:.2f} ms CPU (p90 {sorted(cpu)[int(len(cpu) * 0.9)]:.2f}), "
          f"median {statistics.median(wall):.2f} ms wall")
    print(result_line("P3a", "frame_ms", "median", med, "<=", GOAL_FRAME_MS, "{:.2f}"))

    pct, steps, ticks = asyncio.run(cpu_share(seconds, a.steps_per_s, a.ranks))
    print(f"P3b app at 30 fps, {a.ranks} ranks, {a.steps_per_s:g} new steps/s: {pct:.1f} % of one core "
          f"over {seconds:g} s ({steps} steps shown, {ticks} ticks)")
    print(result_line("P3b", "cpu_pct", "share", pct, "<=", GOAL_CPU_PCT, "{:.1f}"))


if __name__ == "__main__":
    main()
