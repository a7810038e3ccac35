"""`ddptui attach HOST:PORT [--headless]`: a running job that started PyTorch's debug server
(`torch.distributed.debug.start_debug_server()`), watched from outside (ddptui/live/attach.py).

HOST:PORT is the job's MASTER_ADDR:MASTER_PORT, where its TCPStore listens; it is read as a
client only. Without --headless: the timeline UI, the collectives drawn per rank as they
come, a hang named in the headline with each late rank's line (key `o`: their stacks), key `p`
a torch.profiler window of every rank. With --headless: progress on stderr (`ddptui: ...`),
what is named on stdout (`hang: ...`, `desync: ...`, each late rank's `rank R is at FILE:LINE
in FUNC` and its stack, `resolved: ...`), until Ctrl-C, --duration, or the job ends;
--profile-s takes a profile once the job is seen training. Recorded like a live run
(--record, --no-record, --runs-dir): `ddptui replay` opens it.

Exit status: 0; 1 when a hang or desync is named and still stands at the end; 2 for a bad
command line, or a job that cannot be attached to (one line: no such host, nothing listening,
not a TCPStore, no debug server registered); 130 on Ctrl-C in the UI's stead (headless: 0 or 1
as above, Ctrl-C being how it ends).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from .common import CliError, JSON_METAVAR, Parser, json_target, record_path, require_terminal, sigterm_to_interrupt
from .options import add_numeric
from ddptui.live.attach import IDLE_S, TAIL, AttachError, AttachOptions, AttachRun
from ddptui.live.storeclient import parse_target
from ddptui.model import frwatch

PROGRESS_S = 10.0  # a progress line on stderr this often (headless)
NICE = 10  # --nice's default
UI_PROFILE_S = 2.0  # the UI's key p: a window this long, unless --profile-s


def parser() -> Parser:
    p = Parser(prog="ddptui attach",
               description="Watch a running job that called torch.distributed.debug.start_debug_server() "
                           "(nothing of ddptui inside it): every rank's Flight Recorder polled through its "
                           "own debug server, the collectives drawn per rank, a hang or desync named with "
                           "each late rank's Python stack (file, line, function). Read-only: it never "
                           "writes to the job's store or changes the job. Headless, it exits 1 when a hang or "
                           "desync stands at the end, 0 otherwise. docs/attach.md.")
    p.add_argument("target", metavar="HOST:PORT",
                   help="the job's MASTER_ADDR:MASTER_PORT (its TCPStore), e.g. node0:29500")
    p.add_argument("--headless", action="store_true",
                   help="no UI: progress on stderr, what is named (and each late rank's stack) on stdout")
    add_numeric(p, "--interval", default=1.0, metavar="S",
                help="seconds between polls of every rank at the start, while a collective stands stuck, a hang "
                     "is named or a rank does not answer (default 1)")
    add_numeric(p, "--idle-interval", default=None, metavar="S",
                help=f"seconds between polls while the job runs healthy: each poll makes every rank dump its "
                     f"Flight Recorder, so fewer cost the job less; such a poll reads each rank's newest {TAIL} "
                     f"entries (a job making more between two polls is drawn on a sample, said) (default "
                     f"{IDLE_S:g}, or --interval where that is longer; the same as --interval: one rate; never "
                     f"less than --interval)")
    add_numeric(p, "--nice", default=NICE, metavar="N",
                help=f"run at this much lower CPU priority (default {NICE}; 0: as started): where the job keeps "
                     f"the host's cores busy, the attach takes what they leave, not a share of the job's")
    add_numeric(p, "--hang-s", default=frwatch.HANG_S, metavar="S",
                help=f"inside one collective this long, with no progress in its group: a hang "
                     f"(default {frwatch.HANG_S:g}; above the job's slowest step names no slow step)")
    add_numeric(p, "--timeout", default=3.0, metavar="S",
                help="seconds to wait for the store and for each rank's answer (default 3)")
    add_numeric(p, "--max-reply-mb", default=64.0, metavar="MB",
                help="a rank's Flight Recorder reply larger than this is not read (default 64)")
    add_numeric(p, "--profile-s", default=None, metavar="S",
                help="headless: once the job is seen training, take S seconds of torch.profiler from every "
                     f"rank as a traces directory (ddptui replay DIR); the UI's key p: its window "
                     f"(default {UI_PROFILE_S:g})")
    add_numeric(p, "--duration", default=None, metavar="S",
                help="headless: stop after S seconds (default: at Ctrl-C, or when the job ends)")
    p.add_argument("--record", metavar="PATH", help="record to PATH (default: a new file in --runs-dir)")
    p.add_argument("--no-record", action="store_true", help="do not record")
    p.add_argument("--runs-dir", default=os.environ.get("DDPTUI_RUNS_DIR", "runs"), metavar="DIR",
                   help="where recordings go by default (default ./runs)")
    p.add_argument("--json", metavar=JSON_METAVAR,
                   help="headless: at the end, what was named as JSON to PATH (-: to stdout)")
    return p


def build(argv: list[str]) -> tuple:
    """The parsed command and the run, connected (CliError: one line)."""
    a = parser().parse_args(argv)
    try:
        host, port = parse_target(a.target)
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.json and not a.headless:
        raise CliError("--json needs --headless (the UI writes no JSON)")
    if a.duration is not None and not a.headless:
        raise CliError("--duration needs --headless (the UI runs until you quit)")
    if a.idle_interval is not None and a.idle_interval < a.interval:
        raise CliError(f"--idle-interval {a.idle_interval:g} s is less than --interval {a.interval:g} s: a healthy job "
                       f"is never polled more often than one that may hang (give --interval {a.idle_interval:g} for "
                       f"one rate)")
    json_path = json_target(a.json)
    idle = max(a.interval, IDLE_S if a.idle_interval is None else a.idle_interval)
    opts = AttachOptions(host, port, interval_s=a.interval, idle_s=idle, hang_s=a.hang_s,
                         timeout_s=a.timeout, cap_mb=a.max_reply_mb)
    run = AttachRun(opts)
    try:
        run.connect()
    except AttachError as e:
        raise CliError(str(e)) from None
    opts.record = record_path(a, "attach", run.world)
    return a, run, json_path


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)  # (--help, and the parser's own errors, before anything connects)
    try:
        parse_target(a.target)  # (a HOST:PORT that is not one is said as such, terminal or not)
    except ValueError as e:
        raise CliError(str(e)) from None
    if not a.headless:
        require_terminal("the attach UI", "use --headless to print what is named")
    a, run, json_path = build(argv)
    if a.nice:
        try:  # (the process and the threads it starts: an observer that yields the cores to the job's)
            os.nice(a.nice)
        except OSError:
            pass
    if a.headless:
        return headless(a, run, json_path)
    from ddptui.ui.launch import run_attach_app
    code = run_attach_app(run, profile_s=a.profile_s or UI_PROFILE_S)
    rec = run.opts.record
    if rec and os.path.exists(rec):
        print(f"ddptui: recorded to {rec} (ddptui replay {rec})", file=sys.stderr)
    return code


def headless(a, run: AttachRun, json_path: str | None, out=None, err=None) -> int:
    """Attach without a UI (module docstring); returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr

    def say(text: str) -> None:
        err.write(f"ddptui: {text}\n")
        err.flush()

    def drain(wait: float = 0.0) -> None:
        """Print what the run said; `wait`: up to so long for a first line (the loop's pace:
        woken by a line, not by a timer 20 times a second)."""
        while True:
            try:
                level, text = run.lines.get(timeout=wait) if wait else run.lines.get_nowait()
            except Exception:  # noqa: BLE001 (queue.Empty)
                return
            wait = 0.0
            if level in ("result", "stack"):
                out.write(("    " if level == "stack" else "") + text + "\n")
                out.flush()
            else:
                say(("warning: " if level == "warn" else "") + text)

    old = signal.signal(signal.SIGTERM, sigterm_to_interrupt) if threading.current_thread() is threading.main_thread() else None
    if run.opts.record:
        say(f"recording to {run.opts.record}")
    end = time.monotonic() + a.duration if a.duration else None
    profile = a.profile_s
    puller: threading.Thread | None = None
    last = time.monotonic()
    try:
        run.start()
        drain()
        say("Ctrl-C stops (the job goes on)")
        while not run.poll():
            drain(0.25)
            now = time.monotonic()
            if profile and puller is None and run.training():
                puller = threading.Thread(target=run.pull_profile, args=(profile,), name="ddptui-profile", daemon=True)
                puller.start()
            if now - last >= PROGRESS_S:
                last = now
                say(_progress(run))
            if end is not None and now >= end:
                break
    except KeyboardInterrupt:
        say("interrupted: detaching (the job goes on)")
    finally:
        if puller is not None:
            puller.join(timeout=a.profile_s + run.opts.timeout_s * 3 + 5 if a.profile_s else 0)
        run.stop("detached" if run.state == "running" else run.message)
        drain()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if profile and puller is None:
        say("warning: no profile taken: the job was not seen training (--profile-s)")
    say(_progress(run))
    if run.recording_error is None and run.opts.record and os.path.exists(run.opts.record):
        say(f"recorded to {run.opts.record} (ddptui replay {run.opts.record})")
    if json_path:
        from ddptui.reports.report import write_json
        write_json(json_path, {"attached_to": run.opts.target, "state": run.state, "message": run.message,
                               "recording": run.opts.record, "profiles": run.profiles,
                               "flight_recorder": run.doc()})
    return 1 if run.watch.current is not None else 0


def _progress(run: AttachRun) -> str:
    st = run.stream
    cur = run.watch.current
    what = cur.short() if cur is not None else "no hang"
    drawn = f"{st.steps} step(s) drawn" if st is not None else "nothing drawn yet"
    if st is not None and st.per_drawn > 1:  # (more of the job's steps a poll than are drawn apart)
        drawn += f" (up to {st.per_drawn} of the job's steps to one: it made many since the last poll)"
    if run.unread:
        drawn += f" (a sample: {run.unread} of the job's collectives between polls not read)"
    down = f" · {len(run.down)} rank(s) not answering" if run.down else ""
    tail = f" (each rank's newest {TAIL})" if run.tail() is not None and run.tail_reads else ""
    return (f"{run.polls} poll(s) of {len(run.servers)} rank(s) ({run.last_poll_s * 1e3:.0f} ms the last, "
            f"the next {run.gap_s:.1f} s after it) · "
            f"{run.entries_seen} entries read{tail} · {drawn}{down} · {what}")
