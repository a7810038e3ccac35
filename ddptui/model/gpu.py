"""The GPUs of a run: which ones (`gpu_info`, `gpu_text`: the ranks' devices, for summary, its
JSON and replay), and what their samples say, read right (`unwrap`, `busy`).

The readings' two corrections come from the first H100 pass (H100 80GB HBM3, driver 580):

- NVML's PCIe byte counters (``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``/``RX``) are 32 bits there and
  wrap every 4 GiB: at 2-4 GB/s, every second sample or so. A rate made across a wrap came out
  negative ("PCIe ↑-4168 MB/s"). The sampler now adds the wrap (`ddptui.live.nvml`); a recording
  made before has the negative rates in it, and `unwrap` mends them as they come into a Store:
  rate + 4 GiB / the time between the two samples (that is the one rate the counters allow), or
  N/A when that is still negative (a counter reset, not a wrap).
- NVML's utilisation read 0 % for 14 s while GPM's SM activity read 41-47 % and the GPU drew
  221-245 W (nvidia-smi read 0 % too). `busy` gives the figure to show: utilisation, or the SM
  activity where utilisation reads 0 and the SM activity does not, named as what it is.
"""
from __future__ import annotations

import msgspec

from ranks import frames

COUNTER_WRAP_MIB = 2 ** 32 / 2 ** 20  # a 32-bit byte counter wraps every 4096 MiB


def _mended(rate: float | None, dt_s: float) -> float | None:
    if rate is None or rate >= 0:
        return rate
    if dt_s <= 0:
        return None
    fixed = rate + COUNTER_WRAP_MIB / dt_s
    return fixed if fixed >= 0 else None


def unwrap(prev: frames.Gpu | None, f: frames.Gpu) -> frames.Gpu:
    """`f` with every negative PCIe rate mended as a 32-bit counter's wrap since `prev` (the
    sample before it), or None where it cannot be one; `f` itself when nothing is negative."""
    if not any((g.pcie_tx_mbs or 0) < 0 or (g.pcie_rx_mbs or 0) < 0 for g in f.gpus):
        return f
    dt_s = (f.ts - prev.ts) / 1e9 if prev is not None else 0.0
    gpus = [msgspec.structs.replace(g, pcie_tx_mbs=_mended(g.pcie_tx_mbs, dt_s),
                                    pcie_rx_mbs=_mended(g.pcie_rx_mbs, dt_s))
            if (g.pcie_tx_mbs or 0) < 0 or (g.pcie_rx_mbs or 0) < 0 else g for g in f.gpus]
    return msgspec.structs.replace(f, gpus=gpus)


SM_ACTIVE = "SM active"  # the label of GPM's SM activity shown in utilisation's place
UTIL = "util"


def busy(g: frames.GpuSample | None) -> tuple[float | None, str]:
    """(percent, label) to show as how busy the GPU is: NVML's utilisation, or GPM's SM
    activity (label SM_ACTIVE) where utilisation reads 0 (or nothing) while SM activity reads
    at least 0.5 %: a busy GPU is never shown idle because one counter says 0."""
    if g is None:
        return None, UTIL
    if not g.util and g.sm_active is not None and g.sm_active >= 0.5:
        return g.sm_active, SM_ACTIVE
    return g.util, UTIL


def gpu_info(meta) -> dict | None:
    """{'name': 'NVIDIA H100 80GB HBM3', 'count': 1, 'ranks': 2} of a run whose ranks said
    they ran on CUDA devices (a hello's device: 'cuda:0 (NVIDIA H100 80GB HBM3)'; a header's
    `devices`, a map or a RunInfo): the GPUs' model (distinct ones joined), how many devices,
    how many ranks on them. None for a run on CPU, whose ranks named no GPU, or simulated."""
    get = meta.get if isinstance(meta, dict) else (lambda k: getattr(meta, k, None))
    devices = get("devices")
    if not isinstance(devices, dict) or get("simulated"):  # (a simulated run: its label says)
        return None
    on, names = set(), []
    ranks = 0
    for d in devices.values():
        d = str(d)
        if not d.startswith("cuda"):
            continue
        ranks += 1
        dev, _, rest = d.partition(" (")
        on.add(dev)
        name = rest[:-1] if rest.endswith(")") else ""
        if name and name not in names:
            names.append(name)
    if not ranks:
        return None
    return {"name": ", ".join(names) or "GPU", "count": len(on), "ranks": ranks}


