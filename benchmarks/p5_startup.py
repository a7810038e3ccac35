#!/usr/bin/env python
"""P5 — start-up: from the command to the first complete step in the store (CPU, 2 ranks).

Measured on the real command, `ddptui --headless --gpus 2 --model small --steps 1
--no-record`: the wall time from spawning it to its stderr line "first step done after X s"
(X, the app's own figure from LiveRun.start(), is printed too). Reference, alternating with
it in the same run: bare torchrun starting 2 trivial workers that import torch, join a gloo
process group and pass a barrier (the floor of any torchrun-based start). Medians of several
runs. Goal: <= 6 s.

    python benchmarks/p5_startup.py            # 5 runs of each
    python benchmarks/p5_startup.py --quick    # 1 run of each, naive alone (CI: that it runs)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from _common import ROOT, env_for_ranks, median, result_line

GOAL_S = 6.0
FIRST = re.compile(r"first step done after ([0-9.]+) s")

TRIVIAL = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    print("READY", flush=True)
dist.destroy_process_group()
"""


def ddptui_cmd(quick: bool = False) -> list[str]:
    # --quick (CI: that it runs): naive alone, without DDP's first construction (it imports
    # torch._dynamo, ~2 s of CPU per rank), which the figure includes
    return [sys.executable, "-m", "ddptui.cli.main", "--headless", "--gpus", "2", "--model", "small",
            "--steps", "1", "--no-record", *(["--strategies", "naive"] if quick else [])]


def time_to_line(cmd: list[str], pattern, stream: str, env: dict, timeout: float = 120.0):
    """Spawn cmd; seconds until a line of `stream` matches; (seconds, match, rc)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, text=True,
                         stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                         stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL)
    pipe = p.stdout if stream == "stdout" else p.stderr
    got, m, lines = None, None, []
    try:
        for line in pipe:
            lines.append(line)
            m = pattern.search(line) if hasattr(pattern, "search") else (pattern in line or None)
            if m:
                got = time.monotonic() - t0
                break
        for line in pipe:  # drain until it exits
            lines.append(line)
        rc = p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    if got is None:
        sys.stderr.write("P5: no start-up line from: " + " ".join(cmd[1:4]) + "\n  "
                         + "  ".join(lines[-8:]))
    return got, m, rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P5: command to first complete step")
    p.add_argument("--quick", action="store_true", help="1 run of each, naive alone (CI: that it runs, not the figure)")
    p.add_argument("--runs", type=int, default=None)
    a = p.parse_args(argv)
    runs = a.runs or (1 if a.quick else 5)
    env = env_for_ranks(1)
    app, inner, ref = [], [], []
    with tempfile.TemporaryDirectory(prefix="ddptui-p5-") as tmp:
        worker = os.path.join(tmp, "trivial_worker.py")
        with open(worker, "w") as f:
            f.write(TRIVIAL)
        bare = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", worker]
        for i in range(runs):
            order = ("app", "ref") if i % 2 == 0 else ("ref", "app")
            for what in order:
                if what == "app":
                    s, m, rc = time_to_line(ddptui_cmd(a.quick), FIRST, "stderr", env)
                    if s is None or rc != 0:
                        print(f"P5 startup first_step_s=nan goal<={GOAL_S:g} MISS")
                        return 1
                    app.append(s)
                    inner.append(float(m.group(1)))
                else:
                    s, _, rc = time_to_line(bare, "READY", "stdout", env)
                    if s is None or rc != 0:
                        print("P5: bare torchrun failed", file=sys.stderr)
                        return 1
                    ref.append(s)
    t = median(app)
    print(f"P5 start-up, 2 CPU ranks, {runs} runs of each, alternating:")
    print(f"  ddptui --headless ... --steps 1: command to 'first step done' median {t:.2f} s "
          f"({', '.join(f'{x:.2f}' for x in app)}); the app's own figure (from LiveRun.start) "
          f"median {median(inner):.2f} s")
    print(f"  bare torchrun, 2 trivial workers (import torch, gloo group, barrier): median "
          f"{median(ref):.2f} s ({', '.join(f'{x:.2f}' for x in ref)})")
    print(f"  ddptui's own share: {t - median(ref):.2f} s on top of torchrun "
          f"({t / median(ref):.2f}× the bare start)")
    print(result_line("P5", "startup", "first_step_s", t, "<=", GOAL_S, "{:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
