"""Per-GPU NVML figures with history on a fixed 0–100 scale; per-rank CPU without NVML.

Only draws what the sampler put in the store: a None is N/A, never an error; NVLink, which
a GPU without links never reads (one H100 shared by the ranks), is left out when no sample
of that GPU on the panel has it. A simulated run has no samples, and says so.
"""
from __future__ import annotations

from ranks import frames

from ddptui.model import gpu as gpusamples
from ddptui.model.runinfo import flight_recorder_run, simulated_label
from ddptui.model.store import Store
from . import theme
from .panel import Frame, Panel
from .text import Parts


CLOCK_OK_NS = 5_000  # a clock bound past this is said (verify's GPU tolerance)


def _num(v, spec: str, unit: str = "") -> str:
    return "N/A" if v is None else format(v, spec) + unit


def _rate(v) -> str:
    if v is None or v < 0:  # (a negative rate is no reading: gpusamples.unwrap mends what it can)
        return "N/A"
    return f"{v / 1024:.1f} GB/s" if v >= 1024 else f"{v:.0f} MB/s"


def _mem_pct(g: frames.GpuSample | None):
    if g is None:
        return None
    used, total = g.mem_used_mb, g.mem_total_mb
    return 100.0 * used / total if used is not None and total else None


def gpu_lines(samples: list[frames.Gpu], width: int, rows: int, ranks_of: dict | None = None,
              clock_res_ns: int | None = None, clock_bound_ns: int | None = None) -> list[Parts]:
    """`samples`: the store's gpu frames, oldest first; `ranks_of`: GPU UUID -> the ranks on
    it; `clock_res_ns`: the worst GPU-timer mapping residual the ranks reported (how far a
    span's time may be off, beyond the timer's own)."""
    latest = samples[-1].gpus
    names = sorted({str(g.name) for g in latest})
    title = [(f"GPU · NVML · {', '.join(names)}", theme.style(theme.TEXT, bold=True))]
    if clock_bound_ns is not None:  # (the GPU timer's map to host time: how far a span may be off)
        wide = clock_bound_ns > CLOCK_OK_NS  # (a GPU time-sliced with another process's context)
        title.append((f" · clock ±{clock_bound_ns / 1000:.1f} µs" + (": spans good to that, not 5 µs" if wide else ""),
                      theme.style(theme.WARN if wide else theme.DIM)))
    elif clock_res_ns is not None:
        title.append((f" · clock residual {abs(clock_res_ns) / 1000:.1f} µs", theme.style(theme.DIM)))
    lines: list[Parts] = [title]
    ranks_of = ranks_of or {}
    per_gpu = 2 if rows - 1 >= 2 * len(latest) else 1
    hist_w = max(4, min(30, (width - 44) // 2))
    recent = []  # each sample of the history: GPU index -> its reading (the first, if two say one index)
    for s in samples[-hist_w:]:
        of: dict = {}
        for x in s.gpus:
            of.setdefault(x.index, x)
        recent.append(of)
    for g in latest:
        i = g.index
        hist = [of.get(i) for of in recent]
        # utilisation, or GPM's SM activity where utilisation reads 0 (an H100 read 0 % while
        # its SMs were 41-47 % busy at 245 W): never a busy GPU shown idle
        pct, label = gpusamples.busy(g)
        util_h = theme.spark([gpusamples.busy(h)[0] for h in hist], width=hist_w)
        mem_h = theme.spark([_mem_pct(h) for h in hist], width=hist_w)
        used, total = g.mem_used_mb, g.mem_total_mb
        mem = (f"{_num(None if used is None else used / 1024, '.1f')}/"
               f"{_num(None if total is None else total / 1024, '.0f')} GB")
        on = ranks_of.get(g.uuid)
        first = [(f"GPU{i} ", theme.style(theme.TEXT, bold=True)),
                 *([(f"r{','.join(map(str, on))} ", theme.style(theme.DIM))] if on else []), (f"{label} ", theme.style(theme.DIM)),
                 (f"{_num(pct, '>3.0f', '%'):>4} ", theme.style(theme.TEXT, bold=True)),
                 (f"{util_h:<{hist_w}}", theme.style(theme.GOOD)), (" mem ", theme.style(theme.DIM)),
                 (f"{mem:>13} ", theme.style(theme.TEXT)), (f"{mem_h:<{hist_w}}", theme.style("#5aa9ff"))]
        second = [("     ", theme.style()), (f"{_num(g.power_w, '.0f', ' W')}  ", theme.style(theme.TEXT)),
                  *([(f"SM active {g.sm_active:.0f}%  ", theme.style(theme.TEXT))]
                    if g.sm_active is not None and label != gpusamples.SM_ACTIVE else []),
                  *([("NVML util 0%  ", theme.style(theme.DIM))] if label == gpusamples.SM_ACTIVE else []),
                  (f"SM {_num(g.sm_clock_mhz, '.0f', ' MHz')}  ", theme.style(theme.TEXT)),
                  (f"PCIe ↑{_rate(g.pcie_tx_mbs)} ↓{_rate(g.pcie_rx_mbs)}  ", theme.style(theme.TEXT))]
        if any(h is not None and (h.nvlink_tx_mbs is not None or h.nvlink_rx_mbs is not None) for h in hist):
            second.append((f"NVLink ↑{_rate(g.nvlink_tx_mbs)} ↓{_rate(g.nvlink_rx_mbs)}", theme.style(theme.TEXT)))
        if per_gpu == 2:
            lines += [first, second]
        else:
            lines.append(first + [("  ", theme.style())] + second[1:3])
    return lines


def cpu_lines(samples: list[frames.Cpu], width: int) -> list[Parts]:
    lines: list[Parts] = [[("no NVML (no GPU): CPU use per rank (psutil)", theme.style(theme.WARN, bold=True))]]
    latest = samples[-1].ranks
    hist_w = max(4, min(60, width - 22))
    for r in sorted(latest, key=int):
        hist = [s.ranks.get(r) for s in samples[-hist_w:]]
        lines.append([(f"rank {r:<3}", theme.style(theme.TEXT, bold=True)), (" CPU ", theme.style(theme.DIM)),
                      (f"{_num(latest[r], '>4.0f', '%'):>5} ", theme.style(theme.TEXT, bold=True)),
                      (theme.spark(hist), theme.style(theme.GOOD))])
    if not latest:
        lines.append([("waiting for the ranks' processes…", theme.style(theme.DIM))])
    return lines


def wanted_rows(store: Store) -> int:
    """Rows the panel would like: a title, then two per GPU or one per rank."""
    gpu, cpu = store.samples()
    if gpu:
        return 1 + 2 * len(gpu[-1].gpus)
    if cpu:
        return 1 + max(1, len(cpu[-1].ranks))
    return 1


def build(store: Store, width: int, rows: int) -> list[Parts]:
    gpu, cpu = store.samples()
    ranks = store.rank_snapshot()
    ranks_of: dict = {}
    res = [i.clock_res_ns for i in ranks.values() if i.clock_res_ns is not None]
    bound = [i.clock_bound_ns for i in ranks.values() if i.clock_bound_ns is not None]
    for r, i in sorted(ranks.items()):
        if i.uuid:
            ranks_of.setdefault(i.uuid, []).append(r)
    if gpu:
        return gpu_lines(gpu, width, rows, ranks_of, max(res, key=abs) if res else None,
                         max(bound) if bound else None)
    if cpu:
        return cpu_lines(cpu, width)
    if simulated_label(store.meta) is not None:  # (ddptui demo: a model's figures, no device)
        return [[("GPU / CPU: simulated: no device samples", theme.style(theme.DIM))]]
    if flight_recorder_run(store.meta):  # (its dumps hold collectives only)
        return [[("GPU / CPU: a Flight Recorder run has no device samples", theme.style(theme.DIM))]]
    return [[("GPU / CPU: waiting for samples…", theme.style(theme.DIM))]]


class GpuPanel(Panel):
    MIN_WIDTH = 60

    @staticmethod
    def rows_min(store: Store) -> int:
        return 1 if flight_recorder_run(store.meta) else 2

    rows_max = staticmethod(wanted_rows)

    def build_lines(self, frame: Frame) -> list[Parts]:
        return build(frame.store, self.inner[0] or 80, self.inner[1] or 3)
