"""`ddptui serve [FILE | --attach [FILE]] [--host H] [--port P]`: the UI in a browser.

Through textual-serve: every browser tab gets its own UI process, started with the command
built here — a replay of FILE, or (--attach) a read-only view that follows the recording a
live run is writing (ddptui.recording.follow). Never a run per tab: the live run is started once, in
a terminal, and records (by default to ./runs/); --attach without FILE follows the newest
recording there. The page and everything it loads (script, stylesheet, fonts) are served
from this process: nothing is fetched from the internet. Local only by default
(127.0.0.1); `--host 0.0.0.0` serves the network, without authentication.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import sys
import tempfile

from .common import CliError, Parser as _Parser
from .options import add_numeric

REMOTE_LINK = re.compile(r'<link[^>]*href="https?://[^"]*"[^>]*>', re.S)
LOCAL_FONT = """<style>
      @font-face { font-family: "Roboto Mono";
        src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }
    </style>"""


def parser() -> _Parser:
    p = _Parser(prog="ddptui serve", description="The timeline UI in a web browser (textual-serve): "
                "a replay of FILE, or --attach: a read-only view of a live run's recording.")
    p.add_argument("file", metavar="FILE", nargs="?", help="a .ddptui recording")
    p.add_argument("--attach", action="store_true",
                   help="follow a recording as a live run writes it (default: the newest in --runs-dir)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where live runs record (default ./runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    add_numeric(p, "--port", default=8000, help="port (default 8000)")
    p.add_argument("--public-url", metavar="URL", help="the URL browsers use, when not http://HOST:PORT")
    add_numeric(p, "--speed", default=1.0, help="replay speed, 0.25..8 (default 1)")
    p.add_argument("--loop", action="store_true", help="replay: start over at the end")
    p.add_argument("--title", metavar="TEXT", help="a title to show")
    p.add_argument("--tab", action="store_true", help=argparse.SUPPRESS)  # what each browser tab runs
    return p


def newest_recording(runs_dir: str) -> str:
    files = glob.glob(os.path.join(runs_dir, "*.ddptui"))
    if not files:
        raise CliError(f"--attach: no recording in {runs_dir}/ (start a live run first, or name the FILE)")
    return max(files, key=os.path.getmtime)


def tab_command(a) -> str:
    """The command textual-serve runs for each browser tab."""
    args = [sys.executable, "-m", "ddptui.cli.serve", "--tab", a.file]
    args += ["--attach"] if a.attach else ["--speed", str(a.speed)] + (["--loop"] if a.loop else [])
    args += ["--title", a.title] if a.title else []
    return " ".join(map(shlex.quote, args))


def local_templates(into: str) -> str:
    """textual-serve's page with its one remote stylesheet (a web font) replaced by the
    font file textual-serve ships; fails if anything remote is left in it."""
    import textual_serve

    src = os.path.join(os.path.dirname(textual_serve.__file__), "templates", "app_index.html")
    with open(src, encoding="utf-8") as f:
        page = REMOTE_LINK.sub(LOCAL_FONT, f.read())
    left = [u for u in re.findall(r'(?:src|href)="(https?://[^"]*)"', page)]
    if left:
        raise CliError(f"textual-serve's page loads {left[0]}: refusing to serve a page that fetches from the internet")
    os.makedirs(into, exist_ok=True)
    with open(os.path.join(into, "app_index.html"), "w", encoding="utf-8") as f:
        f.write(page)
    return into


def tab(a) -> int:
    """One browser tab's UI (its terminal is the page, through textual-serve's driver)."""
    from ddptui.ui.app import DdpApp, run_replay_app
    from ddptui.recording.follow import FollowSource
    from ranks.recfile import RecordingError

    if not a.attach:
        return run_replay_app(a.file, speed=a.speed, loop=a.loop, title=a.title)
    try:
        src = FollowSource(a.file)
    except RecordingError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        return 2
    DdpApp(src, title=a.title or f"watching {os.path.basename(a.file)}").run()
    return 0


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.tab:
        return tab(a)
    try:
        from textual_serve.server import Server
    except ImportError:
        raise CliError("ddptui serve needs textual-serve (pip install textual-serve)") from None
    if a.attach:
        a.file = a.file or newest_recording(a.runs_dir)
    elif not a.file:
        raise CliError("ddptui serve: name a recording (FILE), or --attach to a live run")
    if not os.path.isfile(a.file):
        raise CliError(f"{a.file}: no such file")
    if not (0.25 <= a.speed <= 8):
        raise CliError(f"--speed must be in 0.25..8 (got {a.speed:g})")
    if not a.attach:
        from .replay import check_file
        check_file(a.file)
    templates = local_templates(tempfile.mkdtemp(prefix="ddptui-serve-"))
    what = f"following {a.file} (read-only)" if a.attach else f"replaying {a.file}"
    server = Server(tab_command(a), host=a.host, port=a.port, title=a.title or f"ddptui · {os.path.basename(a.file)}",
                    public_url=a.public_url, templates_path=templates)
    url = a.public_url or f"http://{a.host}:{a.port}"
    print(f"ddptui serve: {what} at {url} (Ctrl-C stops)", file=sys.stderr)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"ddptui serve: warning: listening on {a.host}: anyone who reaches this port can watch",
              file=sys.stderr)
    server.serve()
    return 0


if __name__ == "__main__":  # each browser tab: `python -m ddptui.cli.serve --tab FILE [--attach]`
    try:
        sys.exit(main(sys.argv[1:]))
    except CliError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        sys.exit(2)
