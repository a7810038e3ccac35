#!/usr/bin/env python
"""P4 — replay: time to open and index a 1 M-span recording, and bytes per span on disk.

The recording is written with the real RecordWriter from synthetic frames (large model,
8 ranks, single + naive + interleaved + ddp, until 1 M spans), with what a live recording
also holds: the rank hellos, a heartbeat per rank every second and a GPU sample every
0.5 s of the run's clock, and a sync flush after every step (a live run flushes about once
a step). "Open and index" is `ddptui.recording.replay.ReplaySource(path)`: it reads every frame
and indexes steps at construction (without it: recording.Reader plus a step -> frame index).

Goals: open and index <= 0.5 s (median of several opens), <= 12 B per span.

    python benchmarks/p4_replay.py            # 1 M spans, 7 opens
    python benchmarks/p4_replay.py --quick    # 1 M spans, 3 opens
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

from _common import median, result_line

from ddptui.recording.reader import Reader  # noqa: E402
from ranks.recfile import RecordWriter  # noqa: E402
from ddptui.recording.synthetic import SyntheticRun  # noqa: E402
from ranks import frames, spec  # noqa: E402

GOAL_S, GOAL_B = 0.5, 12.0


def write_recording(path: str, target_spans: int, model: str, world: int) -> tuple[int, int, int]:
    strategies = ("single", "naive", "interleaved", "ddp")
    run = SyntheticRun(model, world, strategies, seed=7, bw_gbps=20.0)
    meta = {"ddptui": "bench", "created": time.time(), "model": model,
            "layers": spec.layer_names(model), "params": [list(p) for p in spec.param_table(model)],
            "strategies": list(strategies), "world": world, "batch": 1024, "steps": 0,
            "bucket_cap_mb": 25.0, "seed": 0, "lr": 0.01, "device": "cuda", "gpus": world,
            "note": "synthetic (benchmark P4)"}
    w = RecordWriter(path, meta)
    for f in run.header_frames():
        w.write(f)
    spans = steps = 0
    next_gpu = next_hb = run.t
    while spans < target_spans:
        for f in run.step_frames(steps):
            w.write(f)
            if type(f) is frames.Spans:
                spans += len(f.kind)
        while run.t >= next_gpu:
            g = run.gpu_frame(steps, world)
            g.ts = next_gpu
            w.write(g)
            next_gpu += 500_000_000
        while run.t >= next_hb:
            for r in range(world):
                w.write(frames.Hb(rank=r, step=steps, phase="training", dropped=0, dropped_frames=0,
                                  ts=next_hb))
            next_hb += 1_000_000_000
        w.flush()
        steps += 1
    w.close()
    return spans, steps, w.frames


def open_and_index(path: str):
    try:
        from ddptui.recording.replay import ReplaySource
    except ImportError:
        ReplaySource = None
    t0 = time.perf_counter()
    if ReplaySource is not None:
        src = ReplaySource(path)
        n_steps, damage = src.steps_total, src.damage
    else:  # fallback: read every frame, index step -> frame where it ends
        r = Reader(path)
        ends: dict[int, int] = {}
        bodies = []
        for body, f in r:
            if type(f) is frames.Spans:
                ends[f.step] = len(bodies) + 1
            bodies.append(body)
        n_steps, damage = len(ends), r.damage
    return time.perf_counter() - t0, n_steps, damage, "ReplaySource" if ReplaySource else "Reader+index"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P4: open+index time and bytes per span of a recording")
    p.add_argument("--quick", action="store_true", help="fewer opens (CI)")
    p.add_argument("--spans", type=int, default=1_000_000)
    p.add_argument("--model", default="large")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--opens", type=int, default=None)
    a = p.parse_args(argv)
    opens = a.opens or (3 if a.quick else 7)
    with tempfile.TemporaryDirectory(prefix="ddptui-p4-") as tmp:
        path = os.path.join(tmp, "p4.ddptui")
        t0 = time.perf_counter()
        spans, steps, n_frames = write_recording(path, a.spans, a.model, a.ranks)
        wrote = time.perf_counter() - t0
        size = os.path.getsize(path)
        print(f"P4 replay: {a.model}, {a.ranks} ranks, {steps:,} steps, {n_frames:,} frames, "
              f"{spans:,} spans, {size / 1e6:.2f} MB (written in {wrote:.1f} s)")
        times = []
        for _ in range(opens):
            gc.collect()
            dt, n_steps, damage, how = open_and_index(path)
            times.append(dt)
            if damage:
                print(f"P4: the recording reads as damaged: {damage}", file=sys.stderr)
                return 1
            if n_steps != steps:
                print(f"P4: indexed {n_steps} steps, wrote {steps}", file=sys.stderr)
                return 1
        t = median(times)
        bps = size / spans
        print(f"  open and index ({how}): median {t:.3f} s over {opens} opens "
              f"({', '.join(f'{x:.3f}' for x in times)}); {spans / t / 1e6:.1f} M spans/s")
        print(f"  size: {bps:.2f} B per span (whole file: header, hellos, heartbeats, GPU samples)")
    print(result_line("P4", "replay", "bytes_per_span", bps, "<=", GOAL_B, "{:.2f}"))
    print(result_line("P4", "replay", "open_index_s", t, "<=", GOAL_S, "{:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
