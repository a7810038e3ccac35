#!/usr/bin/env python
"""P11: many ranks into the real collector and store (no torch).

`ddptui.live.loadgen` in its own process simulates N ranks (one Unix-socket connection each, the
run's token, pre-built frames of a synthetic medium run, naive and DDP, 10 steps a second);
this process runs the real Collector (its own thread) and Store, and calls `Store.update()`
ten times a second as the UI does. Figures per N: spans the store took against spans sent
(nothing may be lost), frames rejected, how far the generator fell behind its pace (the
socket pushes back when the collector reads too slowly), the collector thread's CPU share,
the update's CPU share and the steps whose figures were complete when the sender finished
and 10 s later. Ends with `P11 ingest_1024 lost_spans=0 goal<=0 OK`.

    .venv/bin/python benchmarks/p11_scale.py            # 64, 256 and 1,024 ranks, 10 s each
    .venv/bin/python benchmarks/p11_scale.py --quick    # 64 and 256 ranks, 3 s each
"""
from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

import psutil

from _common import ROOT, env_for_ranks, result_line

from ddptui.ingest.collector import Collector
from ddptui.model.store import Store


def thread_cpu(tid: int) -> float:
    for t in psutil.Process().threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


def one(n: int, seconds: float, rate: float) -> dict:
    store = Store()
    token = secrets.token_hex(16)
    col = Collector(store, token)
    env = env_for_ranks()
    env["DDPTUI_TOKEN"] = token
    c0 = thread_cpu(col._thread.native_id)
    gen = subprocess.Popen([sys.executable, "-m", "ddptui.live.loadgen", "--socket", col.path, "--ranks", str(n),
                            "--rate", str(rate), "--seconds", str(seconds)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    upd, t_start = 0.0, None
    while gen.poll() is None:
        if t_start is None and store.spans:  # the sender connected and started its steps
            t_start, c0, upd = time.monotonic(), thread_cpu(col._thread.native_id), 0.0
        a = time.thread_time()
        store.update()
        upd += time.thread_time() - a
        time.sleep(0.1)
    wall = time.monotonic() - (t_start or time.monotonic())
    got_at_end = store.spans
    out, err = gen.communicate()
    col_cpu = thread_cpu(col._thread.native_id) - c0
    line = (out.strip().splitlines() or [""])[-1]
    if gen.returncode != 0 or "spans)" not in line:
        col.close()
        sys.exit(f"P11: the load generator failed ({gen.returncode}): {(err.strip().splitlines() or ['?'])[-1]}")
    sent_spans = int(line.split(" spans)")[0].rsplit(" ", 1)[-1])
    behind = float(line.rsplit("behind ", 1)[1].split(" ")[0])
    steps = round(rate * seconds)
    done_at_end = min(len(store.complete_steps(s)) for s in ("naive", "ddp"))
    deadline = time.monotonic() + 10
    while store.spans < sent_spans and time.monotonic() < deadline:
        time.sleep(0.05)
    a = time.thread_time()
    store.update()
    upd_last = time.thread_time() - a
    got = store.spans
    col.close()
    return {"n": n, "sent": sent_spans, "got": got, "got_at_end": got_at_end, "lost": sent_spans - got, "rejected": store.rejected,
            "behind": behind, "col_pct": 100 * col_cpu / max(wall, 1e-9), "upd_pct": 100 * upd / max(wall, 1e-9), "wall": wall,
            "steps": steps, "done_at_end": done_at_end, "upd_last": upd_last,
            "done": min(len(store.complete_steps(s)) for s in ("naive", "ddp"))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P11: many simulated ranks into the real collector and store")
    p.add_argument("--quick", action="store_true", help="64 and 256 ranks, 3 s each")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 64,256,1024)")
    p.add_argument("--seconds", type=float, default=None, help="seconds of load each (default 10)")
    a = p.parse_args(argv)
    ns = [int(x) for x in (a.ranks or ("64,256" if a.quick else "64,256,1024")).split(",")]
    secs = a.seconds or (3.0 if a.quick else 10.0)
    print(f"P11 load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    rows = [one(n, secs, 10.0) for n in ns]
    for r in rows:
        print(f"P11 {r['n']} ranks x 10 steps/s x {secs:g} s: spans sent {r['sent']}, taken {r['got']} "
              f"(lost {r['lost']}; {100 * r['got_at_end'] / r['sent']:.0f} % in when the sender finished), rejected {r['rejected']}, sender behind its pace by {r['behind']:.2f} s; "
              f"collector thread {r['col_pct']:.0f} % of a core, Store.update {r['upd_pct']:.0f} % "
              f"(+{r['upd_last']:.1f} s to catch up at the end); steps with figures when the sender finished "
              f"{r['done_at_end']}/{r['steps']}, after {r['done']}/{r['steps']}")
    print(f"P11 load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in rows:
        print(result_line("P11", f"ingest_{r['n']}", "lost_spans", r["lost"], "<=", 0, "{:d}"))
        print(result_line("P11", f"pace_{r['n']}", "behind_s", r["behind"], "<=", 1.0, "{:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
