"""`ddptui export FILE -o trace.json`: a recording as a Chrome trace (Trace Event Format)
for Perfetto, chrome://tracing and HTA-style tools; the format is described in ddptui.reports.trace.

Exit status: 0 when written; 2 for a bad command line or a bad file (one line on stderr).
A damaged or truncated file that had frames before the damage exports what came before
it, with one `ddptui: warning:` line (exit status 0).
"""
from __future__ import annotations

import os
import sys

from .common import CliError, check_writable_path, Parser
from ranks.recfile import RecordingError
from ddptui.reports.trace import export


def parser() -> Parser:
    p = Parser(prog="ddptui export",
                description="Write a recording as a Chrome trace (Trace Event Format JSON) for "
                            "Perfetto, chrome://tracing and HTA-style tools.")
    p.add_argument("file", metavar="FILE", help="a .ddptui recording")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="the trace to write (default: FILE with .trace.json; '-' for stdout)")
    return p


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    out = a.output
    if out is None:
        base = os.path.basename(a.file)
        stem = base[: -len(".ddptui")] if base.endswith(".ddptui") else base
        out = stem + ".trace.json"
    if out != "-":
        out = check_writable_path(out, "-o")
    try:
        w, got = export(a.file, out)
    except RecordingError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"-o {out}: cannot write ({e.strerror or e})") from None
    if got.damage:
        print(f"ddptui: warning: {a.file}: {got.damage}; exported what was read: {got.steps_text()}",
              file=sys.stderr, flush=True)
    if got.rejected:
        print(f"ddptui: warning: {a.file}: {got.skipped_text()}", file=sys.stderr, flush=True)
    if out != "-":
        ranks = sorted({r for r, _ in w.per_lane})
        print(f"wrote {out}: {w.slices} slices on {len(ranks)} rank(s), {w.instants} instant "
              f"event(s); open it in Perfetto (ui.perfetto.dev) or chrome://tracing")
    return 0