def gpu_text(meta) -> str | None:
    """'1x NVIDIA H100 80GB HBM3 (2 ranks share it)', '8x NVIDIA H100 80GB HBM3', or None."""
    g = gpu_info(meta)
    if g is None:
        return None
    share = f" ({g['ranks']} ranks share it)" if g["count"] == 1 and g["ranks"] > 1 else (
        f" ({g['ranks']} ranks)" if g["ranks"] > g["count"] else "")
    return f"{g['count']}x {g['name']}{share}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def shared_gpu_doc(meta, rows: list[dict], recording: str | None = None) -> dict | None:
    """Why communication dwarfs compute when ranks share one GPU over gloo, and what NVLink
    would make of the same bytes, as figures (None: not such a run, or no step of a strategy
    that communicates yet); `recording` names the file in the what-if command.

    The first H100 pass's talk run: 2 ranks on one H100 over gloo move 208 MB a step through
    the host at ~1.8 GB/s: naive 143 ms, DDP 117 ms, one rank alone 7.4 ms. Gloo copies every
    gradient to host memory and back (no NCCL: it needs a GPU per rank); NVLink's 450 GB/s
    (the h100-nvlink profile of `ddptui demo`) would move the same bytes in about 1 ms."""
    from .profiles import PROFILES  # (profiles imports whatif: only when a note is asked for)
    from .whatif import ring_factor
    g = gpu_info(meta)
    backend = getattr(meta, "backend", None) if not isinstance(meta, dict) else meta.get("backend")
    if g is None or g["count"] != 1 or g["ranks"] < 2 or (backend or "gloo") != "gloo":
        return None
    by = {r["strategy"]: r for r in rows if r.get("steps") and r.get("bytes_per_step")}
    r = by.get("ddp") or by.get("naive") or next(iter(by.values()), None)
    if r is None or not r.get("comm_ms") or not r.get("compute_ms"):
        return None
    nbytes, comm, compute = r["bytes_per_step"], r["comm_ms"], r["compute_ms"]
    nv = PROFILES["h100-nvlink"]
    calls = r.get("allreduce_calls_per_step") or 1
    n = r.get("ranks") or g["ranks"]
    nv_ms = calls * (2 * (n - 1) * nv.hop_ms + nv.call_ms) + nbytes * ring_factor(n) / (nv.bus_gbps * 1e9) * 1e3
    model = (getattr(meta, "model", None) if not isinstance(meta, dict) else meta.get("model")) or "xlarge"
    return {"ranks": g["ranks"], "gpu": g["name"], "backend": "gloo", "strategy": r["strategy"],
            "bytes_per_step": nbytes, "bus_gbps": r.get("bus_bw_gbps"), "comm_ms": comm,
            "compute_ms": compute, "comm_over_compute": comm / compute,
            "nvlink_bus_gbps": nv.bus_gbps, "nvlink_ms": nv_ms,
            "commands": [f"ddptui demo --profile h100-nvlink --model {model} --gpus {n}",
                         f"ddptui whatif {recording or 'RECORDING'} --bus-gbps {nv.bus_gbps:.0f}"]}


def shared_gpu_note(meta, rows: list[dict]) -> list[str]:
    """`shared_gpu_doc` in words: sentences from the fullest to the shortest (empty: not
    such a run, or no step of a strategy that communicates yet)."""
    d = shared_gpu_doc(meta, rows)
    if d is None:
        return []
    nbytes, comm, compute, nv_ms, x = d["bytes_per_step"], d["comm_ms"], d["compute_ms"], d["nvlink_ms"], \
        d["comm_over_compute"]
    bus = d["bus_gbps"]
    name = d["gpu"].replace("NVIDIA ", "")
    rate = f" at {bus:.1f} GB/s" if bus else ""
    return [
        f"{d['ranks']} ranks share one {name} over gloo: {_gb(nbytes)} a step through host memory{rate}, "
        f"{d['strategy']} comm {comm:.0f} ms vs compute {compute:.1f} ms ({x:.0f}x) · NVLink "
        f"({d['nvlink_bus_gbps']:.0f} GB/s) ≈ {nv_ms:.1f} ms ({d['commands'][0]})",
        f"{d['ranks']} ranks share 1 GPU over gloo: {_gb(nbytes)}/step{rate}, comm {comm:.0f} ms vs compute "
        f"{compute:.1f} ms · NVLink ≈ {nv_ms:.1f} ms",
        f"1 GPU shared over gloo: comm {comm:.0f} ms vs compute {compute:.1f} ms (NVLink ≈ {nv_ms:.1f} ms)",
        f"shared GPU over gloo: comm {x:.0f}x compute",
    ]
