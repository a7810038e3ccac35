"""Open the Textual app on a live run or a recording, from the command line: the app's
entry points for `ddptui` (live), `ddptui run`, `ddptui attach` and `ddptui replay`. Whatever
happens, no rank is left running and a recording that cannot be read is one line."""
from __future__ import annotations

import sys

from .app import DdpApp


def run_live_app(opts, plan, run=None) -> int:
    """Launch the ranks (a LiveRun, or the given run) and show them; 0 after a normal quit,
    1 if the run failed. Whatever happens, no rank is left running."""
    from ddptui.live.session import LiveRun
    run = run or LiveRun(opts, plan)
    app = DdpApp(run, record=opts.record)
    try:
        app.run()
    finally:
        if run.state in ("running", "starting"):
            run.stop("the UI closed")
    return app.exit_code()


def run_attach_app(run, *, profile_s: float = 2.0) -> int:
    """Show an attached job (ddptui.live.attach.AttachRun, connected); 0 after a quit, 1 when
    a hang or desync stands at the end. Whatever happens, polling stops (the job goes on)."""
    app = DdpApp(run, record=run.opts.record, profile_s=profile_s)
    try:
        app.run()
    finally:
        if run.state in ("running", "starting"):
            run.stop("the UI closed")
    return 1 if run.watch.current is not None else app.exit_code()


def run_replay_app(path: str, *, speed: float = 1.0, loop: bool = False, title: str | None = None) -> int:
    """Replay a recording in the UI; 2 (with a message) if the file cannot be read."""
    from ranks.recfile import RecordingError
    from ddptui.recording.replay import ReplaySource
    try:
        src = ReplaySource(path, speed=speed, loop=loop)
    except RecordingError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        return 2
    DdpApp(src, title=title).run()
    return 0
