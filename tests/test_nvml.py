"""NVML sampling: which calls are made and how (on a pynvml stand-in: the real one needs a
GPU), and once on the real NVML where a GPU exists."""
from __future__ import annotations

import types

import pytest

from ddptui.live import nvml

from .helpers import StubNvml


class Field(types.SimpleNamespace):
    pass


class CountingNvml(StubNvml):
    """Counters that grow 1 MiB (PCIe) / 1 GiB (NVLink, KiB units) per call; records every
    field request with its scope, and every blocking PCIe call."""

    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    count = 2
    pcie_counters = True

    def __init__(self):
        self.requests: list = []
        self.blocking = 0
        self.n = 0

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:04d}"

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.requests.append(list(ids))
        self.n += 1
        out = []
        for fid, scope in ids:
            if fid in (197, 198) and not self.pcie_counters:
                out.append(Field(nvmlReturn=3, value=None))
                continue
            per = 2**20 if fid in (197, 198) else 2**20  # bytes / KiB
            out.append(Field(nvmlReturn=0, value=types.SimpleNamespace(ullVal=self.n * per)))
        return out

    def nvmlDeviceGetPcieThroughput(self, h, which):
        self.blocking += 1
        return 2048

    # GPM: 40 % of SMs busy between any two samples
    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - the pynvml name
        def __init__(self):
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)]

    def nvmlGpmQueryDeviceSupport(self, h):
        return types.SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        return object()

    def nvmlGpmSampleGet(self, h, s):
        return s

    def nvmlGpmMetricsGet(self, g):
        assert g.sample1 is not g.sample2 and g.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL
        g.metrics[0].value = 40.0
        return g


def test_nvlink_reads_all_links_and_pcie_uses_counters_not_the_blocking_call(monkeypatch):
    lib = CountingNvml()
    s = nvml.GpuSampler(lib=lib)
    clock = iter(range(0, 10**12, 500_000_000))
    monkeypatch.setattr(nvml.time, "monotonic_ns", lambda: next(clock))
    first, second = s.sample(), s.sample()
    nv = [r for r in lib.requests if r[0][0] == lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX]
    assert nv and all(scope == nvml.ALL_LINKS for r in nv for _, scope in r)
    assert lib.blocking == 0
    g = second.gpus[0]
    assert first.gpus[0].pcie_tx_mbs is None  # a rate needs two samples
    assert g.pcie_tx_mbs > 0 and g.nvlink_tx_mbs > 0
    assert g.sm_active == 40.0 and first.gpus[0].sm_active is None
    assert [x.uuid for x in second.gpus] == ["GPU-0000", "GPU-0001"]


def test_without_pcie_counters_the_blocking_call_is_rare(monkeypatch):
    lib = CountingNvml()
    lib.pcie_counters = False
    s = nvml.GpuSampler(lib=lib)
    clock = iter(range(0, 10**12, 500_000_000))  # a sample every 0.5 s
    monkeypatch.setattr(nvml.time, "monotonic_ns", lambda: next(clock))
    samples = [s.sample() for _ in range(20)]  # 10 s
    assert lib.blocking == 2 * 2 * 2  # two GPUs, tx and rx, at 0 s and 5 s
    assert all(g.pcie_tx_mbs == 2.0 for x in samples for g in x.gpus)


def test_sampler_keeps_only_the_runs_gpus_by_uuid():
    s = nvml.GpuSampler(lib=CountingNvml(), uuids=["GPU-0001"])
    assert [g.index for g in s.sample().gpus] == [1]


@pytest.mark.gpu
def test_real_nvml_sample():
    s = nvml.GpuSampler()
    assert s.has_gpus
    for _ in range(2):
        got = s.sample()
    g = got.gpus[0]
    assert g.uuid and g.util is not None and g.mem_total_mb > 0


def test_run_sees_only_the_planned_gpus():
    from ddptui.live.launcher import visible_devices
    assert visible_devices(1, None) == "0"
    assert visible_devices(2, "") == "0,1"
    assert visible_devices(1, "3,5,7") == "3"
    assert visible_devices(2, "GPU-aa, GPU-bb,GPU-cc") == "GPU-aa,GPU-bb"


def test_gpu_panel_names_the_ranks_on_each_gpu_sm_activity_and_clock_residual():
    from ddptui.ui.widgets.gpu_panel import gpu_lines
    s = nvml.GpuSampler(lib=CountingNvml())
    samples = [s.sample(), s.sample()]
    lines = gpu_lines(samples, 120, 10, {"GPU-0001": [0, 1]}, -3400)
    text = ["".join(t for t, _ in line) for line in lines]
    assert "clock residual 3.4 µs" in text[0]
    assert text[3].startswith("GPU1 r0,1 util") and not text[1].startswith("GPU0 r")
    assert "SM active 40%" in text[2]
