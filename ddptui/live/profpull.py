"""A few seconds of torch.profiler from every rank of an attached job, written as a traces
directory that `ddptui replay DIR` opens (recording/kineto.py).

Each rank's debug server answers ``torch_profile?duration=S`` with S seconds of torch.profiler
on all its threads, as a Chrome trace; every rank is asked at once, so the windows overlap.
The first window a rank's server takes can come back with no record at all (the profiler
set up on another thread than the one that runs it): such a rank is asked once more.

Such a window has no ``ProfilerStep#N`` records (nothing called `prof.step()`): the steps are
made here, from the training loop's own records, and added to each trace as ProfilerStep
ranges (their args say so) on the thread that ran them: step k ends where the k-th
``Optimizer.step#`` range ends and starts at the ``DistributedDataParallel.forward`` before it
(else where the step before ended); the step cut short at the window's start is left out.
Ranks' steps are matched by time (the hosts' clocks): rank r's step whose end is nearest the
lowest rank's k-th end, within half a step, is step k; only the steps every rank has are
kept. Without any Optimizer.step record the whole window is one step, on the thread with the
most operators. The profile records no Python stacks (`with_stack` off): no module records,
so the replay draws each step's compute as one layer, 'model' (said in `notes`).

Files: ``rank<r>.json`` in `out_dir`; `Pulled` says what was written, what failed, and why.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from . import debugserver

STEP_NOTE = "ddptui: a step made from the training loop's Optimizer.step (the debug server's window has no ProfilerStep)"


@dataclass
class Pulled:
    path: str
    seconds: float
    ranks: list[int] = field(default_factory=list)  # ranks whose trace was written
    failed: dict[int, str] = field(default_factory=dict)  # rank -> why not
    steps: int = 0
    notes: list[str] = field(default_factory=list)
    refused: str = ""  # why none was asked for

    @property
    def ok(self) -> bool:
        return bool(self.ranks) and self.steps > 0

    def lines(self) -> list[str]:
        if self.refused:
            return [f"profile {self.refused}"]
        out = []
        if self.ok:
            out.append(f"profile: {self.seconds:g} s of torch.profiler from {len(self.ranks)} rank(s), "
                       f"{self.steps} step(s), written to {self.path} (ddptui replay {self.path})")
        elif self.ranks:
            out.append(f"profile: {len(self.ranks)} rank(s)' traces written to {self.path}, but no step "
                       f"every rank has (ddptui replay cannot draw it)")
        else:
            out.append("profile: no rank's torch.profiler window could be taken")
        out += [f"profile: rank {r}: {why}" for r, why in sorted(self.failed.items())]
        out += [f"profile: {n}" for n in self.notes]
        return out


def default_dir(record: str | None) -> str:
    """Beside the recording (its name, '-profile-' and the time), else in ./runs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if record:
        base = record[:-len(".ddptui")] if record.endswith(".ddptui") else record
        return f"{base}-profile-{stamp}"
    return os.path.join("runs", f"{stamp}-attach-profile")


def _has_ops(trace) -> bool:
    return isinstance(trace, dict) and any(isinstance(e, dict) and e.get("cat") == "cpu_op"
                                           for e in trace.get("traceEvents") or ())


def pull(servers: dict[int, tuple[str, int]], seconds: float, out_dir: str, *, timeout: float = 3.0,
         cap: int = 256 << 20) -> Pulled:
    """Ask every rank for `seconds` of torch.profiler and write the traces (module docstring)."""
    got = Pulled(out_dir, seconds)
    traces: dict[int, dict] = {}

    def one(r: int):
        host, port = servers[r]
        for attempt in (0, 1):
            reply = debugserver.post(host, port, "torch_profile", {"duration": f"{seconds:g}"},
                                     timeout=seconds + timeout, cap=cap, deadline=seconds + 3 * timeout)
            doc, why = debugserver.json_of(reply)
            if doc is None:
                return None, why
            if _has_ops(doc):
                return doc, ""
        return None, "its profile holds no record, twice (its profiler recorded nothing)"

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(servers)))) as pool:
        futs = {r: pool.submit(one, r) for r in sorted(servers)}
        for r, f in futs.items():
            doc, why = f.result()
            if doc is None:
                got.failed[r] = why
            else:
                traces[r] = doc
    if not traces:
        return got
    got.steps, notes = add_steps(traces)
    got.notes += notes
    if not any(isinstance(e, dict) and e.get("cat") == "python_function" and str(e.get("name", "")).startswith("nn.Module: ")
               for t in traces.values() for e in t.get("traceEvents") or ()):
        got.notes.append("no module records (the debug server's torch_profile records no Python stacks): "
                         "the replay draws each step's compute as one layer, 'model'")
    try:
        os.makedirs(out_dir, exist_ok=True)
        for r, t in sorted(traces.items()):
            with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
                json.dump(t, f)
            got.ranks.append(r)
    except OSError as e:
        got.failed.update({r: f"not written ({e.strerror or e})" for r in traces if r not in got.ranks})
    return got


