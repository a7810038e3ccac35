#!/usr/bin/env python
"""P3 — drawing cost of the UI.

(a) One full frame at 200×50 of 2 strategies × 8 ranks (xlarge, synthetic): the app's
    redraw from the store (views, scale, figures, GPU panel) plus every line of every
    timeline pane with the strip cache cleared first, so each render really draws, as for a
    new step (the time axis, kept while its width and scale are the same, is not redrawn:
    a new step at the same scale does not redraw it either).
    Median CPU time of this thread over many renders (wall time printed too).
    Goal: <= 4 ms.
(b) CPU share of one core used by the whole app (Textual included) drawing 64 ranks of
    synthetic data at 30 fps while new steps keep arriving, headless via run_test:
    process CPU time / wall time over the run. Frames are made beforehand, so the share
    is what the app spends ingesting, computing figures (the store's work grows with the
    ranks) and drawing. Steps arrive at 5 per second by default: 64 ranks on one host
    share its GPUs over gloo and do not step faster (--steps-per-s to try others).
    Goal: <= 20 %. The steps come in on a thread of their own and their figures are
    computed by the Updater thread, as in a live run (the collector's thread, then the
    Updater); (c) is the drawing thread's share alone (the event loop the UI runs on), the
    part that must stay small however many ranks there are (--ranks 1024). Goal: <= 20 %.

    python benchmarks/p3_drawing.py            # 300 frames; 5 s at 30 fps
    python benchmarks/p3_drawing.py --quick    # 60 frames; 2 s
    python benchmarks/p3_drawing.py --vs a967aee [--rounds 3]

--vs REV measures another revision's code in the same run: REV is checked out into a
temporary git worktree. P3a: each revision's own frame loop runs in a process of its own
(benchmarks/_paced.py) and the two take turns one frame at a time (600 frames each; 200 with
--quick), so a slow second of the machine falls on both (whole runs taking turns read the same
code 3.4-7.1 ms from one run to the next: too coarse for a 10 % difference). P3b: both
revisions' own P3 run whole as subprocesses, taking turns (this code, REV, ...). It prints
each run's figures, the medians and this code's ratio to REV's (P3a_vs, P3b_vs: goal <= 1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from _common import ROOT, result_line

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


async def cpu_share(seconds: float, steps_per_s: float, ranks: int = 64) -> tuple[float, float, int, int]:
    """(% of a core: the whole process, % of a core: the drawing thread alone, steps shown,
    ticks). The steps come in on a thread of their own and are counted by the Updater, as
    a live run's are: the drawing thread is the app's (the event loop's) alone."""
    steps = int(seconds * steps_per_s) + 5
    src = SyntheticSource(2, ranks, "xlarge", gpu=True, seed=5, ahead=steps, per_s=steps_per_s)
    app = DdpApp(src, fps=30)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        first = src.store.latest_complete("ddp")
        c0, t0, w0 = time.process_time(), time.thread_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, ui, wall = time.process_time() - c0, time.thread_time() - t0, time.monotonic() - w0
        last = src.store.latest_complete("ddp")
    return 100.0 * cpu / wall, 100.0 * ui / wall, last - first, app._ticks


FIGURE = re.compile(r"^(P3[ab]) \S+ \S+=([\d.]+) ", re.M)


def one_run(root: str, quick: bool) -> dict[str, float]:
    """One P3 run of the code under `root`, in a subprocess: {'P3a': ms, 'P3b': %}."""
    env = dict(os.environ, PYTHONPATH=root)
    cmd = [sys.executable, os.path.join(root, "benchmarks", "p3_drawing.py")] + (["--quick"] if quick else [])
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    got = {k: float(v) for k, v in FIGURE.findall(p.stdout)}
    if p.returncode != 0 or len(got) != 2:
        sys.exit(f"P3: the run of {root} failed ({p.returncode}): "
                 + ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1])
    return got


PACED = os.path.join(ROOT, "benchmarks", "_paced.py")


def paced_frames(trees: dict[str, str], renders: int, timeout_s: float = 120.0) -> dict[str, list[float]]:
    """P3a of several revisions frame by frame in turn: each revision's own frame loop runs in
    a process of its own (benchmarks/_paced.py), and they take turns one frame at a time,
    their order swapped every frame, so a slow second of the machine falls on all of them.
    {name: CPU ms of each frame}."""
    procs, errs = {}, {}
    try:
        for name, root in trees.items():
            env = dict(os.environ, PYTHONPATH=root)
            errs[name] = tempfile.TemporaryFile()
            procs[name] = subprocess.Popen([sys.executable, PACED, root, str(renders)], cwd=root, env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=errs[name], text=True, bufsize=1)

        def reply(name: str, last: bool = False) -> str:
            p = procs[name]
            if last:  # (the result may already sit in the pipe's reader with the last frame's line)
                timer = threading.Timer(timeout_s, p.kill)
                timer.start()
                line = p.stdout.readline()
                timer.cancel()
            else:
                ready, _, _ = select.select([p.stdout], [], [], timeout_s)
                line = p.stdout.readline() if ready else ""
            if not line:
                p.kill()
                p.wait()
                errs[name].seek(0)
                err = errs[name].read().decode(errors="replace").strip().splitlines()
                sys.exit(f"P3: the paced frames of {trees[name]} stopped: {err[-1] if err else 'no reply'}")
            return line

        order = list(trees)
        for k in range(renders):
            for name in (order if k % 2 == 0 else order[::-1]):
                try:
                    procs[name].stdin.write("go\n")
                    procs[name].stdin.flush()
                except BrokenPipeError:
                    pass  # (it ended: its reply says why)
                reply(name)
        got = {}
        for name in order:
            line = reply(name, last=True)
            if not line.startswith("result "):
                sys.exit(f"P3: the paced frames of {trees[name]} ended with: {line.strip()[:200]}")
            got[name] = json.loads(line[len("result "):])["cpu"]
            procs[name].wait(timeout=timeout_s)
        return got
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in errs.values():
            f.close()


