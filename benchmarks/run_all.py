#!/usr/bin/env python
"""Run every benchmark and print one table: benchmark, figure, goal, status.

    python benchmarks/run_all.py            # full runs (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick    # short versions, for CI (well under 2 minutes)
    python benchmarks/run_all.py --only P2,P4

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
]
LINE = re.compile(r"^(P\d+)([a-z]?)\s+(\S+)\s+(\S+)=(\S+)\s+goal\s*(<=|>=|<|>|==)\s*(\S+)\s+(OK|MISS|SMOKE)\b")


def parse(output: str, tag: str) -> list[dict]:
    out = []
    for line in output.splitlines():
        m = LINE.match(line.strip())
        if m and m.group(1) == tag:  # P3a, P3b: figures of one benchmark
            out.append({"bench": m.group(1) + m.group(2), "name": m.group(3), "figure": m.group(4),
                        "value": m.group(5), "goal": f"{m.group(6)} {m.group(7)}",
                        "status": m.group(8)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run all benchmarks and print the table of figures")
    p.add_argument("--quick", action="store_true", help="short versions (CI)")
    p.add_argument("--only", default=None, help="comma-separated tags, e.g. P1,P5")
    p.add_argument("--strict", action="store_true", help="exit 1 when a figure misses its goal")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark")
    a = p.parse_args(argv)
    only = {t.strip().upper() for t in a.only.split(",")} if a.only else None
    if only:
        unknown = only - {t for t, _, _ in BENCHMARKS}
        if unknown:
            print(f"run_all: unknown benchmark {sorted(unknown)[0]}; choose from "
                  + ", ".join(t for t, _, _ in BENCHMARKS), file=sys.stderr)
            return 2
    rows, failed = [], False
    for tag, script, what in BENCHMARKS:
        if only and tag not in only:
            continue
        path = os.path.join(HERE, script)
        if not os.path.exists(path):
            rows.append({"bench": tag, "name": what, "figure": "—", "value": "", "goal": "",
                         "status": "absent", "secs": 0.0})
            continue
        cmd = [sys.executable, path] + (["--quick"] if a.quick else [])
        print(f"run_all: {tag} {script}{' --quick' if a.quick else ''} …", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=HERE)
            output, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        secs = time.monotonic() - t0
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
