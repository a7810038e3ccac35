#!/usr/bin/env python
"""(GPU pass) The GPU-timer -> host-clock mapping over a long run: every second, a fresh CUDA
event is recorded on an idle stream and bracketed by two host readings h0 < h1 (the last poll
that found it unstamped, the one that found it stamped), and ddptui's mapping
of it (CudaClock: calibrated offset and drift) is compared with the bracket's midpoint.
Meanwhile the GPU computes (matmuls on the default stream), as in training.

    python benchmarks/gpu_clock.py --seconds 900 --out clock.csv

Writes one CSV line per second, as it goes: t_s, residual_ns (mapped - midpoint), bracket_ns (h1 - h0),
rate_ppm (the drift estimate). Prints the median and max |residual|. Goal: <= 5 µs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=900.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch

    from ranks.core.instrument import CudaClock
    if not torch.cuda.is_available():
        print("gpu_clock: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    clock = CudaClock(dev)
    probe = torch.cuda.Stream(dev)
    x = torch.randn(2048, 2048, device=dev)
    rows = []
    # one line per probe, flushed as it is taken: a run cut short (a command's time limit)
    # still leaves what it measured
    f = open(a.out, "w", buffering=1)
    f.write("t_s,residual_ns,bracket_ns,rate_ppm\n")
    t_start = time.monotonic()
    next_t = t_start
    while time.monotonic() - t_start < a.seconds:
        for _ in range(20):  # keep the GPU busy, as training would
            x = torch.tanh(x @ x * 1e-3)
        clock.maybe_calibrate()
        now = time.monotonic()
        if now < next_t:
            time.sleep(min(0.05, next_t - now))
            continue
        next_t += 1.0
        ref = clock.ref()
        ev = torch.cuda.Event(enable_timing=True)
        # the bracket as the clock's calibration takes it: from the last poll that found the
        # event not yet stamped (on a GPU time-sliced with another process, the whole wait's
        # midpoint would be early by half of it) to the one that found it stamped
        h0 = time.monotonic_ns()
        ev.record(probe)
        while True:
            t = time.monotonic_ns()
            if ev.query():
                break
            h0 = t
        h1 = time.monotonic_ns()
        mapped = clock.resolver(ev, ref)(ev)
        r = (now - t_start, mapped - (h0 + h1) // 2, h1 - h0, (1 / clock.map.rate - 1) * 1e6)
        rows.append(r)
        f.write(f"{r[0]:.3f},{r[1]},{r[2]},{r[3]:.4f}\n")
    torch.cuda.synchronize()
    f.close()
    res = sorted(abs(r[1]) for r in rows)
    if res:
        print(f"gpu_clock: {len(rows)} probes over {rows[-1][0]:.0f} s: |residual| median "
              f"{res[len(res) // 2] / 1000:.2f} µs, p99 {res[int(len(res) * 0.99)] / 1000:.2f} µs, "
              f"max {res[-1] / 1000:.2f} µs; drift {rows[-1][3]:.3f} ppm; events allocated {clock.allocated}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
