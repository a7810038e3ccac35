"""Hardware profiles for simulated runs (`ddptui demo`): what a step of the built-in MLPs takes
on a named machine, from seed 002's measured A100 table and stated assumptions. Pure (no I/O).

A profile gives, per model and GPU count (global batch 1,024, fp32, as seed 002 ran):

- compute: each layer's forward and backward from its FLOPs (2 x batch x in x out forward,
  twice that backward) at the profile's sustained fp32 rate, split over the N GPUs, plus a
  fixed cost per layer (the kernels' launches: it does not shrink with N); the optimizer
  (SGD: 12 bytes per parameter through HBM, plus a fixed cost) on every rank;
- a step overhead at N GPUs (batch slicing, gradient scaling, launches data parallelism adds;
  `overhead_ms`): seed 002's naive step - its comm time - the compute above;
- collectives: the collective model benchmark P9c checks (`whatif.fit_calls` fitted to the
  naive rows' comm time of SEED002): a per-call host cost on the issuing thread, a ring of
  2(N-1) steps of `hop_ms` and bytes x 2(N-1)/N at the fitted bus bandwidth.

The A100 profile's rate and per-layer cost are fitted so the single-GPU step matches seed
002's single rows (`calibration`); where the table has no row (8 GPUs, the H100 node, fsdp,
deep40) the profile extrapolates and says so (`extrapolated`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ranks import spec

from . import whatif

SEED_SAMPLES, SEED_BATCH = 32768, 1024
SEED_STEPS = SEED_SAMPLES // SEED_BATCH  # seed 002's "Avg Epoch" is 32 steps
SEED_MODELS = ("small", "medium", "large", "xlarge")
TOLERANCE_PCT = 15.0  # benchmark P9c's check: median |error| over the rows within this

# seed 002's "Benchmark Results" (4x A100 80GB PCIe; seconds per epoch of 32 steps): single;
# then per GPU count naive (epoch, comm time), interleaved, ddp. The same as
# benchmarks/p9c_seed002.py's TABLE (tests/test_demo.py checks that they agree).
SEED002: dict[str, dict] = {
    "small": {"single": 0.0361, 2: {"naive": (0.0602, 0.0284), "interleaved": 0.0620, "ddp": 0.0436},
              4: {"naive": (0.0653, 0.0307), "interleaved": 0.0643, "ddp": 0.0482}},
    "medium": {"single": 0.1180, 2: {"naive": (0.1071, 0.0328), "interleaved": 0.0898, "ddp": 0.0871},
               4: {"naive": (0.0863, 0.0370), "interleaved": 0.0871, "ddp": 0.0674}},
    "large": {"single": 0.4112, 2: {"naive": (0.2850, 0.0501), "interleaved": 0.2644, "ddp": 0.2597},
              4: {"naive": (0.2143, 0.0744), "interleaved": 0.1837, "ddp": 0.1784}},
    "xlarge": {"single": 0.5956, 2: {"naive": (0.4045, 0.0700), "interleaved": 0.3669, "ddp": 0.3620},
               4: {"naive": (0.2898, 0.0940), "interleaved": 0.2485, "ddp": 0.2496}},
}


def seed_ms(epoch_s: float) -> float:
    return epoch_s * 1e3 / SEED_STEPS


def seed_step_ms(model: str, gpus: int, strategy: str) -> float | None:
    """Seed 002's measured step (ms) of this row, None where the table has none."""
    row = SEED002.get(model)
    if row is None:
        return None
    if strategy == "single":
        return seed_ms(row["single"])
    got = row.get(gpus, {}).get(strategy)
    if got is None:
        return None
    return seed_ms(got[0] if isinstance(got, tuple) else got)


def layer_flops(model: str, batch: int = SEED_BATCH) -> list[float]:
    """Forward + backward FLOPs of each Linear layer (6 x batch x in x out)."""
    w = spec.MODEL_WIDTHS[model]
    return [6.0 * batch * a * b for a, b in zip(w, w[1:])]


def n_params(model: str) -> int:
    return sum(n for _, n, _ in spec.param_table(model))


def comm_fit(table: dict = SEED002) -> whatif.CommFit:
    """P9c's collective model: fit_calls over the table's naive rows (every model, 2 and 4
    GPUs; default seed 002's)."""
    runs = []
    for model in table:
        ps = spec.param_table(model)
        for n in (2, 4):
            runs.append((len(ps), sum(x for _, x, _ in ps) * spec.BYTES_PER_GRAD, n,
                         seed_ms(table[model][n]["naive"][1])))
    return whatif.fit_calls(runs, world=2)


