#!/usr/bin/env python
"""P10: a slow rank named from per-layer evidence, through the noise of ranks sharing cores.

Real runs (torchrun, 2 CPU ranks on gloo, default global batch 1024, naive and DDP in the
same run), each recorded, then every recording analysed offline with the analysis the app
uses (ddptui/model/evidence.py through the Store's who-waits entries):

    slow    medium, --slow-rank 1:40:fc2     share of 20-step windows that name rank 1 and
                                             fc2 backward, and the excess they name
    quiet   medium and small, no delay       share of 20-step windows that name anyone

Windows slide one step at a time over the steps after the first (warm-up): a run of N steps
gives N - 20 windows per strategy (they overlap; the count side by side, windows that do not
overlap, is printed too). Arrival order and waits (what the app showed before) are printed
for comparison. Figures end with lines such as `P10a named_pct=100.0 goal>=95 OK`.

    .venv/bin/python benchmarks/p10_stragglers.py                 # record and analyse (~10 min here)
    .venv/bin/python benchmarks/p10_stragglers.py --from DIR      # analyse DIR's recordings again
    .venv/bin/python benchmarks/p10_stragglers.py --quick         # synthetic recordings (seconds)

The runs take turns with whatever else the machine does: the load average is printed
before and after, with the step times' spread.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from _common import ROOT, env_for_ranks, median, result_line

from ddptui.model import evidence
from ddptui.recording.loader import load
from ranks.recfile import RecordWriter
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun
from ranks import frames

SLOW = (1, 40.0, "fc2")
RUNS = [  # name, model, slow, steps (full run)
    ("medium-slow", "medium", True, 80),
    ("medium-quiet", "medium", False, 120),
    ("small-quiet", "small", False, 120),
]


def record(path: str, model: str, slow: bool, steps: int) -> float:
    cmd = [sys.executable, "-m", "ddptui", "--headless", "--gpus", "2", "--model", model,
           "--strategies", "naive,ddp", "--steps", str(steps), "--record", path]
    if slow:
        cmd += ["--slow-rank", f"{SLOW[0]}:{SLOW[1]:g}:{SLOW[2]}"]
    t = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env_for_ranks(), capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"P10: the run of {os.path.basename(path)} failed ({p.returncode}): "
                 + (p.stderr.strip().splitlines() or ["no output"])[-1])
    return time.monotonic() - t


def record_synthetic(path: str, model: str, slow: bool, steps: int) -> float:
    """What --quick analyses: a synthetic run with the same shape of noise (a random rank's
    random layer 10-90 ms late in half of the steps)."""
    layer = ["fc1", "fc2", "fc3", "fc4", "fc5"].index(SLOW[2])
    run = SyntheticRun(model, 2, ("naive", "ddp"), seed=7, slow=(SLOW[0], layer, SLOW[1]) if slow else None,
                       late=(0.5, 10.0, 90.0))
    head = run.header_frames()
    hello = frames.to_dict(head[0])
    w = RecordWriter(path, {k: hello.get(k) for k in ("world", "model", "layers", "params", "strategies",
                                                      "batch", "bucket_cap_mb")})
    for f in head:
        w.write(f)
    for k in range(steps):
        for f in run.step_frames(k):
            w.write(f)
    w.close()
    return 0.0


def analyse(path: str) -> dict:
    """strategy -> per-window verdicts and the arrival figures, from a recording."""
    store = Store(keep_steps=100_000)
    load(path, store)
    names = list(store.meta.layers)
    out = {}
    for s in store.strategies():
        waits = store.recent_waits(s, None, 10**9)
        rows = [(w.step, w.flat, w.excess) for w in waits if w.ref]
        verdicts = [evidence.judge(win) for win in evidence.windows(rows)]
        figs = store.recent_figures(s, None, 10**9, since=1)
        summ = store.summary(s)
        out[s] = {"verdicts": verdicts, "names": names, "steps": len(rows),
                  "step_ms": [f.step_ms for f in figs], "stragglers": summ["stragglers"]}
    return out


def pct(a: int, b: int) -> float:
    return 100.0 * a / b if b else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P10: stragglers named from per-layer evidence (see the docstring)")
    p.add_argument("--quick", action="store_true", help="synthetic recordings instead of real runs (seconds)")
    p.add_argument("--from", dest="src", metavar="DIR", help="analyse the recordings already in DIR")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="where the recordings go (default runs/p10; --quick: a temporary folder)")
    p.add_argument("--steps", type=int, default=None, help="steps of every run (default 80 slow, 120 quiet)")
    a = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="p10-") if a.quick and not (a.src or a.out) else None
    where = a.src or a.out or (tmp.name if tmp else os.path.join(ROOT, "runs", "p10"))
    if a.src and not os.path.isdir(a.src):
        print(f"P10: {a.src}: no such folder", file=sys.stderr)
        return 2
    if a.steps is not None and a.steps < 22:
        print("P10: --steps must be at least 22 (one 20-step window after the warm-up step)", file=sys.stderr)
        return 2
    os.makedirs(where, exist_ok=True)
    print(f"P10 load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    results = {}
    for name, model, slow, steps in RUNS:
        path = os.path.join(where, f"{name}.ddptui")
        if not a.src:
            n = a.steps or (60 if a.quick else steps)
            took = (record_synthetic if a.quick else record)(path, model, slow, n)
            if not a.quick:
                print(f"P10 recorded {name}: {n} steps of naive and ddp in {took:.0f} s -> {path}")
        elif not os.path.exists(path):
            print(f"P10: {path}: no such recording", file=sys.stderr)
            return 2
        results[name] = (model, slow, analyse(path))
    print(f"P10 load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"P10 {'synthetic recordings (--quick)' if a.quick else 'recordings'} in {where}")

    named_pcts, excess_errs, quiet_named, quiet_total, detect = [], [], 0, 0, []
    for name, (model, slow, per) in results.items():
        for s, got in per.items():
            vs, names = got["verdicts"], got["names"]
            st = got["stragglers"]
            sm = got["step_ms"]
            q = sorted(sm)
            spread = f"step {median(sm):.0f} ms (quartiles {q[len(q) // 4]:.0f}..{q[3 * len(q) // 4]:.0f})" if q else ""
            arrival = (f"arrival: rank {st['last_arriver_rank']} last in {st['last_arriver_pct']:.0f} % of steps, "
                       f"waits " + ", ".join(f"r{r} {v:.1f}" for r, v in st["wait_ms_median"].items()) + " ms")
            print(f"P10 {name} {s}: {got['steps']} steps, {len(vs)} windows of {evidence.WINDOW} "
                  f"({got['steps'] // evidence.WINDOW} side by side), {spread}; {arrival}")
            if not vs:
                continue
            if slow:
                want = (SLOW[0], (1, names.index(SLOW[2])))
                hits = [v.culprit for v in vs if v.culprit and (v.culprit.rank, v.culprit.section) == want]
                exc = [c.excess_ms for c in hits]
                within = sum(1 for e in exc if abs(e - SLOW[1]) <= 5)
                named_pcts.append(pct(len(hits), len(vs)))
                excess_errs.append(abs(median(exc) - SLOW[1]) if exc else float("inf"))
                ev = st["evidence"] or {}
                detect.append(ev.get("detection_steps"))
                others = sorted({v.culprit.text(names) for v in vs if v.culprit} - {h.text(names) for h in hits})
                print(f"P10   rank {SLOW[0]} · {SLOW[2]} backward named in {len(hits)}/{len(vs)} windows "
                      f"({pct(len(hits), len(vs)):.1f} %); named excess median {median(exc):.1f} ms "
                      f"(min {min(exc, default=float('nan')):.1f}, max {max(exc, default=float('nan')):.1f}; "
                      f"{within} within 40 ± 5 ms); other culprits: {', '.join(others) or 'none'}; "
                      f"detected at step {ev.get('detected_step')} ({ev.get('detection_steps')} steps, "
                      f"{ev.get('detection_s')} s after onset {ev.get('onset_step')}); JSON culprit: {st['culprit']!r}")
            else:
                n = sum(1 for v in vs if v.culprit)
                quiet_named += n
                quiet_total += len(vs)
                worst = max((abs(e) for v in vs for secs in v.excess_ms.values() for e in secs.values()), default=0)
                print(f"P10   windows naming anyone: {n}/{len(vs)}"
                      + (f" ({', '.join(sorted({v.culprit.text(names) for v in vs if v.culprit}))})" if n else "")
                      + f"; largest window-median excess of any rank and section {worst:.1f} ms")
    ok = bool(named_pcts)
    # --quick judges synthetic recordings: its lines say SMOKE where a real run's say OK or MISS
    # (as P9's --quick lines do), so that no one reads them as the goal met
    smoke = (lambda line: line.rsplit(" ", 1)[0] + " SMOKE") if a.quick else (lambda line: line)  # noqa: E731
    if ok:
        print(smoke(result_line("P10a", "stragglers", "named_pct", min(named_pcts), ">=", 95.0, "{:.1f}")))
        print(smoke(result_line("P10b", "stragglers", "excess_err_ms", max(excess_errs), "<=", 5.0, "{:.1f}")))
    if quiet_total:
        print(smoke(result_line("P10c", "stragglers", "quiet_named_pct", pct(quiet_named, quiet_total), "<=", 1.0,
                                "{:.2f}")) + f" ({quiet_named} of {quiet_total} windows)")
    return 0 if ok and quiet_total else 1


if __name__ == "__main__":
    sys.exit(main())
