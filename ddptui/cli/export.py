"""`ddptui export FILE -o trace.json`: a recording as a Chrome trace (Trace Event Format)
for Perfetto and chrome://tracing; the format is described in ddptui.reports.trace.
`ddptui export FILE --format kineto -o DIR`: one torch.profiler (Kineto) trace per rank of
one strategy, for Holistic Trace Analysis; described in ddptui.reports.kineto_export.

Exit status: 0 when written; 2 for a bad command line or a bad file (one line on stderr).
A damaged or truncated file that had frames before the damage exports what came before
it, with one `ddptui: warning:` line (exit status 0).
"""
from __future__ import annotations

import os
import re
import sys

from .common import CliError, file_help, check_writable_path, Parser
from ranks.recfile import RecordingError
from ddptui.model import frverdict
from ddptui.reports.trace import export


def parser() -> Parser:
    p = Parser(prog="ddptui export",
                description="Write a recording as a Chrome trace (Trace Event Format JSON) for "
                            "Perfetto and chrome://tracing, or (--format kineto) as one "
                            "torch.profiler trace per rank for Holistic Trace Analysis (HTA).")
    p.add_argument("file", metavar="FILE", help=file_help(
        "their collectives, a slice each, labelled with op and process group"))
    p.add_argument("-o", "--output", metavar="PATH",
                   help="chrome: the trace to write (default: FILE's name with .trace.json, in the "
                        "current directory; '-' for stdout); kineto: the directory to write "
                        "rank<N>.json into (default: FILE's name with .kineto, in the current directory)")
    p.add_argument("--format", choices=("chrome", "kineto"), default="chrome",
                   help="chrome (default): one Trace Event Format file of every rank and "
                        "strategy; kineto: one trace per rank of one strategy, in the form "
                        "torch.profiler writes (ProfilerStep#k, spans as kernels on streams)")
    p.add_argument("--strategy", metavar="NAME",
                   help="kineto: the strategy whose steps to write (default: ddp when recorded, "
                        "else the first recorded)")
    return p


def _kineto(a) -> int:
    from ddptui.recording.kineto import trace_files
    from ddptui.reports.kineto_export import export_kineto
    out = a.output
    if out is None:
        base = os.path.basename(os.path.normpath(a.file))  # (a directory given as DIR/: its name)
        out = (base[: -len(".ddptui")] if base.endswith(".ddptui") else base) + ".kineto"
    if out == "-":
        raise CliError("-o -: --format kineto writes a directory (one trace per rank)")
    out = os.path.abspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise CliError(f"-o {out}: exists and is not a directory")
    if not os.path.isdir(os.path.dirname(out)):
        raise CliError(f"-o {out}: directory {os.path.dirname(out)} does not exist")
    others = [os.path.basename(f) for f in trace_files(out)
              if not re.fullmatch(r"rank\d+\.json", os.path.basename(f))]
    if others:
        raise CliError(f"-o {out}: already holds other traces ({', '.join(others[:3])}); "
                       f"HTA would read them as ranks too, pick an empty directory")
    try:
        w = export_kineto(a.file, out, a.strategy)
    except RecordingError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"-o {out}: cannot write ({e.strerror or e})") from None
    stale = [f for f in trace_files(out) if f not in w["files"]]
    for f in stale:  # rank<N>.json of an earlier export with more ranks
        os.unlink(f)
    steps = sorted(set(w["steps"].values()))
    print(f"wrote {out}: {len(w['files'])} Kineto trace(s), strategy {w['strategy']}, "
          f"{'/'.join(map(str, steps))} step(s) per rank, {w['kernels']} span(s) as kernels; "
          f"open it with hta.trace_analysis.TraceAnalysis(trace_dir=...) or in Perfetto")
    return 0


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.format == "kineto":
        return _kineto(a)
    if a.strategy is not None:
        raise CliError("--strategy: only with --format kineto (the Chrome trace holds every strategy)")
    out = a.output
    if out is None:
        base = os.path.basename(os.path.normpath(a.file))  # (a directory given as DIR/: its name)
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
    fr = frverdict.of_run(got.store.meta)
    if fr is not None:  # (Flight Recorder dumps: a line for each that could not be read)
        for why in (fr.get("unreadable") or {}).values():
            print(f"ddptui: warning: {a.file}: {why}", file=sys.stderr, flush=True)
    elif got.damage:
        print(f"ddptui: warning: {a.file}: {got.damage}; exported what was read: {got.steps_text()}",
              file=sys.stderr, flush=True)
    if got.rejected:
        print(f"ddptui: warning: {a.file}: {got.skipped_text()}", file=sys.stderr, flush=True)
    if out != "-":
        ranks = sorted({r for r, _ in w.per_lane})
        print(f"wrote {out}: {w.slices} slices on {len(ranks)} rank(s), {w.instants} instant "
              f"event(s); open it in Perfetto (ui.perfetto.dev) or chrome://tracing")
    return 0

