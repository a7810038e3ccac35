"""Shared test helpers: run real torchrun workers through LiveRun, find leftover processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_procs() -> list[psutil.Process]:
    """Every ranks.worker / torchrun process started by this test session still alive
    (tagged through the DDPTUI_TEST_SESSION environment variable they inherit)."""
    out = []
    me = os.getpid()
    tag = os.environ.get("DDPTUI_TEST_SESSION")
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cl = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] != me and ("ranks.worker" in cl or "torch.distributed.run" in cl):
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                if tag and p.environ().get("DDPTUI_TEST_SESSION") != tag:
                    continue
            except psutil.Error:
                continue
            out.append(p)
    return out


def wait_no_workers(timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = worker_procs()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = worker_procs()
    return left


def run_live(steps=4, model="small", strategies=("naive", "ddp"), ranks=2, batch=256,
             bucket_cap_mb=None, record=None, extra=(), timeout=120.0, **kw):
    """Run real torchrun ranks to completion in-process; returns the LiveRun."""
    from ddptui.launcher import plan
    from ddptui.session import LiveRun, RunOptions

    opts = RunOptions(model=model, strategies=list(strategies), steps=steps, batch_size=batch,
                      bucket_cap_mb=bucket_cap_mb, record=record, extra_worker_args=list(extra), **kw)
    run = LiveRun(opts, plan(ranks, None, "cpu"))
    run.start()
    deadline = time.monotonic() + timeout
    try:
        while not run.poll():
            if time.monotonic() > deadline:
                raise TimeoutError(f"run did not finish in {timeout} s")
            time.sleep(0.05)
    finally:
        if run.state in ("running", "starting"):
            run.stop("test timeout")
    return run


def ddptui_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "ddptui.cli", *args]


def run_cli(*args, timeout=120, env=None, input=None) -> subprocess.CompletedProcess:
    e = os.environ.copy()
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    return subprocess.run(ddptui_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env=e, cwd=ROOT, input=input)


class StubNvml:
    """A stand-in for the pynvml module (the real one needs a GPU and its driver): healthy
    GPUs by default; tests subclass it and override the calls that should fail."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    count = 1
    name = b"Stub GPU"

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.name

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=2**30, total=2**34)

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1500

    def nvmlDeviceGetPcieThroughput(self, h, which):
        return 2048

    def nvmlDeviceGetFieldValues(self, h, ids):
        raise self.NVMLError_NotSupported()
