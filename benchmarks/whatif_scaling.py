#!/usr/bin/env python
"""The seeds' scaling reading, from ddptui.model.whatif's simulator: predicted DDP efficiency
against world size at PCIe 4, NVLink 4, 100 and 400 Gb/s, for the seeds' MLPs and a 7B
dense model. Prints the README's markdown table. Predictions only: no GPU checked them.

Inputs (stated, from the seeds): per-GPU compute per step (weak scaling: the per-GPU batch
stays) — the seed MLPs at their single-A100 step times of seed 002 (global batch 1024), the
7B at 200 ms (seed 001's example); forward 1/3 and backward 2/3 of it, each layer's share in
proportion to its parameters; gradients fp32 (MLPs) and bf16 (7B); DDP's default buckets
(25 MB, first bucket 1 MiB), reduced one after another on one NCCL stream; a collective
takes 2(N-1) x 10 µs + bytes x 2(N-1)/N / bus bandwidth.

    python benchmarks/whatif_scaling.py
"""
from __future__ import annotations

import _common  # noqa: F401  (this checkout importable)

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


def synthetic_basis(params: list[tuple[int, int]], bytes_per: int, compute_ms: float) -> whatif.Basis:
    layers = max(layer for _, layer in params) + 1
    per_layer = [0] * layers
    for n, layer in params:
        per_layer[layer] += n
    total = sum(per_layer)
    fwd, bwd = compute_ms / 3, 2 * compute_ms / 3
    t, comp, bwd_end = 0.0, [], {}
    for layer in range(layers):
        t += fwd * per_layer[layer] / total
    comp.append((0.0, t))
    for layer in reversed(range(layers)):
        t += bwd * per_layer[layer] / total
        bwd_end[layer] = t
    comp.append((fwd, t))
    tr = {0: whatif.RankTimeline(0, 0.0, t, [(0.0, t)], bwd_end, [])}
    return whatif.Basis("ddp", 2, 1, "nccl", [n * bytes_per for n, _ in params], [layer for _, layer in params],
                   25.0, False, None, [0], [tr], [{}])


def main() -> None:
    models = [(m, [(n, layer) for _, n, layer in spec.param_table(m)], spec.BYTES_PER_GRAD, ms)
              for m, ms in (("small", 36.1), ("medium", 118.0), ("large", 411.2), ("xlarge", 595.6))]
    models.append(("7B dense (bf16)", llama7b(), 2, 200.0))
    fit = whatif.CommFit(alpha_ms=2 * HOP_MS, beta_ms_per_mb=0.0, n=0, err_pct=0.0, world=2)
    print("| model | params | compute ms | bus | " + " | ".join(f"N={n}" for n in WORLDS) + " |")
    print("|---|---|---|---|" + "---|" * len(WORLDS))
    for name, params, bpg, ms in models:
        b = synthetic_basis(params, bpg, ms)
        for bus, gbps in BUSES:
            effs = []
            for n in WORLDS:
                p = whatif.predict(b, fit, world=n, bus_gbps=gbps, delays=whatif.Delays({}, {}), hop_ms=HOP_MS)
                effs.append(f"{p.efficiency_pct:.0f} %")
            total = sum(n for n, _ in params)
            print(f"| {name} | {total / 1e6:,.1f} M | {ms:g} | {bus} ({gbps:g} GB/s) | " + " | ".join(effs) + " |")


if __name__ == "__main__":
    main()
