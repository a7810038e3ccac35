#!/usr/bin/env python
"""(GPU pass) NVML as ddptui samples it, next to `nvidia-smi --query-gpu` at the same moments,
while the GPU works. Writes a CSV (one row per second: ddptui's util, memory, power, SM clock,
SM activity (GPM) and nvidia-smi's) and lists the metrics ddptui found unsupported.

    python benchmarks/gpu_nvml.py --seconds 20 --out nvml.csv
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMI = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,power.draw,clocks.sm",
       "--format=csv,noheader,nounits"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch

    from ddptui.live.nvml import GpuSampler
    s = GpuSampler()
    if not s.has_gpus:
        print("gpu_nvml: NVML sees no GPU", file=sys.stderr)
        return 2
    stop = threading.Event()

    def work():  # on and off: 0.5 s busy, 0.5 s idle
        x = torch.randn(4096, 4096, device="cuda")
        while not stop.is_set():
            t = time.monotonic()
            while time.monotonic() - t < 0.5:
                x = torch.tanh(x @ x * 1e-3)
                torch.cuda.synchronize()
            time.sleep(0.5)
    th = threading.Thread(target=work, daemon=True)
    th.start()
    rows = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.seconds:
        f = s.sample()
        smi = subprocess.run(SMI, capture_output=True, text=True).stdout.strip().splitlines()
        for g, line in zip(f.gpus, smi):
            v = [x.strip() for x in line.split(",")]
            rows.append((round(time.monotonic() - t0, 2), g.index, g.util, v[1], g.mem_used_mb, v[2],
                         g.power_w, v[3], g.sm_clock_mhz, v[4], g.sm_active,
                         g.pcie_tx_mbs, g.nvlink_tx_mbs))
        time.sleep(1.0)
    stop.set()
    th.join()
    with open(a.out, "w") as f:
        f.write("t_s,gpu,util,smi_util,mem_mb,smi_mem_mb,power_w,smi_power_w,sm_mhz,smi_sm_mhz,"
                "sm_active,pcie_tx_mbs,nvlink_tx_mbs\n")
        for r in rows:
            f.write(",".join("" if x is None else str(x) for x in r) + "\n")
    print(f"gpu_nvml: {len(rows)} samples; unsupported or failing: "
          f"{sorted(name for _, name in s.dead) or 'none'}; NVML calls {s.calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
