#!/usr/bin/env python
"""P9c — the what-if simulator against seed 002's GPU table (4x A100 80GB): interleaved DP and
PyTorch DDP at 2 and 4 GPUs for the small, medium, large and xlarge MLPs, predicted from the
single-GPU rows and the naive rows alone, printed next to what the seed measured.

The table (seed 002, "Benchmark Results", transcribed in TABLE) gives per mode "Avg Epoch":
one epoch of 32,768 samples at a global batch of 1,024, so 32 steps (its throughput column is
32,768 / Avg Epoch); per step everything is 1/32 of it. Naive DP also gives its "Comm Time":
the blocking AllReduce loop after the backward, one call per parameter tensor (2 per Linear
layer: ranks/spec.py param_table).

What the prediction is made from (never from an interleaved or DDP row):

- compute per step at N GPUs: the single-GPU step / N (the global batch is fixed, each GPU
  takes 1/N of it), forward 1/3 and backward 2/3, each layer's share by its parameters;
- the step overhead at N GPUs, per model: naive's step - its comm time - single / N (launch-bound
  work data parallelism adds and nothing overlaps: naive's compute part is larger than
  single / N), kept after the step's last collective;
- the collective cost, from the 8 naive rows' comm time (what a user would calibrate from a
  naive run): calls x (call + 2(N-1) x hop) + bytes x 2(N-1)/N x beta
  (`whatif.fit_calls`): `call` is a per-call host cost, spent on the thread that issues
  the call — in interleaved and DDP the backward's, so it delays the backward after it;
- interleaved: one AllReduce per parameter tensor as its gradient is ready; DDP: its buckets
  at the default 25 MB cap (first bucket 1 MiB), on one NCCL stream.

No contention term: neither single nor naive overlaps compute with communication, so nothing
here shows how much one slows the other.

    python benchmarks/p9c_seed002.py        # instant: arithmetic on the seed's table
"""
from __future__ import annotations

import statistics
import sys

from _common import result_line

from ddptui.model import whatif
from ranks import spec

from ddptui.model.profiles import SEED002 as TABLE, comm_fit  # noqa: E402  (the table, written once)
from ddptui.model.profiles import SEED_BATCH as BATCH, SEED_MODELS as MODELS, SEED_SAMPLES as SAMPLES  # noqa: E402
from ddptui.model.profiles import SEED_STEPS as STEPS, TOLERANCE_PCT as GOAL_PCT  # noqa: E402

PREDICTED = ("interleaved", "ddp")
# seed 002's "Benchmark Results" (seconds per epoch of 32 steps): ddptui.model.profiles.SEED002


def step_ms(epoch_s: float) -> float:
    return epoch_s * 1e3 / STEPS


def params(model: str) -> list[tuple[int, int]]:
    return [(n, layer) for _, n, layer in spec.param_table(model)]


def calibrate(table: dict = TABLE) -> whatif.CommFit:
    """The collective cost fitted to the naive rows' comm time (every model, 2 and 4 GPUs)."""
    return comm_fit(table)


def overhead_ms(model: str, n: int, table: dict = TABLE) -> float:
    """Naive's compute part (its step - its comm) beyond single / N."""
    naive, comm = table[model][n]["naive"]
    return max(0.0, step_ms(naive) - step_ms(comm) - step_ms(table[model]["single"]) / n)


def predict(model: str, n: int, strategy: str, fit: whatif.CommFit, table: dict = TABLE) -> whatif.Prediction:
    b = whatif.synthetic_basis(params(model), spec.BYTES_PER_GRAD, step_ms(table[model]["single"]) / n,
                               strategy=strategy, world=n, overhead_ms=overhead_ms(model, n, table))
    return whatif.predict(b, fit, world=n, delays=whatif.Delays({}, {}))


def rows(table: dict = TABLE) -> tuple[whatif.CommFit, list[dict]]:
    fit = calibrate(table)
    out = []
    for model in MODELS:
        for n in (2, 4):
            for s in PREDICTED:
                p = predict(model, n, s, fit, table)
                meas = step_ms(table[model][n][s])
                out.append({"model": model, "gpus": n, "strategy": s, "collectives": p.collectives,
                            "predicted_ms": p.step_ms, "measured_ms": meas,
                            "overhead_ms": overhead_ms(model, n, table),
                            "err_pct": 100.0 * (p.step_ms - meas) / meas})
    return fit, out


def main() -> int:
    fit, rs = rows()
    print(f"P9c: seed 002's 4x A100 table; per step = Avg Epoch / {STEPS} (32,768 samples at batch {BATCH})")
    print(f"collective cost fitted to the 8 naive rows' comm time: per-call host cost "
          f"{fit.call_ms * 1e3:.1f} µs, ring step latency {fit.hop_ms * 1e3:.1f} µs, "
          f"bus {fit.bus_gbps or 0:.0f} GB/s (beta {fit.beta_ms_per_mb * 1e3:.2f} µs/MB at 2 GPUs); "
          f"fit error {fit.err_pct:.0f} % (RMS, relative)")
    print(f"{'model':<7} {'GPUs':>4} {'mode':<12} {'calls':>5} {'overhead':>8} "
          f"{'pred ms':>8} {'meas ms':>8} {'pred s/ep':>9} {'meas s/ep':>9} {'error':>6}")
    for r in rs:
        print(f"{r['model']:<7} {r['gpus']:>4} {r['strategy']:<12} {r['collectives']:>5} {r['overhead_ms']:>8.2f} "
              f"{r['predicted_ms']:>8.3f} {r['measured_ms']:>8.3f} {r['predicted_ms'] * STEPS / 1e3:>9.4f} "
              f"{r['measured_ms'] * STEPS / 1e3:>9.4f} {r['err_pct']:>+5.0f}%")
    med = statistics.median(abs(r["err_pct"]) for r in rs)
    worst = max(rs, key=lambda r: abs(r["err_pct"]))
    print(f"median |error| {med:.1f} % over {len(rs)} rows; worst {worst['model']} {worst['gpus']} GPUs "
          f"{worst['strategy']} {worst['err_pct']:+.0f} %")
    print(result_line("P9c", "seed002", "step_median_abs_err_pct", med, "<=", GOAL_PCT, "{:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
