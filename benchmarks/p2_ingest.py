#!/usr/bin/env python
"""P2 — ingest rate: span events per second the collector path decodes, validates and
stores, on one core, from pre-packed frame bodies.

The path measured is exactly what the collector thread does per frame body:
`Feed.body(body)` (ranks.frames.decode: msgpack decode and the frame's checks in one msgspec
call, then its cross-field checks against the run's limits, columnar span decode and checks,
storing). Bodies are packed beforehand from `ddptui.recording.synthetic` (the
frames real ranks send), so packing costs nothing here. Workload: xlarge, 2 ranks, single +
naive + interleaved + ddp (18 to 34 spans per frame, 29 on average).

Time is the thread's CPU time (time.thread_time): a rate per core-second, which other
processes on a shared machine do not distort; the wall-clock rate is printed next to it.
For reference, the same bodies go through a plain per-event Python decoder (msgpack into a
map, one tuple per span) in the same run, alternating repetition by repetition. Goal: >= 5 M events/s.

    python benchmarks/p2_ingest.py            # 2000 steps (14k frames, 412k spans), 7 reps
    python benchmarks/p2_ingest.py --quick    # 400 steps, 5 reps
"""
from __future__ import annotations

import argparse
import gc
from array import array
import sys
import time

from _common import median

import msgpack  # noqa: E402

from ddptui.ingest.feed import Feed  # noqa: E402
from ddptui.model.store import Store  # noqa: E402
from ddptui.recording.synthetic import SyntheticRun  # noqa: E402
from ranks import frames  # noqa: E402
from ranks.wire import N_KINDS  # noqa: E402

GOAL = 5e6


def make_bodies(model: str, world: int, steps: int):
    run = SyntheticRun(model, world, ("single", "naive", "interleaved", "ddp"), seed=1)
    head = [frames.encode(f) for f in run.header_frames()]
    bodies, spans = [], 0
    for k in range(steps):
        for f in run.step_frames(k):
            bodies.append(frames.encode(f))
            if type(f) is frames.Spans:
                spans += len(f.kind)
    return head, bodies, spans


def ingest(head, bodies) -> float:
    st = Store()
    put, types = Feed(st).body, frames.RANK_FRAMES
    for b in head:
        put(b, None, types)
    w0, c0 = time.perf_counter(), time.thread_time()
    for b in bodies:
        put(b, None, types)
    c1, w1 = time.thread_time(), time.perf_counter()
    assert st.rejected == 0 and st.spans > 0
    return c1 - c0, w1 - w0


def per_event(head, bodies) -> float:
    """Reference: the same bodies, validated and stored one span at a time in plain Python
    (columns split with array in C, then a Python loop making one tuple per span)."""
    store: dict = {}
    t0 = time.thread_time()
    for b in bodies:
        f = msgpack.unpackb(b, raw=False)
        if f.get("t") != "spans":
            continue
        ia, a0, a1 = array("H"), array("I"), array("I")
        ia.frombytes(f["idx"]); a0.frombytes(f["t0"]); a1.frombytes(f["t1"])
        out = []
        for k, i, x, y in zip(f["kind"], ia, a0, a1):
            if k >= N_KINDS:
                raise ValueError("unknown span kind")
            out.append((k, i, x, y))
        store[(f["s"], f["k"], f["r"])] = out
    return time.thread_time() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P2: span events ingested per second on one core")
    p.add_argument("--quick", action="store_true", help="short run for CI")
    p.add_argument("--model", default="xlarge")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    a = p.parse_args(argv)
    steps = a.steps or (400 if a.quick else 2000)
    reps = a.reps or (5 if a.quick else 7)
    head, bodies, spans = make_bodies(a.model, a.ranks, steps)
    nbytes = sum(len(b) for b in bodies)
    print(f"P2 ingest: {len(bodies):,} frames, {spans:,} span events ({spans / len(bodies):.1f} per frame, "
          f"{nbytes / spans:.1f} B per span on the wire), {a.model}, {a.ranks} ranks, "
          f"single+naive+interleaved+ddp; {reps} repetitions")
    ingest(head, bodies[: len(bodies) // 10])  # warm up
    fast, wall, slow = [], [], []
    for _ in range(reps):
        gc.collect()
        cpu_s, wall_s = ingest(head, bodies)
        fast.append(spans / cpu_s)
        wall.append(spans / wall_s)
        gc.collect()
        slow.append(spans / per_event(head, bodies))
    rate = median(fast)
    print(f"  Feed.body(body):                 median {rate / 1e6:.2f} M events per CPU-second "
          f"({1e6 * spans / rate / len(bodies):.2f} µs per frame; reps "
          + ", ".join(f"{r / 1e6:.2f}" for r in fast) + f"); by the wall clock {median(wall) / 1e6:.2f} M/s")
    print(f"  per-event Python reference:      median {median(slow) / 1e6:.2f} M events per CPU-second "
          f"(the columnar path is {rate / median(slow):.2f}× faster)")
    if not a.quick:  # context: the same path on other models (more layers, more spans per frame)
        for other in ("small", "medium", "deep40"):
            if other == a.model:
                continue
            h2, b2, s2 = make_bodies(other, a.ranks, max(200, steps // 4))
            r2 = median([s2 / ingest(h2, b2)[0] for _ in range(3)])
            print(f"  (for context) {other}: {s2 / len(b2):.1f} spans per frame, median "
                  f"{r2 / 1e6:.2f} M events per CPU-second")
    print(f"P2 ingest events_per_s={rate / 1e6:.2f}M goal>={GOAL / 1e6:g}M {'OK' if rate >= GOAL else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
