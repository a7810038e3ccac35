#!/usr/bin/env python
"""What `ddptui attach` costs the job it watches: the job's step time with and without ddptui
attached, in turns, in one run.

    python benchmarks/attach_cost.py [--quick] [--phase-s S] [--pairs N] [--interval S] [--vs-fixed] [--vs-code DIR]

Two jobs, one after the other (benchmarks/_attach_job.py: plain DDP on gloo, 2 ranks under
torchrun, PyTorch's debug server started as a user starts it, steps back to back): a host-bound
one (4 Linear layers of 256, batch 32: a few ms a step) and one of ~100 ms steps (width 2048).
For each, one `ddptui attach --headless --no-record` (its default poll rates unless --interval)
runs from the start, paused (SIGSTOP) outside its phases, so that no phase holds its start-up;
phases of S seconds (default 5) alternate detached (paused) and attached (running), in rounds
(default 8; the order turns each round: off-on, on-off, ...): a 2-rank job on 2 cores switches
between speeds for seconds at a time whatever runs beside it, so many short phases. With
--vs-fixed, a second attach polling at --interval throughout (`--idle-interval` the same, as
attach did before it polled a healthy job less often) takes a third phase in each round (the
policy before and after, in the same run). With --vs-code DIR, the attach of another checkout
(DIR: e.g. `git worktree add --detach DIR REV`; its ddptui first on PYTHONPATH) takes a phase
in each round too: old and new code beside each other in the same rounds. A phase starts as its attach resumes, whose first
poll is then due: a phase holds one poll more than its length at the attach's pace would
(its cost counted high). Figures per job: the median over rounds of (median step time attached
/ detached), the job's ranks' CPU time a second attached and detached (what serving the debug
server costs them: each poll makes every rank dump its Flight Recorder buffer as JSON), and
the attach process's own CPU share. On 2 cores the attach process shares the job's cores (no
core of its own to pin it to): its CPU is printed beside the figure.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, env_for_ranks, free_port, result_line, stop_group

import psutil

JOB = os.path.join(ROOT, "benchmarks", "_attach_job.py")
GOAL = 1.01


def _tree_cpu(p: psutil.Process) -> float:
    """CPU seconds of a process and its children (the ranks under torchrun)."""
    total = 0.0
    for q in [p] + p.children(recursive=True):
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def one_job(name: str, width: int, phase_s: float, pairs: int, interval: float | None, tmp: str,
            vs_fixed: bool = False, vs_code: str | None = None) -> dict:
    d = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)
    ready, times = os.path.join(d, "ready"), os.path.join(d, "times.txt")
    port = free_port()
    env = env_for_ranks(1)
    env["TORCH_FR_BUFFER_SIZE"] = "2000"
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                            "--master-addr=127.0.0.1", f"--master-port={port}", JOB, "--ready", ready,
                            "--times", times, "--width", str(width)],
                           stdout=open(os.path.join(d, "job.log"), "w"), stderr=subprocess.STDOUT,
                           start_new_session=True, env=env)
    phases: list[tuple[str, int, int, float, float]] = []  # (on/off, start ns, end ns, job cpu s, attach cpu s)
    atts: dict[str, subprocess.Popen] = {}
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(ready):
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the job did not start: " + open(os.path.join(d, "job.log")).read()[-2000:])
            time.sleep(0.2)
        jp = psutil.Process(job.pid)
        kinds = ["off", "on"] + (["fixed"] if vs_fixed else []) + (["vs"] if vs_code else [])
        # one attach process a kind for the whole job, paused (SIGSTOP) outside its phases: no
        # start-up in any phase, so phases can be short and many (a 2-rank job on 2 cores
        # switches between speeds for seconds at a time, whatever runs beside it)
        for kind in kinds[1:]:
            cmd = [sys.executable, "-m", "ddptui", "attach", f"127.0.0.1:{port}", "--headless", "--no-record"]
            if interval:
                cmd += ["--interval", str(interval)]
            if kind == "fixed":  # (every poll at --interval, at the job's priority: as before)
                cmd += ["--idle-interval", str(interval or 1.0), "--nice", "0"]
            aenv = env_for_ranks(1)
            if kind == "vs":  # (the other checkout's ddptui, found first)
                aenv["PYTHONPATH"] = os.pathsep.join(x for x in (os.path.abspath(vs_code), aenv.get("PYTHONPATH")) if x)
            atts[kind] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d,
                                          env=aenv)
        time.sleep(8.0)  # (each attached, its first polls made)
        for att in atts.values():
            att.send_signal(signal.SIGSTOP)
        order = []
        for k in range(pairs):  # (each round its kinds turned by one: off-on, on-off; off-on-fixed, on-fixed-off, ...)
            order += kinds[k % len(kinds):] + kinds[:k % len(kinds)]
        for kind in order:
            att = atts.get(kind)
            if att is not None:
                att.send_signal(signal.SIGCONT)
            ap = psutil.Process(att.pid) if att is not None else None
            c0, t0 = _tree_cpu(jp), time.monotonic_ns()
            a0 = _tree_cpu(ap) if ap is not None else 0.0
            time.sleep(phase_s)
            c1, t1 = _tree_cpu(jp), time.monotonic_ns()
            a1 = _tree_cpu(ap) if ap is not None else 0.0
            if att is not None:
                att.send_signal(signal.SIGSTOP)
            phases.append((kind, t0, t1, c1 - c0, a1 - a0))
    finally:  # (however the run ends: no attach left paused, the job stopped)
        try:
            for att in atts.values():
                if att.poll() is None:
                    att.send_signal(signal.SIGCONT)
                    att.send_signal(signal.SIGTERM)  # (not SIGINT: a shell's background job ignores it)
            for att in atts.values():
                try:
                    att.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    att.kill()
                    att.wait()
        finally:
            stop_group(job)
    steps = []
    with open(times) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                steps.append((int(parts[0]), int(parts[1]) / 1e6))
    med = []
    for kind, t0, t1, cpu, acpu in phases:
        got = [ms for end, ms in steps if t0 <= end <= t1]
        med.append((kind, statistics.median(got) if got else float("nan"), len(got), cpu / ((t1 - t0) / 1e9),
                    acpu / ((t1 - t0) / 1e9)))
    n = len(kinds)
    ratios: dict[str, list[float]] = {k: [] for k in kinds[1:]}
    for i in range(0, len(med) - n + 1, n):
        got = {m[0]: m[1] for m in med[i:i + n]}
        for k in ratios:
            ratios[k].append(got[k] / got["off"])
    cpu = {k: statistics.median(m[3] for m in med if m[0] == k) for k in kinds}
    att = {k: statistics.median(m[4] for m in med if m[0] == k) for k in kinds[1:]}
    return {"name": name, "phases": med, "ratios": ratios["on"], "ratio": statistics.median(ratios["on"]),
            "fixed_ratios": ratios.get("fixed", []),
            "fixed_ratio": statistics.median(ratios["fixed"]) if "fixed" in ratios else None,
            "job_cpu_on": cpu["on"], "job_cpu_off": cpu["off"], "attach_cpu": att["on"],
            "job_cpu_fixed": cpu.get("fixed"), "attach_cpu_fixed": att.get("fixed"),
            "vs_ratios": ratios.get("vs", []),
            "vs_ratio": statistics.median(ratios["vs"]) if "vs" in ratios else None,
            "job_cpu_vs": cpu.get("vs"), "attach_cpu_vs": att.get("vs"),
            "step_off": statistics.median(m[1] for m in med if m[0] == "off")}


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the cleanup runs: no attach left paused)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one pair of 4 s phases, the host-bound job only")
    p.add_argument("--phase-s", type=float, default=None, help="seconds a phase (default 5)")
    p.add_argument("--pairs", type=int, default=None, help="rounds of phases a job (default 8)")
    p.add_argument("--interval", type=float, default=None, help="attach's --interval (default: its own, 1 s)")
    p.add_argument("--vs-fixed", action="store_true",
                   help="a third kind of phase in each round: attached polling at --interval throughout "
                        "(--idle-interval the same), as attach did before it polled a healthy job less often")
    p.add_argument("--vs-code", metavar="DIR",
                   help="another checkout whose attach takes a phase in each round too (its ddptui first on "
                        "PYTHONPATH; make one with `git worktree add --detach DIR REV`)")
    a = p.parse_args(argv)
    if a.vs_code and not os.path.isfile(os.path.join(a.vs_code, "ddptui", "__init__.py")):
        p.error(f"--vs-code {a.vs_code}: no ddptui checkout there")
    phase_s = a.phase_s or (3.0 if a.quick else 5.0)
    pairs = a.pairs or (1 if a.quick else 8)
    jobs = [("host-bound", 256)] if a.quick else [("host-bound", 256), ("100ms", 2048)]
    with tempfile.TemporaryDirectory(prefix="ddptui-attach-cost-") as tmp:
        results = [one_job(n, w, phase_s, pairs, a.interval, tmp, a.vs_fixed, a.vs_code) for n, w in jobs]
    for r in results:
        print(f"{r['name']} job: detached step median {r['step_off']:.2f} ms; per pair attached/detached "
              + " ".join(f"{x:.3f}" for x in r["ratios"]) + f"; median {r['ratio']:.3f}")
        print(f"  the job's ranks' CPU: {r['job_cpu_on'] * 100:.0f} % of a core attached, "
              f"{r['job_cpu_off'] * 100:.0f} % detached (serving the debug server: "
              f"{(r['job_cpu_on'] - r['job_cpu_off']) * 100:+.1f} points); the attach process "
              f"{r['attach_cpu'] * 100:.1f} % of a core")
        if r["fixed_ratio"] is not None:
            print(f"  polling at --interval throughout, in the same rounds: attached/detached "
                  + " ".join(f"{x:.3f}" for x in r["fixed_ratios"]) + f"; median {r['fixed_ratio']:.3f}; the job's "
                  f"ranks' CPU {r['job_cpu_fixed'] * 100:.0f} %, the attach process {r['attach_cpu_fixed'] * 100:.1f} %")
        if r["vs_ratio"] is not None:
            print(f"  {a.vs_code}'s attach, in the same rounds: attached/detached "
                  + " ".join(f"{x:.3f}" for x in r["vs_ratios"]) + f"; median {r['vs_ratio']:.3f}; the job's "
                  f"ranks' CPU {r['job_cpu_vs'] * 100:.0f} %, the attach process {r['attach_cpu_vs'] * 100:.1f} %")
        for kind, ms, n, cpu, acpu in r["phases"]:
            print(f"    {kind:>5}: {n} steps, median {ms:.2f} ms, job CPU {cpu * 100:.0f} %, attach {acpu * 100:.1f} %")
    host = results[0]
    line = result_line("P12", "attach_cost", "step_ratio", host["ratio"], "<=", GOAL, "{:.3f}")
    print(line.replace(" OK", " SMOKE").replace(" MISS", " SMOKE") if a.quick else line)  # (one round: a smoke test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
