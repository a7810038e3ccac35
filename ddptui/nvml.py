"""NVML through nvidia-ml-py (``import pynvml``), every call wrapped.

A metric the GPU does not support is N/A and never polled again; any other failure shows
N/A for that sample, and after three failures in a row the metric is dropped too. No NVML
at all (no driver, no GPU) is a normal state: device_count() is 0.
"""
from __future__ import annotations

import time

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

    def pcie(h):  # KB/s -> MB/s, tx and rx
        return (lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES) / 1024,
                lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_RX_BYTES) / 1024)

    def nvlink(h):  # cumulative KiB counters; the sampler turns them into MB/s
        ids = (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
        vals = lib.nvmlDeviceGetFieldValues(h, list(ids))
        out = []
        for v in vals:
            if getattr(v, "nvmlReturn", 0) != 0:
                raise lib.NVMLError(getattr(v, "nvmlReturn", 3))
            out.append(float(v.value.ullVal))
        return tuple(out)

    return {"util": util, "mem": mem, "power_w": power, "sm_clock_mhz": sm_clock,
            "pcie_mbs": pcie, "nvlink_kib": nvlink}


class GpuSampler:
    """sample() -> {"t": "gpu", "ts": ns, "gpus": [{index, name, util, mem_used_mb, ...}]}.
    Values are None (N/A) where unsupported or failing."""

    MAX_FAILS = 3

    def __init__(self, lib=None):
        self.lib = lib or _pynvml
        self.ok = init(self.lib)
        self.handles = []
        self.names = []
        self.dead: set[tuple[int, str]] = set()
        self.fails: dict[tuple[int, str], int] = {}
        self.calls = 0
        self._prev_nvlink: dict[int, tuple[float, tuple]] = {}
        if self.ok:
            for i in range(device_count(self.lib)):
                try:
                    h = self.lib.nvmlDeviceGetHandleByIndex(i)
                except Exception:  # noqa: BLE001
                    continue
                self.handles.append((i, h))
                try:
                    name = self.lib.nvmlDeviceGetName(h)
                    self.names.append(name.decode() if isinstance(name, bytes) else str(name))
                except Exception:  # noqa: BLE001
                    self.names.append(f"GPU {i}")
        self.fns = _metrics(self.lib) if self.ok else {}

    @property
    def has_gpus(self) -> bool:
        return bool(self.handles)

    def _call(self, i: int, name: str, h):
        key = (i, name)
        if key in self.dead:
            return None
        self.calls += 1
        try:
            v = self.fns[name](h)
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

    def sample(self) -> dict:
        now = time.monotonic_ns()
        gpus = []
        for (i, h), name in zip(self.handles, self.names):
            g = {"index": i, "name": name}
            g["util"] = self._call(i, "util", h)
            mem = self._call(i, "mem", h)
            g["mem_used_mb"], g["mem_total_mb"] = mem if mem else (None, None)
            g["power_w"] = self._call(i, "power_w", h)
            g["sm_clock_mhz"] = self._call(i, "sm_clock_mhz", h)
            pcie = self._call(i, "pcie_mbs", h)
            g["pcie_tx_mbs"], g["pcie_rx_mbs"] = pcie if pcie else (None, None)
            nv = self._call(i, "nvlink_kib", h)
            g["nvlink_tx_mbs"] = g["nvlink_rx_mbs"] = None
            if nv:
                prev = self._prev_nvlink.get(i)
                self._prev_nvlink[i] = (now, nv)
                if prev:
                    dt = (now - prev[0]) / 1e9
                    if dt > 0:
                        g["nvlink_tx_mbs"] = (nv[0] - prev[1][0]) / 1024 / dt
                        g["nvlink_rx_mbs"] = (nv[1] - prev[1][1]) / 1024 / dt
            gpus.append(g)
        return {"t": "gpu", "ts": now, "gpus": gpus}


class CpuSampler:
    """Per-rank CPU utilisation (psutil), for machines without NVML."""

    def __init__(self):
        self.procs: dict[int, object] = {}

    def sample(self, rank_pids: dict[int, int]) -> dict:
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
        return {"t": "cpu", "ts": time.monotonic_ns(), "ranks": {str(r): v for r, v in ranks.items()}}
