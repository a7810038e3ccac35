"""`ddptui --headless`: run, show progress on stderr, print the figures."""
from __future__ import annotations

import sys
import time

from .launcher import Plan
from .loop import watch
from ddptui.model.hostfigs import host_rows, span_text
from ddptui.reports.report import report_run
from .session import LiveRun, RunOptions
from ddptui.model.store import Store


class Progress:
    """Progress lines on stderr: each status/log line once, step counts at most 1/s."""

    def __init__(self, store: Store, err=None):
        self.store = store
        self.err = err or sys.stderr
        self.seen_log = 0  # the store's log sequence number printed up to
        self.phases: dict[int, str] = {}
        self.last_steps = 0.0
        self.last_text = ""

    def say(self, text: str) -> None:
        self.err.write(f"ddptui: {text}\n")  # (one write: see output.echo)
        self.err.flush()

    def update(self, steps_total: int) -> None:
        st = self.store
        self.seen_log, logs, lost = st.log_since(self.seen_log)
        ranks = {r: i.phase for r, i in st.rank_snapshot().items()}
        if lost:
            self.say(f"warning: {lost} log line(s) came faster than they could be shown (not shown)")
        for ts, level, text in logs:
            self.say(("warning: " if level == "warn" else "error: " if level == "error" else "") + text)
        for r, ph in sorted(ranks.items()):
            if self.phases.get(r) != ph and ph in ("rendezvous", "building", "training"):
                if ph != "training" or r == 0:
                    self.say(f"rank {r}: {ph}" + ("…" if ph != "training" else ""))
            self.phases[r] = ph
        now = time.monotonic()
        if now - self.last_steps >= 1.0:
            parts = []
            for s in st.strategies():
                k = st.latest_complete(s)
                if k is not None:
                    parts.append(f"{s} {k + 1}" + (f"/{steps_total}" if steps_total else ""))
            text = "steps: " + ", ".join(parts) if parts else ""
            if text and text != self.last_text:
                self.say(text)
                self.last_text = text
            self.last_steps = now


def run_headless(opts: RunOptions, plan: Plan, json_path: str | None, out=None, err=None,
                 store: Store | None = None) -> int:
    out = out or sys.stdout
    store = store if store is not None else Store()
    run = LiveRun(opts, plan, store)
    prog = Progress(store, err)
    if opts.record:
        prog.say(f"recording to {opts.record}")
    if not opts.steps:
        prog.say("--steps 0: running until Ctrl-C (then the report)")
    try:
        watch(run, prog, opts.steps, prog.say)
    except KeyboardInterrupt:
        _report(store, out, json_path, run, opts, err)
        return 130
    if run.state == "failed":
        print(f"ddptui: error: {run.message}", file=err or sys.stderr, flush=True)
        _report(store, out, json_path, run, opts, err)
        return 1
    _report(store, out, json_path, run, opts, err)
    return 0


def _report(store: Store, out, json_path, run: LiveRun, opts: RunOptions, err=None) -> None:
    report_run(store, json_path, lambda dropped: {"state": run.state, "message": run.message,
                                                  "recording": opts.record, "dropped_spans": dropped,
                                                  **({"recording_error": run.recording_error}
                                                     if run.recording_error else {}),
                                                  **clock_offsets(store)},
               out=out, err=err, recording=opts.record)
    if len(store.hosts()) > 1:  # multi-node: a line per host
        print("per host (last steps of the strategy with collectives; clocks on node 0's axis):", file=out)
        for h in host_rows(store, {}):
            off = "reference" if h["node"] == 0 else (
                "?" if h["offset_ns"] is None else
                f"{h['offset_ns'] / 1e6:+.3f} ms ± {h['uncertainty_ns'] / 1e3:.0f} µs"
                + (f" (refined from {h['collectives']} collectives)" if h["collectives"] else ""))
            last = "–" if h["last_pct"] is None else f"{h['last_pct']:.0f} %"
            print(f"  node {h['node']} {h['host']} {span_text(h['ranks'])} · clock {off} · "
                  f"last arriver {last} · waits {_fmt(h['wait_ms'])} ms · step {_fmt(h['step_ms'])} ms",
                  file=out)
    if opts.record and run.recording_error:  # (the warning said where and why)
        print(f"ddptui: recorded to {opts.record} up to where it stopped", file=err or sys.stderr)
    elif opts.record:
        print(f"ddptui: recorded to {opts.record}", file=err or sys.stderr)


def clock_offsets(store: Store) -> dict:
    """Multi-node: each host's clock offset onto node 0's and its uncertainty, and the
    figures per host (`hosts`)."""
    co = store.clock_offsets()
    if not co:
        return {}
    return {"clock_offsets": co, "hosts": host_rows(store, {})}


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.1f}"
