"""The ranks' own output (a training script's prints) while a run is live.

torchrun writes each local rank's stdout and stderr to files in the run's private folder
(`--redirects 3` under `--log-dir`: ``<dir>/<run id>/attempt_<n>/<local rank>/std{out,err}.log``;
the workers run with PYTHONUNBUFFERED, so a print is there at once). `OutputTail` reads them
as they grow, on a thread of its own, in whole lines, and

- hands every line to `echo(rank, stream, line)` when given (`--headless`: passed through as
  torchrun does, ``[rank0]:iter 3: loss 2.1``; nothing is kept for it, so nothing is lost);
- makes `Output` frames of them for the Feed (the store, whose output pane keeps the last
  lines, and the recording), within a budget: a burst of BURST_BYTES, then RATE_BYTES_PER_S
  for the whole run. Lines beyond it are left out of the frames and counted: the frame of
  that pass carries the count (`dropped`), so a recording says how many it lacks.

A line longer than frames.MAX_OUTPUT_LINE is cut into pieces of that size; a partial line (no
newline yet) is taken after PARTIAL_S or at the end. Memory is bounded: at most READ_MAX
bytes per file per read, a partial line of at most one line's size.
"""
from __future__ import annotations

import glob
import os
import re
import sys
import threading
import time

from ranks import frames

READ_MAX = 1 << 20  # bytes read from one file in one pass (the rest: the next pass)
BURST_BYTES = 1 << 20  # the output a run records at once ...
RATE_BYTES_PER_S = 64 << 10  # ... and then per second, every rank together
PARTIAL_S = 1.0  # a line without its newline for this long is taken as it is
EVERY_S = 0.1  # how often the files are read
FIND_EVERY_S = 1.0  # how often, once some are there, new files are looked for
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colours and cursor moves: passed through, not kept
CHOICES = ("0", "all", "none")  # `--output`: which ranks' output headless passes through


class _File:
    __slots__ = ("path", "rank", "stream", "pos", "partial", "since")

    def __init__(self, path: str, rank: int, stream: str):
        self.path, self.rank, self.stream = path, rank, stream
        self.pos = 0
        self.partial = b""
        self.since = 0.0  # when the partial line began waiting


class OutputTail:
    """Reads the ranks' output files under `log_dir` (torchrun's) into Output frames for
    `take(frame)` (the Feed's `frame`); `echo(rank, stream, line)` sees every line."""

    def __init__(self, log_dir: str, take, echo=None, every_s: float = EVERY_S,
                 burst: int = BURST_BYTES, rate: float = RATE_BYTES_PER_S):
        self.log_dir, self.take, self.echo, self.every_s = log_dir, take, echo, every_s
        self.burst, self.rate = burst, rate
        self.tokens = float(burst)
        self.filled_at = time.monotonic()
        self.files: dict[str, _File] = {}
        self.lines = 0  # lines read
        self.dropped_total = 0  # lines left out of the frames (the budget)
        self._found_at = 0.0
        self._lock = threading.Lock()  # one pass at a time (the thread's, the last one's)
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> None:
        self._t = threading.Thread(target=self._loop, name="ddptui-output", daemon=True)
        self._t.start()

    def close(self) -> None:
        """Stop reading: one last pass reads every file to its end (partial lines too)."""
        self._stop.set()
        if self._t is not None:
            self._t.join(5)
        self.poll(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the output must never break the run
                pass

    # -- one pass ------------------------------------------------------------------------
    def _find(self, now: float, final: bool) -> None:
        """The ranks' files (looked for at every pass until some are there, then every
        FIND_EVERY_S: a restarted attempt's new ones)."""
        if self.files and not final and now - self._found_at < FIND_EVERY_S:
            return
        self._found_at = now
        for path in glob.glob(os.path.join(self.log_dir, "*", "attempt_*", "*", "std*.log")):
            if path in self.files:
                continue
            local, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
            if local.isdigit() and name in ("stdout.log", "stderr.log"):
                self.files[path] = _File(path, int(local), "out" if name == "stdout.log" else "err")

    def poll(self, final: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            self._find(now, final)
            for f in sorted(self.files.values(), key=lambda f: (f.rank, f.stream)):
                lines = self._read(f, now, final)
                if lines:
                    self._send(f.rank, f.stream, lines, now)

    def _read(self, f: _File, now: float, final: bool) -> list[str]:
        try:
            with open(f.path, "rb") as fh:
                fh.seek(f.pos)
                data = fh.read(READ_MAX)
        except OSError:
            return []
        f.pos += len(data)
        had_partial = bool(f.partial)
        *whole, rest = (f.partial + data).split(b"\n")
        cap = frames.MAX_OUTPUT_LINE
        if rest and (whole or not had_partial):
            f.since = now  # (a new partial line began)
        if rest and (final or len(rest) >= cap * 4 or now - f.since >= PARTIAL_S):
            whole.append(rest)  # (a line still without its newline: taken as it is)
            rest = b""
        f.partial = rest
        out = []
        for raw in whole:
            text = raw.decode("utf-8", "replace").rstrip("\r")
            text = text.rsplit("\r", 1)[-1]  # a progress bar's updates: the last one, as a terminal shows
            while len(text) > cap:
                out.append(text[:cap])
                text = text[cap:]
            out.append(text)
        self.lines += len(out)
        return out

    def _send(self, rank: int, stream: str, lines: list[str], now: float) -> None:
        if self.echo is not None:
            for line in lines:
                self.echo(rank, stream, line)
        self.tokens = min(self.burst, self.tokens + (now - self.filled_at) * self.rate)
        self.filled_at = now
        kept = []
        for line in lines:
            if "\x1b" in line:
                line = _ANSI.sub("", line)
            cost = len(line) + 1
            if self.tokens >= cost:
                self.tokens -= cost
                kept.append(line)
        dropped = len(lines) - len(kept)  # (said in the frame: a recording knows what it lacks)
        self.dropped_total += dropped
        ts = time.time()
        for i in range(0, max(1, len(kept)), frames.MAX_OUTPUT_LINES):
            self.take(frames.Output(rank=rank, stream=stream, lines=kept[i:i + frames.MAX_OUTPUT_LINES],
                                    dropped=dropped if i == 0 else 0, ts=ts))


def pass_through(which: str, out=None, err=None):
    """`--output 0|all|none` -> echo(rank, stream, line) printing ``[rank0]:line`` (stdout
    lines to `out`, stderr lines to `err`, as torchrun keeps them apart), or None."""
    if which == "none":
        return None
    only = None if which == "all" else int(which)

    def echo(rank: int, stream: str, line: str) -> None:
        if only is None or rank == only:
            f = (err or sys.stderr) if stream == "err" else (out or sys.stdout)
            # one write of the whole line: print writes the text and the newline apart, and the
            # progress lines come from another thread to the same stream (a line of each ran
            # together, one test run in a few hundred)
            f.write(f"[rank{rank}]:{line}\n")
            f.flush()
    return echo
