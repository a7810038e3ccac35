#!/usr/bin/env python
"""P13 — a pipeline's step at other microbatch counts and schedules, predicted from two
recorded runs (`ddptui whatif A --and B`), checked against runs at those settings.

Real torchrun, 2 CPU ranks on gloo, examples/train_pipeline.py under `ddptui run --auto`
(2 stages, the same global batch of 256): 1F1B at 4 and at 8 microbatches (the model's
inputs: each stage's forward and backward of a microbatch, fitted as a fixed cost plus a
part in proportion to its size), then 1F1B at 16, GPipe at 8 and interleaved 1F1B at 8 (two
stages a rank: the same blocks a rank, stages 0 and 2 on rank 0) (the checks). The figure:
the largest |predicted - measured| / measured of the three checks' median step (goal <= 10 %).

    python benchmarks/p13_pipeline_whatif.py            # 20 steps a run (~3 minutes here)
    python benchmarks/p13_pipeline_whatif.py --quick    # a smoke test: 6 steps a run (SMOKE)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _common import ROOT, env_for_ranks, result_line

RUNS = {"in4": ("1f1b", 4), "in8": ("1f1b", 8), "check16": ("1f1b", 16), "gpipe8": ("gpipe", 8),
        "inter8": ("interleaved1f1b", 8)}
CHECKS = ("check16", "gpipe8", "inter8")


def record(out: str, schedule: str, m: int, steps: int) -> float:
    """Run one configuration; its median step (ms, the JSON's)."""
    rec, js = os.path.join(out, f"{schedule}{m}.ddptui"), os.path.join(out, f"{schedule}{m}.json")
    cmd = [sys.executable, "-m", "ddptui", "run", "--auto", "--headless", "--nproc-per-node", "2", "--record", rec,
           "--json", js, "--", os.path.join(ROOT, "examples", "train_pipeline.py"), "--schedule", schedule,
           "--microbatches", str(m), "--steps", str(steps)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env_for_ranks(), cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"P13: the run of {schedule} × {m} failed:\n{p.stderr[-2000:]}")
    with open(js) as f:
        return json.load(f)["strategies"][0]["step_ms_median"]


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--quick", action="store_true")
    a.add_argument("--steps", type=int, default=None)
    args = a.parse_args()
    steps = args.steps or (6 if args.quick else 20)
    with tempfile.TemporaryDirectory() as out:
        measured = {}
        for key, (sched, m) in RUNS.items():
            measured[key] = record(out, sched, m, steps)
            print(f"  measured {sched:>15} × {m:>2} microbatches: {measured[key]:8.1f} ms", flush=True)
        p = subprocess.run([sys.executable, "-m", "ddptui", "whatif", os.path.join(out, "1f1b4.ddptui"), "--and",
                            os.path.join(out, "1f1b8.ddptui"), "--microbatches", "8,16", "--schedule",
                            "gpipe,1f1b,interleaved1f1b", "--json", "-"],
                           capture_output=True, text=True, timeout=120, env=env_for_ranks(), cwd=ROOT)
        if p.returncode != 0:
            sys.exit(f"P13: whatif failed:\n{p.stderr[-2000:]}")
        doc = json.loads(p.stdout)
    pred = {(r["schedule"], r["microbatches"]): r["step_ms"] for r in doc["predictions"]}
    at = doc["at_recorded"]
    cal = at["calibration"]
    print(f"  the model at 1f1b × 4: {at['step_ms']:.1f} ms ({at['error_pct']:+.1f} %; calibrated: "
          f"{cal['per_action_ms']:+.2f} ms an action, {cal['step_ms']:+.1f} ms a step); at 1f1b × 8 (the second "
          f"input): {doc['at_other']['error_pct']:+.1f} %")
    errs = []
    for key in CHECKS:
        sched, m = RUNS[key]
        got, want = pred[(sched, m)], measured[key]
        err = 100.0 * (got - want) / want
        errs.append(abs(err))
        print(f"  predicted {sched:>15} × {m:>2}: {got:8.1f} ms against {want:8.1f} measured ({err:+.1f} %)")
    line = result_line("P13", "pipeline_whatif", "worst_step_err_pct", max(errs), "<=", 10.0, "{:.1f}")
    print(line.replace(" OK", " SMOKE").replace(" MISS", " SMOKE") if args.quick else line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