def _abs_us(trace: dict, ts) -> float:
    """An event's time on the host's clock (µs): its ts after the trace's base time."""
    base = trace.get("baseTimeNanoseconds")
    return float(ts) + (base / 1000 if isinstance(base, (int, float)) else 0.0)


def _rank_steps(trace: dict) -> tuple[list[tuple[float, float, object, object]], str]:
    """[(start µs, end µs, pid, tid)] of a trace's whole steps (module docstring), and how
    they were found ('optimizer' or 'window')."""
    evs = [e for e in trace.get("traceEvents") or () if isinstance(e, dict) and e.get("ph") == "X"
           and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    opt = sorted((e["ts"], e["ts"] + e["dur"], e.get("pid"), e.get("tid")) for e in evs
                 if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Optimizer.step#"))
    if opt:
        fwd = sorted((e["ts"], e.get("tid")) for e in evs
                     if str(e.get("name", "")).startswith("DistributedDataParallel.forward"))
        out = []
        for i, (t0, t1, pid, tid) in enumerate(opt):
            prev = opt[i - 1][1] if i else None
            starts = [t for t, th in fwd if th == tid and t < t0 and (prev is None or t >= prev)]
            start = starts[-1] if starts else prev
            if start is not None:
                out.append((start, t1, pid, tid))
        return out, "optimizer"
    ops = [e for e in evs if e.get("cat") == "cpu_op"]
    if not ops:
        return [], "window"
    tid, _ = Counter(e.get("tid") for e in ops).most_common(1)[0]
    mine = [e for e in ops if e.get("tid") == tid]
    return [(min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine), mine[0].get("pid"), tid)], "window"


def add_steps(traces: dict[int, dict]) -> tuple[int, list[str]]:
    """Add ProfilerStep#k ranges to each trace, matched across ranks (module docstring);
    returns the steps every rank has, and notes."""
    per = {r: _rank_steps(t) for r, t in traces.items()}
    notes = []
    if any(how == "window" for _, how in per.values()):
        notes.append("no Optimizer.step records in a rank's window: its whole window is one step")
        if not all(how == "window" for _, how in per.values()):
            return 0, notes + ["the ranks' windows cannot be matched step by step"]
        for r, (steps, _) in per.items():
            _insert(traces[r], steps[:1], [0])
        return (1 if all(s for s, _ in per.values()) else 0), notes
    ref_rank = min(per)
    ref = [_abs_us(traces[ref_rank], s[1]) for s in per[ref_rank][0]]
    if not ref:
        return 0, notes + ["no whole step in the window (take a longer one)"]
    lens = sorted(b - a for a, b, *_ in per[ref_rank][0])
    half = max(lens[len(lens) // 2] / 2, 1.0)
    matched: dict[int, dict[int, tuple]] = {}
    for r, (steps, _) in per.items():
        got = {}
        for s in steps:
            end = _abs_us(traces[r], s[1])
            k = min(range(len(ref)), key=lambda j: abs(ref[j] - end))
            if abs(ref[k] - end) <= half and k not in got:
                got[k] = s
        matched[r] = got
    common = sorted(set.intersection(*(set(m) for m in matched.values())))
    for r, m in matched.items():
        _insert(traces[r], [m[k] for k in common], list(range(len(common))))
    return len(common), notes


def _insert(trace: dict, steps: list[tuple], numbers: list[int]) -> None:
    evs = trace.setdefault("traceEvents", [])
    for (t0, t1, pid, tid), k in zip(steps, numbers):
        evs.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": pid, "tid": tid,
                    "ts": t0, "dur": t1 - t0, "args": {"note": STEP_NOTE}})
