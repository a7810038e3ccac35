"""The GPU as the first H100 pass read it: PCIe counters that wrap, a utilisation that read 0 %
on a busy GPU, the GPU named in summary, its JSON and replay, and why communication dwarfs
compute when two ranks share one GPU over gloo. From the samples that pass recorded
(demo/gpu-h100-*.ddptui, tests/data/h100-nvml.csv: NVML next to nvidia-smi, 20 samples)."""
from __future__ import annotations

import csv
import json
import os
import types

import pytest
from rich.cells import cell_len

from ddptui.live import nvml
from ddptui.model import gpu
from ddptui.recording.loader import load
from ddptui.ui.widgets.gpu_panel import gpu_lines
from ddptui.ui.widgets.headline import build as build_headline
from ranks import frames

from .helpers import ROOT, StubNvml, run_cli

GLOO = os.path.join(ROOT, "demo", "gpu-h100-xlarge-2ranks-gloo.ddptui")
NCCL = os.path.join(ROOT, "demo", "gpu-h100-xlarge-1rank-nccl.ddptui")
NVML_CSV = os.path.join(ROOT, "tests", "data", "h100-nvml.csv")
H100 = "NVIDIA H100 80GB HBM3"


def text(line) -> str:
    return "".join(t for t, _ in line)


class WrappingNvml(StubNvml):
    """PCIe byte counters as the H100's driver gives them: 32-bit (valueType 1, in uiVal),
    growing `per` bytes a sample; one GPU."""

    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198
    NVML_ERROR_NOT_SUPPORTED = 3
    per = 3 * 2**29  # 1.5 GiB: past 4 GiB every third sample

    def __init__(self):
        self.total = 0

    def nvmlDeviceGetUUID(self, h):
        return "GPU-0000"

    def nvmlGpmQueryDeviceSupport(self, h):
        raise self.NVMLError_NotSupported()

    def nvmlDeviceGetFieldValues(self, h, ids):
        if ids[0][0] == self.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            self.total += self.per
        v = self.total % 2**32
        # (ullVal holds other bytes above a 32-bit value: read the member the type names)
        return [types.SimpleNamespace(nvmlReturn=0, valueType=1,
                                      value=types.SimpleNamespace(uiVal=v, ullVal=v + 2**40))
                for _ in ids]


def test_the_sampler_reads_wrapping_pcie_counters_as_positive_rates(monkeypatch):
    s = nvml.GpuSampler(lib=WrappingNvml())
    clock = iter(range(0, 10**12, 500_000_000))
    monkeypatch.setattr(nvml.time, "monotonic_ns", lambda: next(clock))
    rates = [(g.pcie_tx_mbs, g.pcie_rx_mbs) for _ in range(10) for g in s.sample().gpus]
    assert rates[0] == (None, None)  # a rate needs two samples
    assert all(r == (3072.0, 3072.0) for r in rates[1:]), rates  # 1.5 GiB / 0.5 s, across 3 wraps


def test_a_counter_that_goes_back_beyond_32_bits_is_no_reading():
    assert nvml._delta(5.0, 2.0**32 - 3) == 8.0  # a 32-bit wrap
    assert nvml._delta(5.0, 2.0**40) is None  # a 64-bit counter reset: N/A, never negative


