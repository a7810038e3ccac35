"""Shared bits of the benchmark scripts (not a benchmark itself)."""
from __future__ import annotations

import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def env_for_ranks(threads: int = 1) -> dict:
    """Environment for torchrun children: this checkout importable, one torch thread per rank."""
    env = os.environ.copy()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    return env


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def result_line(bench: str, name: str, key: str, value: float, op: str, goal: float,
                fmt: str = "{:.3f}") -> str:
    """The last line every benchmark prints, e.g. 'P1 overhead median_ratio=1.012 goal<=1.03 OK'."""
    ok = value <= goal if op == "<=" else value >= goal
    return f"{bench} {name} {key}={fmt.format(value)} goal{op}{goal:g} {'OK' if ok else 'MISS'}"
