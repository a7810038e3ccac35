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

--ui: the same pipeline with the app on it (P11ui): the generator's ranks (rank 3 slow in
fc2 by 40 ms) into the real Collector, Store and Updater, and DdpApp (headless, 200x50,
30 fps) drawing them. Figures per N: the drawing thread's share of a core (goal <= 20 %),
the whole process's, the frames drawn (ticks), the steps shown, spans lost.

    .venv/bin/python benchmarks/p11_scale.py            # 64, 256 and 1,024 ranks, 10 s each
    .venv/bin/python benchmarks/p11_scale.py --quick    # 64 and 256 ranks, 3 s each
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import time

import psutil

from _common import ROOT, env_for_ranks, result_line

from ddptui.ingest.collector import Collector
from ddptui.model.store import Store
from ddptui.model.updater import Updater


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


class LoadgenSource:
    """A Source (ddptui.ui.source) whose ranks are `ddptui.live.loadgen`'s: the real
    Collector and an Updater, as a LiveRun has them, without torch."""

    def __init__(self, n: int, seconds: float, rate: float, slow: str = "3:40:fc2"):
        self.store = Store()
        self.updater = Updater(self.store)
        self.n, self.seconds, self.rate, self.slow = n, seconds, rate, slow
        self.state, self.message = "starting", ""
        self.gen = self.collector = None

    def start(self) -> None:
        token = secrets.token_hex(16)
        self.collector = Collector(self.store, token)
        env = env_for_ranks()
        env["DDPTUI_TOKEN"] = token
        self.gen = subprocess.Popen([sys.executable, "-m", "ddptui.live.loadgen", "--socket", self.collector.path,
                                     "--ranks", str(self.n), "--rate", str(self.rate), "--seconds", str(self.seconds),
                                     "--slow", self.slow], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        self.updater.start()
        self.state = "running"

    def poll(self) -> bool:
        if self.state == "running" and self.gen is not None and self.gen.poll() is not None:
            self.state, self.message = "finished", "the load generator finished"
        return self.state != "running"

    def stop(self, why: str = "") -> None:
        if self.gen is not None and self.gen.poll() is None:
            self.gen.kill()
        if self.gen is not None:
            self.gen.communicate()
        if self.collector is not None:
            self.collector.close()
        self.updater.stop()
        self.state = "stopped"


async def ui_one(n: int, seconds: float, rate: float) -> dict:
    from ddptui.ui.app import DdpApp

    src = LoadgenSource(n, seconds + 5, rate)
    app = DdpApp(src, fps=30)
    async with app.run_test(size=(200, 50)) as pilot:
        deadline = time.monotonic() + 60
        while src.store.latest_complete("ddp") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        first, ticks0 = src.store.latest_complete("ddp") or 0, app._ticks
        c0, t0, w0 = time.process_time(), time.thread_time(), time.monotonic()
        # freshness: when each ddp step was complete in the store (every rank's spans in), and
        # when the screen first showed it or a newer one (polled every 10 ms)
        done_at: dict[int, float] = {}
        shown_at: dict[int, float] = {}
        last_done, last_shown = first, first
        while time.monotonic() - w0 < seconds:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            d = src.store.latest_complete("ddp") or 0
            for k in range(last_done + 1, d + 1):
                done_at[k] = now
            last_done = max(last_done, d)
            sh = app.shown_steps().get("ddp") or 0
            for k in range(last_shown + 1, sh + 1):
                shown_at[k] = now
            last_shown = max(last_shown, sh)
        cpu, ui, wall = time.process_time() - c0, time.thread_time() - t0, time.monotonic() - w0
        shown = (app.shown_steps().get("ddp") or 0) - first
        lags = sorted(shown_at[k] - done_at[k] for k in done_at if k in shown_at)
        unshown = [k for k in done_at if k not in shown_at]
        ticks = app._ticks - ticks0
        culprit = any("culprit" in pane.render_line(y).text for pane in app.panes.values()
                      for y in range(pane.size.height))
        await pilot.press("q")
        await pilot.pause(0.5)
    src.stop()
    sent = int(seconds * rate)
    return {"n": n, "ui_pct": 100 * ui / wall, "proc_pct": 100 * cpu / wall, "ticks": ticks,
            "fps": ticks / wall, "shown": shown, "wall": wall, "rejected": src.store.rejected, "culprit": culprit,
            "sent": sent, "lag_max": lags[-1] if lags else None, "lag_p50": lags[len(lags) // 2] if lags else None,
            "complete": len(done_at), "unshown": len(unshown)}


def _s(x) -> str:
    return "—" if x is None else f"{x:.2f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="P11: many simulated ranks into the real collector and store")
    p.add_argument("--quick", action="store_true", help="64 and 256 ranks, 3 s each")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 64,256,1024)")
    p.add_argument("--seconds", type=float, default=None, help="seconds of load each (default 10)")
    p.add_argument("--ui", action="store_true", help="the app on the pipeline: the drawing thread's share (P11ui)")
    a = p.parse_args(argv)
    from ddptui.cli.common import tune_gc
    tune_gc()  # (as the command line sets the process up)
    ns = [int(x) for x in (a.ranks or ("64,256" if a.quick else "64,256,1024")).split(",")]
    secs = a.seconds or (3.0 if a.quick else 10.0)
    if a.ui:
        rows = [asyncio.run(ui_one(n, secs, 10.0)) for n in ns]
        for r in rows:
            print(f"P11ui {r['n']} ranks x 10 steps/s, the app at 30 fps over {r['wall']:.1f} s: drawing thread "
                  f"{r['ui_pct']:.1f} % of a core, the whole process {r['proc_pct']:.0f} %; {r['ticks']} frames "
                  f"({r['fps']:.1f}/s), {r['shown']} newer steps shown of {r['sent']} sent ({r['complete']} complete "
                  f"in the store, {r['unshown']} of them not yet on screen at the end), from a step complete to "
                  f"on screen median {_s(r['lag_p50'])} max {_s(r['lag_max'])}, {r['rejected']} frames rejected, "
                  f"the slow rank's lane labelled culprit: {'yes' if r['culprit'] else 'no'}")
        for r in rows:
            print(result_line("P11ui", f"draw_{r['n']}", "cpu_pct", r["ui_pct"], "<=", 20.0, "{:.1f}"))
            print(result_line("P11ui", f"shown_{r['n']}", "steps", r["shown"], ">=", int(0.94 * r["sent"]), "{:d}"))
            print(result_line("P11ui", f"fresh_{r['n']}", "lag_max_s", r["lag_max"] if r["lag_max"] is not None
                              else 99.0, "<=", 1.0, "{:.2f}"))
            print(result_line("P11ui", f"cpu_{r['n']}", "process_pct", r["proc_pct"], "<=", 150.0, "{:.0f}"))
        return 0
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