def test_the_recorded_h100_samples_are_mended_as_they_come_in():
    raw = [f for f in (load(GLOO).store.samples()[0])]
    assert all((g.pcie_tx_mbs or 0) >= 0 and (g.pcie_rx_mbs or 0) >= 0 for f in raw for g in f.gpus)
    # the one the live panel showed as "PCIe ↑-4168 MB/s": 0.502 s after the sample before it
    (f,) = [f for f in raw if f.ts == 391671675060]
    prev = raw[raw.index(f) - 1]
    got = f.gpus[0].pcie_tx_mbs
    assert got == pytest.approx(-4168.105769205189 + 4096 / ((f.ts - prev.ts) / 1e9))
    assert 3000 < got < 5000  # beside its neighbours' 3,100-3,800 MB/s
    # what the recording holds is left as it is: mended as it comes into a Store
    rows = [g.pcie_tx_mbs for g in f.gpus]
    again = gpu.unwrap(prev, frames.Gpu(ts=f.ts, gpus=[frames.GpuSample(index=0, pcie_tx_mbs=-4168.1)]))
    assert again.gpus[0].pcie_tx_mbs == pytest.approx(rows[0], abs=0.01)
    # no sample before it, or a drop no wrap explains: N/A
    assert gpu.unwrap(None, again).gpus[0].pcie_tx_mbs >= 0
    lone = frames.Gpu(ts=10, gpus=[frames.GpuSample(index=0, pcie_rx_mbs=-5.0)])
    assert gpu.unwrap(None, lone).gpus[0].pcie_rx_mbs is None
    assert gpu.unwrap(frames.Gpu(ts=0, gpus=[]), frames.Gpu(ts=10**12, gpus=[frames.GpuSample(
        index=0, pcie_tx_mbs=-100.0)])).gpus[0].pcie_tx_mbs is None


def test_the_panel_never_shows_a_negative_rate_on_the_h100_samples():
    got = load(GLOO)
    samples = got.store.samples()[0]
    ranks_of = {g.uuid: [0, 1] for g in samples[-1].gpus}
    shown = [text(line) for k in range(2, len(samples) + 1) for line in gpu_lines(samples[:k], 160, 10, ranks_of)]
    pcie = [t for t in shown if "PCIe" in t]
    assert len(pcie) == len(samples) - 1
    assert not any("↑-" in t or "↓-" in t for t in pcie)
    assert any("GB/s" in t.split("PCIe")[1] for t in pcie)  # the gloo traffic: ~3-4 GB/s each way


def nvml_csv_samples() -> list[frames.Gpu]:
    """tests/data/h100-nvml.csv (NVML as ddptui samples it, next to nvidia-smi, one row a
    second while the GPU computes) as the gpu frames the sampler made."""
    out = []
    with open(NVML_CSV) as f:
        for row in csv.DictReader(f):
            num = (lambda k: float(row[k]) if row[k] else None)  # noqa: E731
            out.append(frames.Gpu(ts=int(float(row["t_s"]) * 1e9), gpus=[frames.GpuSample(
                index=0, name=H100, uuid="GPU-d3c0", util=num("util"), sm_active=num("sm_active"),
                mem_used_mb=num("mem_mb"), mem_total_mb=81559.0, power_w=num("power_w"),
                sm_clock_mhz=num("sm_mhz"), pcie_tx_mbs=num("pcie_tx_mbs"))]))
    return out


def test_a_busy_gpu_whose_utilisation_reads_zero_is_shown_by_its_sm_activity():
    samples = nvml_csv_samples()
    idle_util = [s for s in samples if s.gpus[0].util == 0.0 and (s.gpus[0].sm_active or 0) > 40]
    assert len(idle_util) >= 12  # the pass's reading: 0 % with the SMs 41-47 % busy at 221-245 W
    k = samples.index(idle_util[-1]) + 1
    first, second = [text(x) for x in gpu_lines(samples[:k], 120, 3, {"GPU-d3c0": [0, 1]})[1:]]
    sm = idle_util[-1].gpus[0].sm_active
    assert f"SM active {sm:>3.0f}%" in first and "util" not in first.split("mem")[0]
    assert "NVML util 0%" in second and "W" in second
    # utilisation reading again (96-98 %): shown as utilisation, the SM activity beside it
    first, second = [text(x) for x in gpu_lines(samples, 120, 3, {"GPU-d3c0": [0, 1]})[1:]]
    assert "util  98%" in first and "SM active 50%" in second and "NVML util" not in second
    # idle: both read 0, and 0 is what it shows
    idle = frames.GpuSample(index=0, util=0.0, sm_active=0.0)
    assert gpu.busy(idle) == (0.0, "util") and gpu.busy(None) == (None, "util")


