"""NVML through nvidia-ml-py (``import pynvml``), every call wrapped.

A metric the GPU does not support is N/A and never polled again; any other failure shows
N/A for that sample, and after three failures in a row the metric is dropped too. No NVML
at all (no driver, no GPU) is a normal state: device_count() is 0.
"""
from __future__ import annotations

import time

from ranks import frames

try:
    import pynvml as _pynvml
except ImportError:  # reported by the CLI as a broken install
    _pynvml = None

_state: dict = {}


def init(lib=None) -> bool:
    lib = lib or _pynvml
    if lib is None:
        return False
    key = id(lib)
    if key not in _state:
        try:
            lib.nvmlInit()
            _state[key] = True
        except Exception:  # noqa: BLE001 - no driver / no GPU
            _state[key] = False
    return _state[key]


def device_count(lib=None) -> int:
    lib = lib or _pynvml
    if not init(lib):
        return 0
    try:
        return int(lib.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0


ALL_LINKS = 0xFFFFFFFF  # field-value scope id: the sum over every NVLink (scope 0 is link 0 only)
PCIE_BLOCKING_EVERY_NS = 5_000_000_000  # nvmlDeviceGetPcieThroughput blocks ~20 ms a call


def _field_values(lib, h, ids) -> tuple:
    """Cumulative counters as floats; an unsupported field raises like a failed call."""
    out = []
    for v in lib.nvmlDeviceGetFieldValues(h, list(ids)):
        ret = getattr(v, "nvmlReturn", 0)
        if ret != 0:
            nse = getattr(lib, "NVMLError_NotSupported", None)
            raise nse() if nse is not None and ret == getattr(lib, "NVML_ERROR_NOT_SUPPORTED", 3) \
                else lib.NVMLError(ret)
        out.append(float(getattr(v.value, _VALUE_MEMBER.get(getattr(v, "valueType", 3), "ullVal"))))
    return tuple(out)


# nvmlValueType_t -> the member of the value union that holds it (a 32-bit counter read as
# ullVal could carry another field's bytes above its own)
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
WRAP_32 = 2 ** 32  # NVML's PCIe byte counters wrap here ("Value can be wrapped"): every 4 GiB on an H100


def _delta(c: float, p: float) -> float | None:
    """How far a cumulative counter moved from p to c: across a 32-bit wrap when it went back
    and both readings fit 32 bits, else None (a reset; never a negative rate)."""
    d = c - p
    if d >= 0:
        return d
    if 0 <= p < WRAP_32 and 0 <= c < WRAP_32:
        return d + WRAP_32
    return None


def _metrics(lib):
    def util(h):
        return float(lib.nvmlDeviceGetUtilizationRates(h).gpu)

    def mem(h):
        m = lib.nvmlDeviceGetMemoryInfo(h)
        return (m.used / 2**20, m.total / 2**20)

    def power(h):
        return lib.nvmlDeviceGetPowerUsage(h) / 1000.0

    def sm_clock(h):
        return float(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))

    def pcie_bytes(h):  # cumulative byte counters (no waiting); the sampler makes rates
        return _field_values(lib, h, [(lib.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
                                      (lib.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0)])

    def pcie(h):  # KB/s -> MB/s, tx and rx; blocks ~20 ms per call: the fallback, seldom
        return (lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES) / 1024,
                lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_RX_BYTES) / 1024)

    def nvlink(h):  # cumulative KiB counters over all links; the sampler turns them into MB/s
        return _field_values(lib, h, [(lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                                      (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)])

    return {"util": util, "mem": mem, "power_w": power, "sm_clock_mhz": sm_clock,
            "pcie_bytes": pcie_bytes, "pcie_mbs": pcie, "nvlink_kib": nvlink}


class _Gpm:
    """GPU Performance Monitoring (Hopper and later): the share of SMs busy between two
    samples. Unlike NVML's utilisation (any kernel running, so a NCCL kernel waiting on the
    network counts as 100 % busy) it says how much of the GPU computes."""

    def __init__(self, lib, h):
        self.lib, self.h = lib, h
        if not lib.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            raise lib.NVMLError_NotSupported()
        self.prev = lib.nvmlGpmSampleAlloc()
        self.cur = lib.nvmlGpmSampleAlloc()
        lib.nvmlGpmSampleGet(h, self.prev)

    def sm_util(self) -> float:
        lib = self.lib
        lib.nvmlGpmSampleGet(self.h, self.cur)
        g = lib.c_nvmlGpmMetricsGet_t()
        g.version = lib.NVML_GPM_METRICS_GET_VERSION
        g.numMetrics = 1
        g.sample1, g.sample2 = self.prev, self.cur
        g.metrics[0].metricId = lib.NVML_GPM_METRIC_SM_UTIL
        lib.nvmlGpmMetricsGet(g)
        self.prev, self.cur = self.cur, self.prev
        if g.metrics[0].nvmlReturn != 0:
            raise lib.NVMLError(g.metrics[0].nvmlReturn)
        return float(g.metrics[0].value)


def _uuid(lib, h) -> str | None:
    try:
        u = lib.nvmlDeviceGetUUID(h)
        return u.decode() if isinstance(u, bytes) else str(u)
    except Exception:  # noqa: BLE001
        return None


class GpuSampler:
    """sample() -> frames.Gpu(ts=ns, gpus=[frames.GpuSample(index, name, uuid, util, sm_active,
    ...)]). Values are None (N/A) where unsupported or failing.

    `uuids`: sample only these GPUs (the run's, as its ranks report them: CUDA and NVML may
    number devices differently, a UUID is the same everywhere)."""

    MAX_FAILS = 3

    def __init__(self, lib=None, uuids=None):
        self.lib = lib or _pynvml
        self.ok = init(self.lib)
        self.handles = []
        self.names = []
        self.uuids: list[str | None] = []
        self.dead: set[tuple[int, str]] = set()
        self.fails: dict[tuple[int, str], int] = {}
        self.calls = 0
        self._prev: dict[tuple[int, str], tuple[int, tuple]] = {}
        self._pcie_at: dict[int, int] = {}
        self._pcie_last: dict[int, tuple] = {}
        self._gpm: dict[int, _Gpm] = {}
        if self.ok:
            for i in range(device_count(self.lib)):
                try:
                    h = self.lib.nvmlDeviceGetHandleByIndex(i)
                except Exception:  # noqa: BLE001
                    continue
                self.handles.append((i, h))
                self.uuids.append(_uuid(self.lib, h))
                try:
                    name = self.lib.nvmlDeviceGetName(h)
                    self.names.append(name.decode() if isinstance(name, bytes) else str(name))
                except Exception:  # noqa: BLE001
                    self.names.append(f"GPU {i}")
        self.fns = _metrics(self.lib) if self.ok else {}
        if uuids:
            self.select(uuids)

    def select(self, uuids) -> None:
        """Keep only the GPUs with these UUIDs (when any matches)."""
        want = set(uuids)
        keep = [k for k, u in enumerate(self.uuids) if u in want]
        if keep:
            self.handles = [self.handles[k] for k in keep]
            self.names = [self.names[k] for k in keep]
            self.uuids = [self.uuids[k] for k in keep]

    @property
    def has_gpus(self) -> bool:
        return bool(self.handles)

    def _call(self, i: int, name: str, fn, *args):
        key = (i, name)
        if key in self.dead:
            return None
        self.calls += 1
        try:
            v = fn(*args)
        except Exception as e:  # noqa: BLE001
            not_supported = getattr(self.lib, "NVMLError_NotSupported", None)
            if (not_supported is not None and isinstance(e, not_supported)) or isinstance(e, AttributeError):
                self.dead.add(key)
            else:
                self.fails[key] = self.fails.get(key, 0) + 1
                if self.fails[key] >= self.MAX_FAILS:
                    self.dead.add(key)
            return None
        self.fails.pop(key, None)
        return v

    def _metric(self, i: int, name: str, h):
        return self._call(i, name, self.fns[name], h)

    def _rate(self, i: int, name: str, now: int, counters, scale: float):
        """(tx, rx) per second from cumulative counters, or (None, None)."""
        if not counters:
            return None, None
        prev = self._prev.get((i, name))
        self._prev[(i, name)] = (now, counters)
        dt = (now - prev[0]) / 1e9 if prev else 0
        if dt <= 0:
            return None, None
        deltas = [_delta(c, p) for c, p in zip(counters, prev[1])]
        return tuple(None if d is None else d * scale / dt for d in deltas)

    def _pcie(self, i: int, h, now: int):
        got = self._metric(i, "pcie_bytes", h)
        if got is not None or (i, "pcie_bytes") not in self.dead:
            return self._rate(i, "pcie_bytes", now, got, 1 / 2**20)
        # no counters on this GPU: the blocking call, once in a while, its value carried over
        if now - self._pcie_at.get(i, -PCIE_BLOCKING_EVERY_NS) >= PCIE_BLOCKING_EVERY_NS:
            self._pcie_at[i] = now
            self._pcie_last[i] = self._metric(i, "pcie_mbs", h) or (None, None)
        return self._pcie_last.get(i, (None, None))

    def _sm_active(self, i: int, h):
        gpm = self._gpm.get(i)
        if gpm is None:
            gpm = self._call(i, "sm_active", _Gpm, self.lib, h)
            if gpm is None:
                return None
            self._gpm[i] = gpm
            return None  # the first sample only starts the interval
        return self._call(i, "sm_active", gpm.sm_util)

    def sample(self) -> frames.Gpu:
        now = time.monotonic_ns()
        gpus = []
        for ((i, h), name), uuid in zip(zip(self.handles, self.names), self.uuids):
            util = self._metric(i, "util", h)
            sm_active = self._sm_active(i, h)
            mem = self._metric(i, "mem", h)
            mem_used, mem_total = mem if mem else (None, None)
            power = self._metric(i, "power_w", h)
            sm_clock = self._metric(i, "sm_clock_mhz", h)
            pcie_tx, pcie_rx = self._pcie(i, h, now)
            nv = self._metric(i, "nvlink_kib", h)
            nvlink_tx, nvlink_rx = self._rate(i, "nvlink_kib", now, nv, 1 / 1024)
            gpus.append(frames.GpuSample(
                index=i, name=name, uuid=uuid, util=util, sm_active=sm_active, mem_used_mb=mem_used,
                mem_total_mb=mem_total, power_w=power, sm_clock_mhz=sm_clock, pcie_tx_mbs=pcie_tx,
                pcie_rx_mbs=pcie_rx, nvlink_tx_mbs=nvlink_tx, nvlink_rx_mbs=nvlink_rx))
        return frames.Gpu(ts=now, gpus=gpus)


class CpuSampler:
    """Per-rank CPU utilisation (psutil), for machines without NVML."""

    def __init__(self):
        self.procs: dict[int, object] = {}

    def sample(self, rank_pids: dict[int, int]) -> frames.Cpu:
        """frames.Cpu(ts=ns, ranks={"0": percent of a core, ...}): None for a rank's first
        sample (it starts the interval) and for a process that is gone."""
        import psutil
        ranks = {}
        for r, pid in rank_pids.items():
            p = self.procs.get(pid)
            try:
                if p is None:
                    p = self.procs[pid] = psutil.Process(pid)
                    p.cpu_percent(None)
                    ranks[r] = None
                else:
                    ranks[r] = p.cpu_percent(None)
            except psutil.Error:
                ranks[r] = None
        return frames.Cpu(ts=time.monotonic_ns(), ranks={str(r): v for r, v in ranks.items()})