@dataclass(frozen=True)
class Profile:
    key: str
    name: str  # what the title bar says: "4x A100 80GB PCIe"
    gpus: int  # GPUs in the node: the most a run may use
    tflops: float  # sustained fp32 rate of the matmuls (TFLOP/s)
    layer_ms: float  # fixed cost per layer (forward + backward), not split over GPUs
    hbm_gbps: float  # the optimizer's memory traffic
    opt_fixed_ms: float
    call_ms: float  # per-call host cost of a collective
    hop_ms: float  # one ring step's latency
    bus_gbps: float  # bus bandwidth (nccl-tests' busbw)
    basis: str  # where its numbers come from, in one sentence
    measured: bool  # seed 002 measured this machine (rows to check against)

    def compute_ms(self, model: str, gpus: int) -> list[float]:
        """Per layer, forward + backward ms on one of `gpus` GPUs (global batch split)."""
        return [f / (self.tflops * 1e12) * 1e3 / gpus + self.layer_ms for f in layer_flops(model)]

    def opt_ms(self, model: str) -> float:
        return n_params(model) * 12 / (self.hbm_gbps * 1e9) * 1e3 + self.opt_fixed_ms

    def single_ms(self, model: str) -> float:
        return sum(self.compute_ms(model, 1)) + self.opt_ms(model)

    def fit(self) -> whatif.CommFit:
        """The collective model at this profile: alpha + beta x bytes with the host cost."""
        return whatif.CommFit(alpha_ms=2 * self.hop_ms, beta_ms_per_mb=whatif.MIB * whatif.ring_factor(2)
                              / (self.bus_gbps * 1e9) * 1e3, n=0, err_pct=0.0, world=2, call_ms=self.call_ms)

    def overhead_ms(self, model: str, gpus: int) -> float:
        """The step overhead data parallelism adds at `gpus` (0 for one GPU)."""
        if gpus < 2:
            return 0.0
        return overhead_ms(model, gpus)

    def extrapolated(self, model: str, gpus: int, strategy: str) -> str | None:
        """Why this row is an extrapolation (no seed row checks it), None when one does."""
        why = []
        if not self.measured:
            why.append(f"{self.name} not measured")
        if model not in SEED002:
            why.append(f"model {model} not in seed 002")
        if strategy not in ("single", "naive", "interleaved", "ddp"):
            why.append(f"{strategy} not in seed 002")
        elif strategy != "single" and gpus not in (2, 4):
            why.append(f"{gpus} GPUs not in seed 002")
        return "; ".join(why) or None


# -- calibration against seed 002 --------------------------------------------------------------
A100_HBM_GBPS, A100_FP32_TFLOPS = 1935.0, 19.5
H100_HBM_GBPS, H100_FP32_TFLOPS = 3350.0, 67.0
OPT_FIXED_MS = 0.05


def fit_compute(hbm_gbps: float = A100_HBM_GBPS) -> tuple[float, float]:
    """(sustained TFLOP/s, fixed ms per layer) so that layers x fixed + FLOPs / rate + the
    optimizer matches seed 002's single rows (least squares of the relative error)."""
    rows, ys = [], []
    for m in SEED_MODELS:
        opt = n_params(m) * 12 / (hbm_gbps * 1e9) * 1e3 + OPT_FIXED_MS
        y = seed_ms(SEED002[m]["single"]) - opt
        rows.append([len(layer_flops(m)), sum(layer_flops(m)) / 1e9])
        ys.append(y)
    sol = whatif._solve(rows, ys)
    assert sol is not None and sol[0] >= 0 and sol[1] > 0
    return 1.0 / sol[1], sol[0]  # (GFLOP per ms = TFLOP/s)


_TF, _LAYER = fit_compute()
_FIT = comm_fit()


def _compute_only(model: str, gpus: int) -> float:
    return sum(f / (_TF * 1e12) * 1e3 / gpus + _LAYER for f in layer_flops(model))


def _seed_overheads() -> dict[tuple[str, int], float]:
    """Per seed model at 2 and 4 GPUs: naive's step - its comm - compute - optimizer."""
    out = {}
    for m in SEED_MODELS:
        opt = n_params(m) * 12 / (A100_HBM_GBPS * 1e9) * 1e3 + OPT_FIXED_MS
        for n in (2, 4):
            step, comm = SEED002[m][n]["naive"]
            out[(m, n)] = max(0.0, seed_ms(step) - seed_ms(comm) - _compute_only(m, n) - opt)
    return out


_OVERHEAD = _seed_overheads()


def overhead_ms(model: str, gpus: int) -> float:
    """Seed 002's step overhead (ms) at 2 and 4 GPUs; log-linear in N beyond (as
    benchmarks/whatif_scaling.py), and for a model not in the seed the mean of the seed
    models' per layer, times its layers (extrapolations)."""
    if (model, gpus) in _OVERHEAD:
        return _OVERHEAD[(model, gpus)]
    if model in SEED002:
        o2, o4 = _OVERHEAD[(model, 2)], _OVERHEAD[(model, 4)]
    else:
        per = lambda n: sum(_OVERHEAD[(m, n)] / len(layer_flops(m)) for m in SEED_MODELS) / len(SEED_MODELS)  # noqa: E731
        o2, o4 = per(2) * len(layer_flops(model)), per(4) * len(layer_flops(model))
    return max(0.0, o2 + (o4 - o2) * math.log2(gpus / 2))


PROFILES: dict[str, Profile] = {
    "a100-pcie": Profile(
        "a100-pcie", "4x A100 80GB PCIe", 4, _TF, _LAYER, A100_HBM_GBPS, OPT_FIXED_MS,
        _FIT.call_ms, _FIT.hop_ms, _FIT.bus_gbps or 25.0,
        "seed 002's 4x A100 80GB PCIe: compute fitted to its single rows, collectives and step "
        "overhead to its naive rows (benchmark P9c's model)", True),
    "h100-nvlink": Profile(
        "h100-nvlink", "8x H100 80GB SXM NVLink", 8, _TF * H100_FP32_TFLOPS / A100_FP32_TFLOPS, _LAYER,
        H100_HBM_GBPS, OPT_FIXED_MS, _FIT.call_ms, 0.003, 450.0,
        "extrapolated from the A100 profile: fp32 rate x 67/19.5 (H100 SXM / A100 datasheets), the "
        "same per-layer and per-call host costs and step overhead, NVLink 4 through NVSwitch at "
        "450 GB/s bus bandwidth and 3 µs per ring step (assumed, not measured)", False),
}
