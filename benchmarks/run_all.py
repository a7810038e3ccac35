#!/usr/bin/env python
"""Run every benchmark and print one table: benchmark, figure, goal, status.

    python benchmarks/run_all.py            # full runs (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick    # short versions, for CI (well under 2 minutes)
    python benchmarks/run_all.py --only P2,P4
    python benchmarks/run_all.py --only P2,P11 --vs c0bbed7 --args P11=--ui
                                            # each figure beside revision c0bbed7's, measured
                                            # in turn in the same run (--rounds, default 2)

--vs REV checks REV out into a temporary git worktree and runs each benchmark of this checkout
and of REV in turns (this, REV, then REV, this, ...: each in a process of its own, importing its
own tree's code), so that a figure that moved is seen as the code's or the machine's the day it
moves: the table gives each figure's median over the rounds for both and this code's ratio to
REV's. A benchmark REV does not have is said so.

Each benchmark is a script here that ends with figure lines such as
`P1 overhead median_ratio=1.012 goal<=1.03 OK`; they run one after the other (never in
parallel: they would measure each other). Exit status 1 if a benchmark failed to produce
its figure; a figure that misses its goal is reported (MISS; a --quick run of a benchmark that
only smoke-tests says SMOKE) but is not a failure of the run
unless --strict.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = [
    ("P1", "p1_overhead.py", "instrumentation overhead (step time ratio)"),
    ("P2", "p2_ingest.py", "collector ingest rate"),
    ("P3", "p3_drawing.py", "timeline drawing"),
    ("P4", "p4_replay.py", "replay open+index, bytes per span"),
    ("P5", "p5_startup.py", "command to first step"),
    ("P6", "p6_user_overhead.py", "ddptui.instrument overhead (transformer example)"),
    ("P7", "p7_hook_cost.py", "host cost of the CUDA hook path per layer (stand-ins)"),
    ("P8", "p8_trace_import.py", "torch.profiler traces opened: RSS and MB/s (--quick: 32 MB)"),
    ("P9", "p9_whatif.py", "what-if predictions vs measurement (bucket caps)"),
    ("P10", "p10_stragglers.py", "stragglers named from per-layer evidence"),
    ("P11", "p11_scale.py", "many ranks into the collector and store"),
    ("P12", "attach_cost.py", "what ddptui attach costs the job it watches"),
    ("P13", "p13_pipeline_whatif.py", "a pipeline's step at other microbatch counts and schedules, predicted vs measured"),
]
LINE = re.compile(r"^(P\d+)([a-z]*)\s+(\S+)\s+(\S+)=(\S+)\s+goal\s*(<=|>=|<|>|==)\s*(\S+)\s+(OK|MISS|SMOKE)\b")


def parse(output: str, tag: str) -> list[dict]:
    out = []
    for line in output.splitlines():
        m = LINE.match(line.strip())
        if m and m.group(1) == tag:  # P3a, P3b: figures of one benchmark
            out.append({"bench": m.group(1) + m.group(2), "name": m.group(3), "figure": m.group(4),
                        "value": m.group(5), "goal": f"{m.group(6)} {m.group(7)}",
                        "status": m.group(8)})
    return out


def run_one(tree: str, script: str, quick: bool, extra: list[str], timeout: float) -> tuple[str, object, float]:
    """(its output, exit status or "timeout", seconds) of one benchmark script of `tree`."""
    cmd = [sys.executable, os.path.join(tree, "benchmarks", script)] + (["--quick"] if quick else []) + extra
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=os.path.join(tree, "benchmarks"))
        output, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = "timeout"
    return output, rc, time.monotonic() - t0


def _number(value: str) -> float | None:
    """A figure's value as a number: `7.94M` is 7.94e6, `1.2k` 1200, `40%` 40."""
    scale = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
    v = value.rstrip("%s")
    mult = scale.get(v[-1:], 1.0)
    if mult != 1.0:
        v = v[:-1]
    try:
        return float(v) * mult
    except ValueError:
        return None


