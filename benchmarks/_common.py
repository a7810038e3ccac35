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


def free_port() -> int:
    """A TCP port free on the loopback now (for a job's master port)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stop_group(proc, grace: float = 15.0) -> None:
    """End a process started with start_new_session=True and everything it started: SIGTERM to
    its group, then SIGKILL after `grace` seconds."""
    import os
    import signal
    import subprocess
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
