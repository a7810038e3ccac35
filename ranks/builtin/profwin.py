"""`ddptui verify`, worker side: torch.profiler around a window of training-loop iterations.

Nothing here runs unless the worker was started with ``--profile-steps A:B`` (or the test
seam ``DDPTUI_VERIFY_SHIFT`` is set): with neither, the worker never imports this module and
the training loop pays nothing.

What is written (one JSON file per rank, ``profile.rank<r>.json`` in ``--profile-dir``) is the
profiler's OWN record of the work: every event torch.profiler collected (aten ops, autograd
engine nodes, ``gloo:``/``nccl:`` collective records, CUDA kernels and copies), with its thread,
start/end on the host CLOCK_MONOTONIC axis, sequence number, input shapes and correlation
ids. ddptui adds no range of its own to the profile (no record_function), so the app can
check its spans against something they do not agree with by construction.

Clock: torch.profiler (kineto) reports ``start_ns()``/``end_ns()`` on the CLOCK_REALTIME axis
(Unix epoch ns; it converts its fast TSC clock with a converter calibrated against
CLOCK_REALTIME when the profiler starts). ddptui's spans are on CLOCK_MONOTONIC
(``time.monotonic_ns()``). The two differ by a constant offset (the wall clock is not stepped
during a window of a few seconds), measured here as realtime - monotonic from the tightest of
many bracketed readings (monotonic, realtime, monotonic), at the window's start and end.
Checked by experiment: with that offset, 2000 ``torch.relu`` calls each bracketed by
``time.monotonic_ns()`` all fell inside their brackets (earliest start 0.40 µs after the
opening read, latest end 0.44 µs before the closing read), i.e. the mapping is good to well
under 1 µs. The JSON records both offsets; a difference between them (wall-clock slewing)
is reported by the app. GPU activity (kineto/CUPTI) is put on the same host axis by kineto
itself (run on the first H100 pass). Among the events are the CUDA runtime's calls
(cudaLaunchKernel, cudaEventRecord), on the thread of the op that made them, with CUPTI's
correlation id (a count of its own) and linked to that op: the app reads them as their op
(ddptui/reports/verify.py, `_device_span`).
"""
from __future__ import annotations

import json
import os
import time

from ranks.wire import KIND_NAMES


def clock_offset_ns(tries: int = 64) -> tuple[int, int]:
    """(CLOCK_REALTIME - CLOCK_MONOTONIC in ns, bracket width in ns) from the tightest read."""
    best = None
    for _ in range(tries):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[1]:
            best = (r - (a + b) // 2, b - a)
    return best


def parse_window(text: str) -> tuple[int, int]:
    """'A:B' -> (A, B), loop iterations A <= k < B."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--profile-steps must be A:B (got {text!r})") from None
    if not 0 <= a < b:
        raise ValueError(f"--profile-steps needs 0 <= A < B (got {text!r})")
    return a, b


def parse_shift(text: str | None) -> dict:
    """DDPTUI_VERIFY_SHIFT='backward:3,ddp/step:1' -> {kind: shift in ns, (strategy, kind): shift
    in ns} (test seam): a kind of every strategy, or of one (`strategy/kind`)."""
    out: dict = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, ms = part.partition(":")
        strategy, _, kind = name.strip().rpartition("/")
        k = KIND_NAMES.index(kind)
        out[(strategy, k) if strategy else k] = int(float(ms) * 1e6)
    return out


def shift_item(item: tuple, shift: dict) -> tuple:
    """Move the spans of the given kinds later by their shift (a span batch from Recorder.poll);
    a (strategy, kind) key shifts that strategy's only."""
    strategy, step, base, kinds, idxs, t0s, t1s, iss = item
    t0s, t1s = list(t0s), list(t1s)
    for i, kd in enumerate(kinds):
        d = shift.get((strategy, kd)) or shift.get(kd)
        if d:
            t0s[i] += d
            t1s[i] += d
    return (strategy, step, min(base, min(t0s)), kinds, idxs, t0s, t1s, iss)


class ShiftLazy:
    """shift_item of a step that resolves itself (Recorder.poll(lazy=True)), called where it
    is resolved; its spans counted and its events given back as the step's own if dropped."""

    __slots__ = ("item", "shift")

    def __init__(self, item, shift: dict[int, int]):
        self.item, self.shift = item, shift

    def __call__(self) -> tuple:
        return shift_item(self.item(), self.shift)

    @property
    def n_spans(self) -> int:
        return self.item.n_spans

    def drop(self) -> None:
        self.item.drop()


_KEEP_SHAPES = ("gloo:", "nccl:", "aten::linear", "aten::_foreach")
# host events whose correlation id is an op's: torch's own. Kineto's others on the host (the
# CUDA runtime's and driver's calls: cudaLaunchKernel, cudaEventRecord) carry CUPTI's id, a
# count of its own that meets the ops' now and then: written as 0 (none), their link kept
_OPS = ("cpu_op", "user_annotation", "python_function", None)


def _activity(e):
    try:
        return str(e.activity_type())
    except Exception:  # noqa: BLE001 - a build without it: taken as an op
        return None


class ProfileWindow:
    """torch.profiler over loop iterations [first, last) on one rank; dumps its events."""

    def __init__(self, window: tuple[int, int], out_dir: str, rank: int, cuda: bool):
        self.first, self.last = window
        self.out_dir = out_dir
        self.rank = rank
        self.cuda = cuda
        self.prof = None
        self.off0 = None

    def iteration_start(self, k: int) -> None:
        if k != self.first or self.prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=acts, record_shapes=True)
        self.prof.start()
        self.off0 = clock_offset_ns()

    def iteration_end(self, k: int, force: bool = False) -> None:
        if self.prof is None or (k != self.last - 1 and not force):
            return
        if self.cuda:
            import torch
            torch.cuda.synchronize()
        off1 = clock_offset_ns()
        self.prof.stop()
        prof, self.prof = self.prof, None
        self.dump(prof, off1)

    def dump(self, prof, off1) -> None:
        off = (self.off0[0] + off1[0]) // 2
        names: dict[str, int] = {}
        rows = []
        for e in prof.profiler.kineto_results.events():
            name = e.name()
            nid = names.setdefault(name, len(names))
            dev = 1 if str(e.device_type()).endswith("CUDA") else 0
            shapes = None
            if name.startswith(_KEEP_SHAPES):
                try:
                    shapes = [list(s) for s in e.shapes()]
                except Exception:  # noqa: BLE001 - shapes are optional
                    shapes = None
            corr = int(e.correlation_id())
            if not dev and _activity(e) not in _OPS:  # (a runtime call: its id is CUPTI's)
                corr = 0
            rows.append([nid, int(e.start_thread_id()), e.start_ns() - off, e.end_ns() - off,
                         int(e.sequence_nr()), dev, corr, int(e.linked_correlation_id()), shapes])
        doc = {"rank": self.rank, "window": [self.first, self.last], "offset_ns": off,
               "offset_drift_ns": off1[0] - self.off0[0], "cuda": self.cuda,
               "names": list(names), "events": rows,
               "fields": ["name", "tid", "t0", "t1", "seq", "dev", "corr", "linked", "shapes"]}
        path = os.path.join(self.out_dir, f"profile.rank{self.rank}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
