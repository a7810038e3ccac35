"""What every verb shares: the one-line error (`CliError`, exit status 2), the parser that raises it,
the environment check, writable-path checks, where a live run records, SIGTERM as Ctrl-C."""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import time


class CliError(Exception):
    """A one-line error for the user (exit status 2)."""


class Parser(argparse.ArgumentParser):
    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        import sys
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):  # one line, no usage dump
        head, _, rest = message.partition(": ")
        if head.startswith("argument ") and rest.startswith(tuple(head[9:].split("/"))):
            message = rest  # "argument --x: --x must be ..." says --x once
        took = _json_took_input(self._argv) if "required" in message else None
        if took:  # `summary --json run.ddptui`: the recording taken as the file to write
            message = (f"--json took {took} as the file to write (--json PATH|-, - for stdout): "
                       f"name the recording first, then --json ({message})")
        raise CliError(message)


def _json_took_input(argv: list[str]) -> str | None:
    """The existing file or directory that `--json` took as its value, if any."""
    for i, x in enumerate(argv[:-1]):
        if x == "--json" and argv[i + 1] != "-" and os.path.exists(argv[i + 1]):
            return argv[i + 1]
    return None


JSON_METAVAR = "PATH|-"
# what summary, replay and export read (ddptui.recording.rankset.open_reader)


def file_help(of_dumps: str) -> str:
    """FILE's help: what the verb makes of Flight Recorder dumps in `of_dumps`."""
    return ("a .ddptui recording, or a directory of one per rank: rank<N>.ddptui recordings, "
            "torch.profiler traces (*.json), or PyTorch Flight Recorder dumps (<prefix><rank>, "
            f"pickle or JSON, as NCCL's watchdog writes them: {of_dumps}, docs/flight-recorder.md)")


FILE_HELP = file_help("the first collective each process group's ranks disagree on")  # (summary's)


def json_target(value: str | None, what: str = "--json") -> str | None:
    """Where --json writes: None (not asked), "-" (stdout: the text report goes to stderr
    then), or a path checked writable."""
    if not value:
        return None
    if value == "-":
        return "-"
    return check_writable_path(value, what)


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def check_environment(need_torch: bool = True) -> None:
    if need_torch and _missing("torch"):
        raise CliError("torch is not installed in this Python; run bin/setup (or pip install torch)")
    if _missing("pynvml"):
        raise CliError("nvidia-ml-py (pynvml) is not installed; reinstall ddptui (pip install -e .)")


def check_writable_path(path: str, what: str) -> str:
    """A path we can create a file at: checked by creating (and removing) a probe file."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise CliError(f"{what} {path}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise CliError(f"{what} {path}: is a directory")
    probe = os.path.join(parent, f".ddptui-probe-{os.getpid()}")
    try:
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"{what} {path}: directory {parent} is not writable ({e.strerror})") from None
    return path


def record_path(a, stem: str, ranks: int) -> str | None:
    """Where a live run records: --record, else a new file in --runs-dir (None: --no-record)."""
    if a.no_record:
        return None
    if a.record:
        return check_writable_path(a.record, "--record")
    try:
        os.makedirs(a.runs_dir, exist_ok=True)
    except OSError as e:
        raise CliError(f"--runs-dir {a.runs_dir}: cannot create ({e.strerror})") from None
    name = time.strftime("%Y%m%d-%H%M%S") + f"-{stem}-{ranks}r.ddptui"
    return check_writable_path(os.path.join(a.runs_dir, name), "--runs-dir")


def sigterm_to_interrupt(signum, frame):
    """A SIGTERM handler: stop as Ctrl-C does (ranks stopped, the report printed)."""
    raise KeyboardInterrupt


def require_terminal(what: str, instead: str) -> None:
    """The UIs draw on a terminal: without one, a one-line error naming what to use instead."""
    import sys
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError(f"{what} needs a terminal; {instead}")


def open_live_ui(opts, plan, run=None) -> int:
    """The live UI on this terminal (after `require_terminal`); says where the run was recorded."""
    import sys
    from ddptui.ui.launch import run_live_app
    code = run_live_app(opts, plan, run)
    if opts.record and os.path.exists(opts.record):
        print(f"ddptui: recorded to {opts.record} (ddptui replay {opts.record})", file=sys.stderr)
    return code


# The app keeps many small objects alive for a while (every rank's figures of each kept
# step): at CPython's default thresholds (700, 10, 10) the full collections that walk them
# all come every few seconds at 1,024 ranks (16 of up to 170 ms in one P11ui run), each a
# stall of every thread. Collected less often: 1.9 s -> 0.3 s of collection in that run,
# the process 97 -> 81 % of a core. (Most garbage here has no cycle: reference counting
# frees it at once whatever the thresholds.)
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """The collector's thresholds for a ddptui process (the command line sets them first)."""
    gc.set_threshold(*GC_THRESHOLDS)
