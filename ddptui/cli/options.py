"""Every numeric command-line option of every verb, validated in one place.

`add_numeric(parser, "--pg-timeout", ...)` declares an option with the type and range of
NUMERIC (a verb may narrow the range); a value that is not a number, not finite (nan, inf)
or out of range is refused by the parser, which makes it one line `ddptui: error: ...` and
exit status 2, the same for every verb.
"""
from __future__ import annotations

import argparse
import math

from ranks import spec


class Whole:
    """A whole number in lo..hi."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def converter(self, name: str, lo=None, hi=None):
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi

        def conv(text: str) -> int:
            try:
                v = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{name} must be a whole number (got {text!r})") from None
            if not lo <= v <= hi:
                raise argparse.ArgumentTypeError(f"{name} must be {lo}..{hi} (got {v})")
            return v
        return conv


class Real:
    """A finite number in [lo, hi], or (lo, hi] when lo_open."""

    def __init__(self, lo: float, hi: float, lo_open: bool = False, unit: str = ""):
        self.lo, self.hi, self.lo_open, self.unit = lo, hi, lo_open, unit

    def converter(self, name: str, lo=None, hi=None):
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi
        if self.lo_open and lo == 0:
            rng = f"positive and at most {hi:g}"
        elif self.lo_open:
            rng = f"in ({lo:g}, {hi:g}]"
        else:
            rng = f"in {lo:g}..{hi:g}"
        rng += f" {self.unit}" if self.unit else ""

        def conv(text: str) -> float:
            try:
                v = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{name} must be a number (got {text!r})") from None
            if not math.isfinite(v):
                raise argparse.ArgumentTypeError(f"{name} must be a finite number (got {text!r})")
            if v < lo or v > hi or (self.lo_open and v == lo):
                raise argparse.ArgumentTypeError(f"{name} must be {rng} (got {text})")
            return v
        return conv


NUMERIC: dict[str, Whole | Real] = {
    "--gpus": Whole(1, 64),
    "--ranks": Whole(1, 64),
    "--nproc-per-node": Whole(1, 64),
    "--steps": Whole(0, 10_000_000),
    "--batch-size": Whole(1, 1 << 20),
    "--bucket-cap-mb": Real(0, 4096, lo_open=True, unit="MB"),
    "--seed": Whole(0, 2**63 - 1),
    "--lr": Real(0, 100, lo_open=True),
    "--threads": Whole(1, 256),
    "--queue-size": Whole(1, 100_000),
    "--microbatches": Whole(1, 4096),
    "--virtual-stages": Whole(2, 64),
    "--pg-timeout": Real(0, 7 * 86400, lo_open=True, unit="s"),
    "--speed": Real(spec.SPEED_LADDER[0], spec.SPEED_LADDER[-1]),
    "--port": Whole(1, 65535),
    # multi-node (ddptui/live/multinode.py, ddptui join)
    "--nnodes": Whole(1, 64),
    "--node-rank": Whole(0, 63),
    "--retry-for": Real(0, 3600, unit="s"),
    # ddptui whatif (lists take each item through the same check)
    "--bucket-cap": Real(0, 4096, lo_open=True, unit="MB"),
    "--world": Whole(1, 1 << 20),
    "--bus-gbps": Real(0, 1e6, lo_open=True, unit="GB/s"),
    "--hop-us": Real(0, 1e7, unit="µs"),
    "--call-us": Real(0, 1e7, unit="µs"),
    # ddptui attach (ddptui/live/attach.py)
    "--interval": Real(0.2, 60, unit="s"),
    "--idle-interval": Real(0.2, 600, unit="s"),
    "--nice": Whole(0, 19),
    "--hang-s": Real(0, 3600, lo_open=True, unit="s"),
    "--timeout": Real(0, 600, lo_open=True, unit="s"),
    "--max-reply-mb": Real(0, 4096, lo_open=True, unit="MB"),
    "--profile-s": Real(0, 60, lo_open=True, unit="s"),
    "--duration": Real(0, 30 * 86400, lo_open=True, unit="s"),
}


def run_parent() -> argparse.ArgumentParser:
    """The one parent parser of the verbs that launch ranks (live, --headless, bench): the
    options they share, declared once."""
    p = argparse.ArgumentParser(add_help=False)
    add_numeric(p, "--gpus", default=2,
                help="GPUs to use (default 2); with no GPU, the number of CPU ranks")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where ranks compute (default auto: CUDA when present)")
    add_numeric(p, "--batch-size", default=1024, help="global batch, split across ranks (default 1024)")
    add_numeric(p, "--bucket-cap-mb", default=None, help="DDP bucket size in MB (default PyTorch's, 25)")
    add_numeric(p, "--threads", default=1, help="torch threads per CPU rank (default 1)")
    add_numeric(p, "--pg-timeout", default=60.0, metavar="S",
                help="process-group timeout in seconds: a hung collective fails after this (default 60)")
    p.add_argument("--layer-every", choices=spec.LAYER_EVERY, default="auto", metavar="N|auto",
                   help=f"mark every layer on one step in N (a power of two, 1 to "
                        f"{spec.MAX_LAYER_EVERY}), the forward and backward as a whole on the "
                        "others; every collective on every step (default auto: every step, unless "
                        "a step is so short that marking its layers would cost more than 1%% of it, "
                        "its length being its time on the GPU where that is longer than the "
                        "host's)")
    p.add_argument("--json", metavar="PATH|-", help="also write the figures as JSON to PATH (-: to stdout, the text report to stderr)")
    return p


def add_numeric(p: argparse.ArgumentParser, name: str, lo=None, hi=None, **kw) -> None:
    """Declare numeric option `name` (a key of NUMERIC), optionally with a narrower range."""
    p.add_argument(name, type=NUMERIC[name].converter(name, lo, hi), **kw)
