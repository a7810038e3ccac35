#!/usr/bin/env python
"""The seeds' scaling reading, from ddptui.model.whatif's simulator: predicted DDP efficiency
against world size at PCIe 4, NVLink 4, 100 and 400 Gb/s, for the seeds' MLPs and a 7B
dense model. Prints the README's markdown table. Predictions only: no GPU checked them
beyond seed 002's 2 and 4 A100s (P9c, benchmarks/p9c_seed002.py).

Inputs (stated, from the seeds): per-GPU compute per step kept as N grows (weak scaling: the
per-GPU batch stays) — the seed MLPs at their single-A100 step of seed 002 (its Avg Epoch / 32:
32,768 samples at batch 1,024), the 7B at 200 ms (seed 001's example); forward 1/3 and backward
2/3 of it, each layer's share in proportion to its parameters; gradients fp32 (MLPs) and bf16
(7B); DDP's default buckets (25 MB, first bucket 1 MiB), reduced one after another on one NCCL
stream; a collective takes 2(N-1) x 10 µs + bytes x 2(N-1)/N / bus bandwidth on the stream,
plus the per-call host cost P9c fits to seed 002's naive runs, on the thread that issues it;
the MLPs also pay P9c's step overhead (naive's compute beyond single / N at 2 and 4 GPUs,
log-linear in N beyond 4: an extrapolation), the 7B none (unknown). Efficiency: the
single-GPU step / the predicted step.

    python benchmarks/whatif_scaling.py
"""
from __future__ import annotations

import math

import _common  # noqa: F401  (this checkout importable)
import p9c_seed002 as p9c

from ddptui.model import whatif
from ranks import spec

BUSES = (("PCIe 4", 25.0), ("NVLink 4", 50.0), ("100 Gb/s", 12.5), ("400 Gb/s", 50.0))
WORLDS = (2, 4, 8, 16, 32, 64)
HOP_MS = 0.010


def llama7b() -> list[tuple[int, int]]:
    """(numel, layer) per parameter tensor of a 7B dense transformer (32 blocks, d 4096,
    MLP 11008, vocabulary 32000): ~6.7 B parameters."""
    d, f, v = 4096, 11008, 32000
    out = [(v * d, 0)]
    for b in range(32):
        out += [(d * d, b + 1)] * 4 + [(d * f, b + 1)] * 3 + [(d, b + 1)] * 2
    out += [(d, 33), (v * d, 33)]
    return out


def overhead_ms(model: str, n: int) -> float:
    """P9c's step overhead at 2 and 4 GPUs, log-linear in N beyond (an extrapolation)."""
    o2, o4 = p9c.overhead_ms(model, 2), p9c.overhead_ms(model, 4)
    return max(0.0, o2 + (o4 - o2) * math.log2(n / 2))


def main() -> None:
    models = [(m, p9c.params(m), spec.BYTES_PER_GRAD, p9c.step_ms(p9c.TABLE[m]["single"]), m) for m in p9c.MODELS]
    models.append(("7B dense (bf16)", llama7b(), 2, 200.0, None))
    seed = p9c.calibrate()
    fit = whatif.CommFit(alpha_ms=2 * HOP_MS, beta_ms_per_mb=0.0, n=0, err_pct=0.0, world=2, call_ms=seed.call_ms)
    print(f"per-call host cost {seed.call_ms * 1e3:.0f} µs (P9c: fitted to seed 002's naive A100 runs)")
    print()
    print("| model | params | compute ms | bus | " + " | ".join(f"N={n}" for n in WORLDS) + " |")
    print("|---|---|---|---|" + "---|" * len(WORLDS))
    for name, params, bpg, ms, mlp in models:
        for bus, gbps in BUSES:
            effs = []
            for n in WORLDS:
                b = whatif.synthetic_basis(params, bpg, ms, world=n, overhead_ms=overhead_ms(mlp, n) if mlp else 0.0)
                p = whatif.predict(b, fit, world=n, bus_gbps=gbps, delays=whatif.Delays({}, {}), hop_ms=HOP_MS)
                effs.append(f"{100.0 * ms / p.step_ms:.0f} %")
            total = sum(n for n, _ in params)
            print(f"| {name} | {total / 1e6:,.1f} M | {ms:.3g} | {bus} ({gbps:g} GB/s) | " + " | ".join(effs) + " |")

if __name__ == "__main__":
    main()
