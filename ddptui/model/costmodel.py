"""The cost model of `ddptui bench` (pure arithmetic, no I/O).

- seed 001: bytes per rank per step of a ring AllReduce = 2(N-1)/N x parameters x bytes per
  gradient; the measured bus bandwidth (the best any strategy of a model reached) and the
  communication time it predicts; FSDP (fully_shard per layer, resharded after forward): an
  all-gather of each layer's parameters before its forward and again before its backward,
  a reduce-scatter of its gradients after it, each (N-1)/N of the layer's bytes: 3(N-1)/N x
  parameters x bytes, half as much again as DDP's;
- seed 002: the Amdahl ceiling f = T_single / (T_single + T_comm_naive),
  ceiling = 1 / ((1 - f) + f / N), against the speedup each strategy achieved.
"""
from __future__ import annotations

from ranks import spec

from . import figures


def ring_bytes_per_rank(params: int, ranks: int, bytes_per_grad: int = spec.BYTES_PER_GRAD) -> float:
    """Seed 001: bytes each rank sends (and receives) per step in a ring AllReduce."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * params * bytes_per_grad


def strategy_ring_bytes(strategy: str, params: int, ranks: int,
                        bytes_per_grad: int = spec.BYTES_PER_GRAD) -> float:
    """Bytes each rank sends per step under a strategy: none for single, 3(N-1)/N x the
    parameters' bytes for fsdp (all-gather forward and backward, reduce-scatter), the ring
    AllReduce's 2(N-1)/N for the others."""
    if strategy == "single" or ranks < 2:
        return 0.0
    if strategy == "fsdp":
        return 3 * (ranks - 1) / ranks * params * bytes_per_grad
    return ring_bytes_per_rank(params, ranks, bytes_per_grad)


def amdahl(t_single_ms: float | None, t_comm_naive_ms: float | None, ranks: int):
    """Seed 002: (f, ceiling) with f = T_single / (T_single + T_comm_naive)."""
    if not t_single_ms or t_comm_naive_ms is None or t_single_ms <= 0 or ranks < 1:
        return None, None
    f = t_single_ms / (t_single_ms + max(0.0, t_comm_naive_ms))
    return f, 1.0 / ((1.0 - f) + f / ranks)


def model_figures(model: str, ranks: int, summaries: list[dict], device: str) -> tuple[list[dict], dict]:
    """Rows of the table (one per strategy) and the model's cost-model/Amdahl figures."""
    params = spec.param_count(model)
    ring = ring_bytes_per_rank(params, ranks)
    by = {s["strategy"]: s for s in summaries if s.get("step_ms_median")}
    sp = figures.speedups(list(by.values()))
    # the network's effective bus bandwidth, as the best any strategy of this run reached
    bw, bw_from = None, None
    for s, r in by.items():
        b = r.get("bus_bw_gbps")
        if s != "single" and b and (bw is None or b > bw):
            bw, bw_from = b, s
    t_single = by.get("single", {}).get("step_ms_median")
    t_comm_naive = by.get("naive", {}).get("comm_ms")
    f, ceiling = amdahl(t_single, t_comm_naive, ranks)
    rows = []
    for s in summaries:
        name = s["strategy"]
        n = s.get("ranks", 1)
        measured = bool(s.get("step_ms_median"))
        speed = 1.0 if name == "single" and measured else sp.get(f"{name}_vs_single")
        rb = strategy_ring_bytes(name, params, ranks)
        rows.append({
            "model": model, "strategy": name, "ranks": n, "device": device, "params": params,
            "steps": s.get("steps", 0),
            "step_ms_median": s.get("step_ms_median"), "compute_ms": s.get("compute_ms"),
            "comm_ms": s.get("comm_ms"), "exposed_comm_ms": s.get("exposed_comm_ms"),
            "overlap_pct": s.get("overlap_pct"), "samples_per_s": s.get("samples_per_s"),
            "speedup_vs_single": speed,
            "allreduce_calls_per_step": s.get("allreduce_calls_per_step"),
            "allreduce_bytes_per_step": s.get("bytes_per_step"),
            "ring_bytes_per_rank_per_step": rb,
            "bus_bw_gbps": s.get("bus_bw_gbps"),
            "model_bus_bw_gbps": bw if name != "single" else None,
            "predicted_comm_ms": (0.0 if name == "single" else
                                  rb / (bw * 1e9) * 1e3 if bw else None),
            "amdahl_f": f if name != "single" else None,
            "amdahl_ceiling": ceiling if name != "single" else None,
            "efficiency_vs_ceiling": (speed / ceiling if speed is not None and ceiling
                                      and name != "single" else None),
        })
    best = max((r for r in rows if r["strategy"] != "single" and r["speedup_vs_single"]),
               key=lambda r: r["speedup_vs_single"], default=None)
    info = {
        "model": model, "params": params, "ranks": ranks, "device": device,
        "grad_bytes": params * spec.BYTES_PER_GRAD, "ring_bytes_per_rank_per_step": ring,
        "bus_bw_gbps": bw, "bus_bw_from": bw_from,
        "predicted_comm_ms": ring / (bw * 1e9) * 1e3 if bw else None,
        "t_single_ms": t_single, "t_comm_naive_ms": t_comm_naive,
        "amdahl_f": f, "amdahl_ceiling": ceiling,
        "best_strategy": best["strategy"] if best else None,
        "best_speedup": best["speedup_vs_single"] if best else None,
    }
    return rows, info