def test_summary_its_json_and_replay_name_the_gpu(tmp_path):
    js = tmp_path / "s.json"
    r = run_cli("summary", GLOO, "--json", str(js))
    assert r.returncode == 0, r.stderr
    assert f"on 1x {H100} (2 ranks share it)" in r.stdout
    doc = json.loads(js.read_text())
    assert doc["gpu"] == {"name": H100, "count": 1, "ranks": 2} and doc["device"] == "cuda"
    # why communication dwarfs compute here, and what NVLink would do with the same bytes
    why = [x for x in r.stdout.splitlines() if x.startswith("why comm dwarfs compute:")]
    assert len(why) == 1 and "208 MB a step" in why[0] and "over gloo" in why[0]
    assert "NVLink (450 GB/s)" in why[0] and "ddptui demo --profile h100-nvlink --model xlarge --gpus 2" in why[0]
    assert why[0].endswith(f"ddptui whatif {GLOO} --bus-gbps 450")  # (the recording named)
    r = run_cli("replay", NCCL, "--headless", "--json", str(js))
    assert r.returncode == 0, r.stderr
    assert f"on 1x {H100} ·" in r.stdout and "share" not in r.stdout and "why comm" not in r.stdout
    assert json.loads(js.read_text())["gpu"] == {"name": H100, "count": 1, "ranks": 1}
    r = run_cli("summary", os.path.join(ROOT, "demo", "cpu-small-2ranks.ddptui"), "--json", str(js))
    assert r.returncode == 0 and json.loads(js.read_text())["gpu"] is None and "why comm" not in r.stdout


def test_the_headline_says_why_comm_dwarfs_compute_on_a_shared_gpu():
    store = load(GLOO).store
    rows = store.summaries()
    why = gpu.shared_gpu_note(store.meta, rows)
    assert len(why) == 4 and "1.9 GB/s" in why[0] and "comm 110 ms vs compute 8.7 ms" in why[0]
    from ddptui.model import figures
    sp = figures.speedups(rows)
    for width in (60, 80, 120, 200):
        (line,) = build_headline(rows, sp, width, why=why)
        t = text(line)
        assert cell_len(t) <= width and "1.23× faster" in t
        if width >= 80:
            assert "over gloo" in t
        if width >= 120:
            assert "NVLink ≈ 0.9 ms" in t
    # a run that does not share a GPU says nothing of it
    assert gpu.shared_gpu_note(load(NCCL).store.meta, load(NCCL).store.summaries()) == []


@pytest.mark.asyncio
async def test_replaying_the_h100_run_shows_the_gpu_and_the_lesson():
    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.app import DdpApp
    app = DdpApp(ReplaySource(GLOO))
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("space", "g", "3", "0", "enter")
        await app.workers.wait_for_complete()
        for _ in range(20):
            await pilot.pause(0.1)
            if "over gloo" in app.headline.plain:
                break
        title = app.title_line.plain
        head = app.headline.plain
    assert f"1x {H100} (2 ranks share it)" in title
    assert "over gloo" in head and "NVLink" in head, head


@pytest.mark.gpu
def test_real_pcie_rates_are_never_negative_while_the_host_copies():
    """On the GPU: 4 s of host-device copies (2-4 GB/s and more: past a 32-bit counter's 4 GiB
    within seconds), sampled every 0.25 s: every PCIe rate a reading or N/A, never negative; on
    a GPU with GPM (Hopper and later) the SM activity is read."""
    import threading
    import time

    import torch
    s = nvml.GpuSampler()
    assert s.has_gpus
    stop = threading.Event()

    def copy():
        host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
        dev = torch.empty_like(host, device="cuda")
        while not stop.is_set():
            dev.copy_(host, non_blocking=True)
            host.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
    th = threading.Thread(target=copy, daemon=True)
    th.start()
    try:
        got = []
        for _ in range(16):
            got += [g for g in s.sample().gpus]
            time.sleep(0.25)
    finally:
        stop.set()
        th.join()
    rates = [r for g in got for r in (g.pcie_tx_mbs, g.pcie_rx_mbs) if r is not None]
    assert rates and min(rates) >= 0, rates
    assert max(rates) > 100, rates  # the copies were seen
    if "H100" in (got[-1].name or "") or "H200" in (got[-1].name or ""):
        assert any(g.sm_active is not None for g in got)