def versus(rev: str, rounds: int, chosen: list, quick: bool, extra: dict, timeout: float) -> int:
    """Each chosen benchmark of this checkout and of REV in turns, `rounds` times each; one
    table of medians and ratios."""
    import statistics
    import tempfile
    root = os.path.dirname(HERE)
    with tempfile.TemporaryDirectory(prefix="ddptui-vs-") as tmp:
        other = os.path.join(tmp, "tree")
        p = subprocess.run(["git", "worktree", "add", "--detach", other, rev], cwd=root,
                           capture_output=True, text=True)
        if p.returncode != 0:
            why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
            print(f"run_all: cannot check out {rev}: {why}", file=sys.stderr)
            return 2
        values: dict[tuple, dict[str, list[float]]] = {}  # (bench, name, figure) -> side -> values
        goals: dict[tuple, str] = {}
        failed, rows = False, []
        try:
            for tag, script, what in chosen:
                sides = [("this", root), (rev, other)]
                if not os.path.exists(os.path.join(other, "benchmarks", script)):
                    rows.append((f"{tag} {what}", "absent in " + rev, "", "", "", ""))
                    sides = sides[:1]
                for k in range(rounds):
                    for name, tree in (sides if k % 2 == 0 else sides[::-1]):
                        print(f"run_all: {tag} round {k + 1}/{rounds}: {name} …", file=sys.stderr, flush=True)
                        output, rc, secs = run_one(tree, script, quick, extra.get(tag, []), timeout)
                        print(f"--- {tag} ({name}, round {k + 1}) ---")
                        sys.stdout.write(output if output.endswith("\n") or not output else output + "\n")
                        got = parse(output, tag)
                        if not got or rc != 0:
                            failed = failed or name == "this"
                            print(f"run_all: {tag} ({name}) printed no figure (exit {rc}):\n"
                                  + output[-1500:], file=sys.stderr)
                        for g in got:
                            key = (g["bench"], g["name"], g["figure"])
                            v = _number(g["value"])
                            if v is not None:
                                values.setdefault(key, {}).setdefault(name, []).append(v)
                                goals[key] = g["goal"]
                            print(f"{g['bench']} {g['name']} {g['figure']}={g['value']} ({name}, round {k + 1}, {secs:.0f} s)",
                                  flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", other], cwd=root, capture_output=True)
    head = ("benchmark", "this code", rev, "ratio", "goal", "this code's rounds")
    table = [head]
    for key, by in values.items():
        mine, theirs = by.get("this", []), by.get(rev, [])
        m = statistics.median(mine) if mine else None
        t = statistics.median(theirs) if theirs else None
        ratio = f"{m / t:.3f}" if m is not None and t else "—"
        table.append((f"{key[0]} {key[1]} {key[2]}", "—" if m is None else f"{m:.4g}",
                      "—" if t is None else f"{t:.4g}", ratio, goals[key],
                      " ".join(f"{v:.4g}" for v in mine)))
    table += rows
    print()
    print(f"medians over {rounds} round(s) each, taken in turn in this run; ratio: this code / {rev}")
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run all benchmarks and print the table of figures")
    p.add_argument("--quick", action="store_true", help="short versions (CI)")
    p.add_argument("--only", default=None, help="comma-separated tags, e.g. P1,P5")
    p.add_argument("--strict", action="store_true", help="exit 1 when a figure misses its goal")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark")
    p.add_argument("--vs", metavar="REV", help="also run git revision REV's benchmarks, in turn with "
                   "this checkout's, and print each figure beside REV's (see the docstring)")
    p.add_argument("--rounds", type=int, default=2, help="with --vs: turns of each (default 2)")
    p.add_argument("--args", action="append", default=[], metavar="TAG=ARGS",
                   help="more arguments for one benchmark, e.g. P11=--ui (repeatable)")
    a = p.parse_args(argv)
    only = {t.strip().upper() for t in a.only.split(",")} if a.only else None
    if only:
        unknown = only - {t for t, _, _ in BENCHMARKS}
        if unknown:
            print(f"run_all: unknown benchmark {sorted(unknown)[0]}; choose from "
                  + ", ".join(t for t, _, _ in BENCHMARKS), file=sys.stderr)
            return 2
    extra: dict[str, list[str]] = {}
    for spec in a.args:
        tag, sep, rest = spec.partition("=")
        if not sep or tag.strip().upper() not in {t for t, _, _ in BENCHMARKS}:
            print(f"run_all: --args wants TAG=ARGS with a benchmark's tag (got {spec!r})", file=sys.stderr)
            return 2
        import shlex
        extra.setdefault(tag.strip().upper(), []).extend(shlex.split(rest))
    if a.rounds < 1:
        print("run_all: --rounds must be 1 or more", file=sys.stderr)
        return 2
    if a.vs:
        chosen = [b for b in BENCHMARKS if not only or b[0] in only]
        return versus(a.vs, a.rounds, chosen, a.quick, extra, a.timeout)
    rows, failed = [], False
    for tag, script, what in BENCHMARKS:
        if only and tag not in only:
            continue
        path = os.path.join(HERE, script)
        if not os.path.exists(path):
            rows.append({"bench": tag, "name": what, "figure": "—", "value": "", "goal": "",
                         "status": "absent", "secs": 0.0})
            continue
        print(f"run_all: {tag} {script}{' --quick' if a.quick else ''} …", file=sys.stderr, flush=True)
        output, rc, secs = run_one(os.path.dirname(HERE), script, a.quick, extra.get(tag, []), a.timeout)
        sys.stdout.write(output if output.endswith("\n") or not output else output + "\n")
        got = parse(output, tag)
        if not got:
            failed = True
            rows.append({"bench": tag, "name": what, "figure": "—", "value": "", "goal": "",
                         "status": f"FAILED (exit {rc})", "secs": secs})
        for g in got:
            g["secs"] = secs
            rows.append(g)
        if rc not in (0,) and got:
            failed = True
    print()
    head = ("benchmark", "figure", "goal", "status", "time")
    table = [head] + [(f"{r['bench']} {r['name']}", f"{r['figure']}={r['value']}" if r["value"] else r["figure"],
                       r["goal"], r["status"], f"{r['secs']:.0f} s") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    missed = any(r["status"] == "MISS" for r in rows)
    if failed:
        return 1
    return 1 if (a.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