def versus(rev: str, rounds: int, quick: bool) -> int:
    """This code and REV's: P3a frame by frame in turn, then P3b taking turns; medians and
    ratios."""
    with tempfile.TemporaryDirectory(prefix="ddptui-p3-vs-") as tmp:
        other = os.path.join(tmp, "tree")
        p = subprocess.run(["git", "worktree", "add", "--detach", other, rev], cwd=ROOT,
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"P3: cannot check out {rev}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}",
                  file=sys.stderr)
            return 2
        try:
            renders = 200 if quick else 600
            print(f"P3a: {renders} frames of each, taking turns frame by frame …", file=sys.stderr, flush=True)
            frames = paced_frames({"this": ROOT, rev: other}, renders)
            runs: dict[str, list[dict]] = {"this": [], rev: []}
            for k in range(rounds):
                for name, root in (("this", ROOT), (rev, other)):
                    got = one_run(root, quick)
                    runs[name].append(got)
                    print(f"P3 round {k + 1}/{rounds} {name}: P3a {got['P3a']:.2f} ms, P3b {got['P3b']:.1f} %", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", other], cwd=ROOT, capture_output=True)
    med = {name: {f: statistics.median(r[f] for r in rs) for f in ("P3a", "P3b")} for name, rs in runs.items()}
    print(f"P3 medians over {rounds} turns each: this code P3a {med['this']['P3a']:.2f} ms, P3b {med['this']['P3b']:.1f} %; "
          f"{rev}: P3a {med[rev]['P3a']:.2f} ms, P3b {med[rev]['P3b']:.1f} % (P3a of whole runs: a guide only)")
    mine, theirs = frames["this"], frames[rev]
    pairs = sorted(a / b for a, b in zip(mine, theirs) if b > 0)
    print(f"P3a frame by frame, {len(mine)} frames each in turn: this code median {statistics.median(mine):.2f} ms, "
          f"{rev} {statistics.median(theirs):.2f} ms; frame ratios p25 {pairs[len(pairs) // 4]:.2f}, "
          f"median {statistics.median(pairs):.2f}, p75 {pairs[3 * len(pairs) // 4]:.2f}")
    print(result_line("P3a_vs", "frame_ratio", rev, statistics.median(mine) / statistics.median(theirs), "<=", 1.0,
                      "{:.2f}"))
    print(result_line("P3b_vs", "cpu_ratio", rev, med["this"]["P3b"] / med[rev]["P3b"], "<=", 1.0, "{:.2f}"))
    print(result_line("P3b", "cpu_pct", "share", med["this"]["P3b"], "<=", GOAL_CPU_PCT, "{:.1f}"))
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description="P3: UI drawing cost")
    p.add_argument("--quick", action="store_true", help="short run for CI")
    p.add_argument("--steps-per-s", type=float, default=5.0, help="(b) new steps per second (default 5)")
    p.add_argument("--ranks", type=int, default=64,
                   help="(b) ranks (default 64; past what fits, the panes draw aggregated lanes)")
    p.add_argument("--vs", metavar="REV", help="also measure git revision REV's code, taking turns (see the docstring)")
    p.add_argument("--rounds", type=int, default=3, help="with --vs: turns of each (default 3)")
    a = p.parse_args()
    if a.vs:
        if a.rounds < 1:
            sys.exit("P3: --rounds must be at least 1")
        sys.exit(versus(a.vs, a.rounds, a.quick))
    renders = 60 if a.quick else 300
    seconds = 2.0 if a.quick else 5.0

    cpu, wall = asyncio.run(frame_times(renders))
    med = statistics.median(cpu)
    print(f"P3a full frame, 200x50, naive + ddp x 8 ranks, uncached, {renders} renders: "
          f"median {med:.2f} ms CPU (p90 {sorted(cpu)[int(len(cpu) * 0.9)]:.2f}), "
          f"median {statistics.median(wall):.2f} ms wall")
    print(result_line("P3a", "frame_ms", "median", med, "<=", GOAL_FRAME_MS, "{:.2f}"))

    pct, ui, steps, ticks = asyncio.run(cpu_share(seconds, a.steps_per_s, a.ranks))
    print(f"P3b app at 30 fps, {a.ranks} ranks, {a.steps_per_s:g} new steps/s: {pct:.1f} % of one core "
          f"over {seconds:g} s, the drawing thread {ui:.1f} %, taking the steps in and their figures "
          f"{pct - ui:.1f} % ({steps} steps shown, {ticks} ticks)")
    print(result_line("P3b", "cpu_pct", "share", pct, "<=", GOAL_CPU_PCT, "{:.1f}"))
    print(result_line("P3c", "draw_pct", f"ranks_{a.ranks}", ui, "<=", GOAL_CPU_PCT, "{:.1f}"))


if __name__ == "__main__":
    main()
