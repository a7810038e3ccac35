"""`ddptui replay FILE [--headless] [--json PATH] [--speed X] [--loop] [--title TEXT]`.

Without --headless: the recording plays in the same timeline UI as a live run (no torch,
no GPU needed). With --headless: the per-strategy figures, exactly as `ddptui summary`
and the live headless run print them (--speed and --loop do not apply; --title replaces
the table's title).

Exit status: 0 with figures; 2 for a bad command line or a bad file (one line on stderr).
A damaged or truncated file that still had frames before the damage replays what came
before it: a `ddptui: warning:` line names the damage and the steps read, exit status 0.
"""
from __future__ import annotations

import copy

from ranks import frames, spec

from . import summary as cmd_summary
from .common import CliError, file_help, JSON_METAVAR, json_target, Parser, require_terminal
from .options import add_numeric
from ddptui.recording.rankset import open_reader
from ranks.recfile import RecordingError

def parser() -> Parser:
    p = Parser(prog="ddptui replay",
                description="Replay a recording in the timeline UI, or print its figures (--headless).")
    p.add_argument("file", metavar="FILE", help=file_help(
        "their collectives drawn a lane per rank, the verdict in the headline; --headless: "
        "the figures and the verdict"))
    p.add_argument("--headless", action="store_true",
                   help="no UI: print the per-strategy figures of the recording")
    p.add_argument("--json", metavar=JSON_METAVAR, help="(headless) also write the figures as JSON to PATH (-: to stdout, the text report to stderr)")
    add_numeric(p, "--speed", default=1.0,
                help=f"playback speed, {spec.SPEED_LADDER[0]:g}..{spec.SPEED_LADDER[-1]:g} (default 1)")
    p.add_argument("--loop", action="store_true", help="start over at the end (for talks)")
    p.add_argument("--title", metavar="TEXT", help="a title to show (UI header, or the table title)")
    return p


def check_file(path: str) -> None:
    """Check the header and read up to the first step's spans the way every verb reads
    (through ddptui.ingest.feed into a Store), so that a bad file, one with nothing to show, is
    one line on stderr rather than a UI. Damage later in the file is the UI's to show."""
    from ddptui.ingest.feed import Feed
    from ddptui.model.store import Store

    try:
        r = open_reader(path)
    except RecordingError as e:
        raise CliError(str(e)) from None
    st = Store()
    st.set_meta(copy.deepcopy(r.meta))
    feed = Feed(st)
    try:
        for body, frame in r:  # (frame: decoded and validated from body by the reader)
            if feed.frame(frame, body=body) and type(frame) is frames.Spans:
                return
    finally:
        r.close()
    if r.damage or feed.first_reject:
        raise CliError(f"{path}: {r.damage or feed.first_reject}; nothing before it to show")


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.title is not None and ("\n" in a.title or len(a.title) > 200):
        raise CliError("--title must be one line of at most 200 characters")
    if a.headless:
        return cmd_summary.report(cmd_summary.read(a.file), json_target(a.json), title=a.title)
    if a.json:
        raise CliError("--json needs --headless (the UI writes no figures file)")
    check_file(a.file)
    require_terminal("the replay UI", "use --headless to print the figures")
    try:
        from ddptui.ui.launch import run_replay_app
    except ImportError as e:
        raise CliError(f"the replay UI cannot start ({e}); `ddptui replay FILE --headless` "
                       f"prints the figures") from None
    return run_replay_app(a.file, speed=a.speed, loop=a.loop, title=a.title)

