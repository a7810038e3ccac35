"""`ddptui summary FILE [--json PATH]`: the per-strategy figures of a recording.

The same table and the same JSON fields as the live headless run (report.print_summary,
report.json_doc): the recording is read into a Store exactly as a live run's frames are,
so the figures are the ones the live run printed. `ddptui replay FILE --headless` prints
the same thing.

A directory of PyTorch Flight Recorder dumps (ddptui.recording.frdump) reads the same way:
its report is the verdict (model/frverdict.py), in the text and in the JSON's
`flight_recorder`, a dump that could not be read a warning line each.

Exit status: 0 with figures; 2 for a bad command line or a bad file (one line on stderr:
`ddptui: error: FILE: problem`). A damaged or truncated file that still had frames before
the damage (a run killed mid-step, a file cut short) is not an error: the figures of the
steps read are printed, one `ddptui: warning:` line on stderr says what was wrong and
which steps were read, the JSON carries it in "damage", and the exit status is 0.
"""
from __future__ import annotations

import os

from .common import FILE_HELP, CliError, JSON_METAVAR, json_target, Parser
from ddptui.model import frverdict
from ddptui.recording.loader import Loaded, load
from ranks.recfile import RecordingError
from ddptui.live.headless import clock_offsets
from ddptui.reports.report import report_run


def parser(prog: str = "ddptui summary", description: str = "") -> Parser:
    p = Parser(prog=prog, description=description or
                "Per-strategy figures of a recording: the table (and JSON) of a live headless run. "
                "Of a directory of PyTorch Flight Recorder dumps: for each process group, the first "
                "collective its ranks disagree on (who never issued it, who issued another op, other "
                "sizes or dtypes) and each rank's last completed and in-flight collective.")
    p.add_argument("file", metavar="FILE", help=FILE_HELP)
    p.add_argument("--json", metavar=JSON_METAVAR, help="also write the figures as JSON to PATH (-: to stdout, the text report to stderr)")
    return p


def read(path: str) -> Loaded:
    """Load a recording; a bad file becomes a one-line CliError."""
    try:
        return load(path)
    except RecordingError as e:
        raise CliError(str(e)) from None


def run_state(got: Loaded) -> tuple[str, str]:
    """What the recording says about how the run ended: (state, message). Flight Recorder
    dumps: "desync" (a group's ranks disagree, or a send and its recv do not match), "hung"
    (collectives in flight, no disagreement) or "no hang", and the verdict."""
    st = got.store
    fr = frverdict.of_run(st.meta)
    if fr is not None:
        desync = any(g.get("first_disagreement") or (g.get("point_to_point") or {}).get("issues")
                     for g in fr.get("groups") or ())
        return ("desync" if desync else "hung" if frverdict.headlines(fr)[1] else "no hang"), fr["verdict"]
    ranks = st.rank_snapshot()
    errors = [f"rank {r}: {i.error}" for r, i in sorted(ranks.items()) if i.error]
    died = [f"rank {r} {i.exit}" for r, i in sorted(ranks.items())
            if i.exit and not i.finished and not i.error]
    if errors or died:
        return "failed", "; ".join(errors + died)
    if got.damage:
        return "incomplete", got.damage
    if ranks and all(i.finished for i in ranks.values()):
        return "finished", "run finished"
    stop = [text for _, level, text in st.log_lines() if text.startswith("stopping:")]
    if stop:
        return "stopped", stop[-1].split(":", 1)[1].strip()
    return "incomplete", "the recording ends before every rank finished"


def report(got: Loaded, json_path: str | None, title: str | None = None,
           out=None, err=None) -> int:
    """Print the figures of a loaded recording (and write JSON); returns the exit status."""
    fr = frverdict.of_run(got.store.meta)
    if fr is not None:  # (a dump that could not be read: a line each; the others were read)
        notes = [f"{got.path}: {why}" for why in (fr.get("unreadable") or {}).values()]
    else:
        notes = [f"{got.path}: {got.damage}; figures of what was read: {got.steps_text()}"] if got.damage else []
    if got.rejected:
        notes.append(f"{got.path}: {got.skipped_text()}")

    def extra(dropped: int) -> dict:
        state, message = run_state(got)
        return {"state": state, "message": message, "recording": os.path.abspath(got.path),
                "dropped_spans": dropped, "damage": got.damage, "skipped_frames": len(got.rejected),
                "frames": got.frames, "spans": got.spans,
                "steps_read": {s: len(ks) for s, ks in got.steps_read().items()},
                **clock_offsets(got.store)}
    report_run(got.store, json_path, extra, title=title, out=out, err=err, notes=notes,
               empty=None if got.damage else f"{got.path}: no complete step in this recording",
               when=" during the recorded run", recording=got.path)
    return 0


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    return report(read(a.file), json_target(a.json))

