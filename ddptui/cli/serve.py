"""`ddptui serve [FILE | --attach [FILE]] [--host H] [--port P]`: the UI in a browser.

Through textual-serve: every browser tab gets its own UI process, started with the command
built here — a replay of FILE, or (--attach) a read-only view that follows the recording a
live run is writing (ddptui.recording.follow). Never a run per tab: the live run is started once, in
a terminal, and records (by default to ./runs/); --attach without FILE follows the newest
recording there. The page and everything it loads (script, stylesheet, fonts) are served
from this process: nothing is fetched from the internet. Local only by default
(127.0.0.1); `--host 0.0.0.0` serves the network, without authentication.

Nothing outlives its browser or its server. A tab process (TabDriver, a textual-serve
WebDriver) clamps the terminal size a URL or a resize asks for to what a screen can show
(MAX_COLS x MAX_ROWS), and exits within a few seconds when the server tells it to quit (the
browser closed), when its input closes or its parent changes (the server is gone, even
killed), on SIGTERM even while busy, and when its output has not moved for STALL_S s (a
websocket nobody reads). The server ends its remaining tab processes when it stops, and
logs a malformed or over-long request as one line, not a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import glob
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time

from ranks import seams

from .common import CliError, Parser as _Parser
from .options import add_numeric

MAX_COLS, MAX_ROWS = 800, 300  # a tab's terminal: more than a 4K screen shows at a readable font
QUIT_GRACE_S = 3.0  # told to quit (or SIGTERM, or its input gone): exit within this, busy or not
STALL_S = seams.tab_stall_s()  # a tab whose output has been blocked this long exits (a test seam)
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
    args = [sys.executable, "-m", __name__, "--tab", a.file]
    args += ["--attach"] if a.attach else ["--speed", str(a.speed)] + (["--loop"] if a.loop else [])
    args += ["--title", a.title] if a.title else []
    # exec: the tab process is the server's own child (no shell between), so it sees the
    # server go away
    return "exec " + " ".join(map(shlex.quote, args))


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


def clamp_size(width, height) -> tuple[int, int]:
    """A terminal size a screen can show, whatever was asked."""
    def one(v, hi, default):
        try:
            return min(max(int(v), 1), hi)
        except (TypeError, ValueError, OverflowError):
            return default
    return one(width, MAX_COLS, 80), one(height, MAX_ROWS, 24)


class _Watch:
    """A tab process's watchdog thread: exits the process when its parent changes, when a
    quit it was given is not done within QUIT_GRACE_S, or when a write to the server has
    been blocked for STALL_S."""

    def __init__(self):
        self.ppid = os.getppid()
        self.deadline: float | None = None
        self.writing_since: float | None = None
        threading.Thread(target=self._loop, name="ddptui-tab-watch", daemon=True).start()

    def arm(self, grace: float = QUIT_GRACE_S) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + grace

    def _loop(self) -> None:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            w = self.writing_since
            if os.getppid() != self.ppid or (self.deadline is not None and now > self.deadline) \
                    or (w is not None and now - w > STALL_S):
                os._exit(0)


def _tab_driver():
    """TabDriver: textual-serve's WebDriver, clamped and watched (see the module's doc)."""
    from textual import messages
    from textual.drivers.web_driver import WebDriver

    class TabDriver(WebDriver):
        def __init__(self, app, **kw):
            super().__init__(app, **kw)
            if self._size is not None:
                self._size = clamp_size(*self._size)
            self.watch = _Watch()
            raw = self._write

            def write(data: bytes) -> None:
                self.watch.writing_since = time.monotonic()
                try:
                    raw(data)
                finally:
                    self.watch.writing_since = None
            self._write = write

        def _quit(self) -> None:
            self.watch.arm()
            self._app.post_message(messages.ExitApp())

        def start_application_mode(self) -> None:
            import asyncio
            super().start_application_mode()
            loop = asyncio.get_running_loop()

            def on_term(signum, frame):  # runs even while the app's loop is stuck
                self.watch.arm()
                try:
                    loop.call_soon_threadsafe(self._quit)
                except RuntimeError:  # the loop has closed
                    pass
            signal.signal(signal.SIGTERM, on_term)

        def on_meta(self, packet_type: str, payload: dict) -> None:
            if packet_type == "resize":
                w, h = clamp_size(payload.get("width"), payload.get("height"))
                payload = {**payload, "width": w, "height": h}
            elif packet_type == "quit":
                self.watch.arm()
            super().on_meta(packet_type, payload)

        def run_input_thread(self) -> None:
            super().run_input_thread()
            if not self.exit_event.is_set():  # its input closed: the server is gone
                self._quit()

    return TabDriver


def __getattr__(name: str):  # TEXTUAL_DRIVER names this module's TabDriver (imported lazily)
    if name == "TabDriver":
        return _tab_driver()
    raise AttributeError(name)


def tab(a) -> int:
    """One browser tab's UI (its terminal is the page, through textual-serve's driver)."""
    w, h = clamp_size(os.environ.get("COLUMNS", 80), os.environ.get("ROWS", 24))
    os.environ.update(COLUMNS=str(w), ROWS=str(h))
    if os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver"):  # started by textual-serve
        os.environ["TEXTUAL_DRIVER"] = f"{__name__}:TabDriver"  # (read when textual is imported)
    from ddptui.ui.app import DdpApp
    from ddptui.ui.launch import run_replay_app
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
    with tempfile.TemporaryDirectory(prefix="ddptui-serve-") as templates:  # the page, while serving
        local_templates(templates)
        what = f"following {a.file} (read-only)" if a.attach else f"replaying {a.file}"
        server = _server_class(Server)(tab_command(a), host=a.host, port=a.port,
                                       title=a.title or f"ddptui · {os.path.basename(a.file)}",
                                       public_url=a.public_url, templates_path=templates)
        url = a.public_url or f"http://{a.host}:{a.port}"
        print(f"ddptui serve: {what} at {url} (Ctrl-C stops)", file=sys.stderr)
        if a.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"ddptui serve: warning: listening on {a.host}: anyone who reaches this port can watch",
                  file=sys.stderr)
        try:
            server.serve()
        finally:
            end_children()
    return 0


class _OneLine(logging.Filter):
    """A request aiohttp could not parse (an over-long URL or header, garbage): one line,
    no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            why = " ".join(str(exc.message or type(exc).__name__).split())[:120]
            record.msg, record.args, record.exc_info, record.exc_text = \
                "refused a bad request from %s: %s", (remote, why), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _server_class(base):
    class TabServer(base):
        def initialize_logging(self) -> None:
            super().initialize_logging()
            logging.getLogger("aiohttp.server").addFilter(_OneLine())

        async def on_shutdown(self, app) -> None:
            # Ctrl-C or SIGTERM: end the tabs first, so each one's websocket closes and the
            # server is not left waiting on open connections (aiohttp waits for its handlers)
            await asyncio.to_thread(end_children)
            await super().on_shutdown(app)

        async def handle_websocket(self, request):
            # the size a page asks for, clamped before textual-serve reads it
            q = request.rel_url.query
            if "width" in q or "height" in q:
                w, h = clamp_size(q.get("width", 80), q.get("height", 24))
                request = request.clone(rel_url=request.rel_url.update_query(width=w, height=h))
            return await super().handle_websocket(request)
    return TabServer


def end_children(grace: float = 3.0) -> None:
    """Every process this server started (its tab processes) ends with it."""
    import psutil
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for k in kids:
        try:
            k.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(kids, timeout=grace)
    for k in alive:
        try:
            k.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


if __name__ == "__main__":  # each browser tab: `python -m ddptui.cli.serve --tab FILE [--attach]`
    try:
        sys.exit(main(sys.argv[1:]))
    except CliError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        sys.exit(2)
