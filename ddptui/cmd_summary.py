"""`ddptui summary FILE [--json PATH]`: the per-strategy figures of a recording.

The same table and the same JSON fields as the live headless run (report.print_summary,
report.json_doc): the recording is read into a Store exactly as a live run's frames are,
so the figures are the ones the live run printed. `ddptui replay FILE --headless` prints
the same thing.

Exit status: 0 with figures; 2 for a bad command line or a bad file (one line on stderr:
`ddptui: error: FILE: problem`). A damaged or truncated file that still had frames before
the damage (a run killed mid-step, a file cut short) is not an error: the figures of the
steps read are printed, one `ddptui: warning:` line on stderr says what was wrong and
which steps were read, the JSON carries it in "damage", and the exit status is 0.
"""
from __future__ import annotations

import os
import sys

from .cli import CliError, _check_writable_path, _Parser
from .recording import Loaded, RecordingError, load
from .report import json_doc, print_summary, run_title, write_json


def parser(prog: str = "ddptui summary", description: str = "") -> _Parser:
    p = _Parser(prog=prog, description=description or
                "Per-strategy figures of a recording: the table (and JSON) of a live headless run.")
    p.add_argument("file", metavar="FILE", help="a .ddptui recording")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    return p


def read(path: str) -> Loaded:
    """Load a recording; a bad file becomes a one-line CliError."""
    try:
        return load(path)
    except RecordingError as e:
        raise CliError(str(e)) from None


def run_state(got: Loaded) -> tuple[str, str]:
    """What the recording says about how the run ended: (state, message)."""
    st = got.store
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
    stop = [text for _, level, text in list(st.log) if text.startswith("stopping:")]
    if stop:
        return "stopped", stop[-1].split(":", 1)[1].strip()
    return "incomplete", "the recording ends before every rank finished"


def report(got: Loaded, json_path: str | None, title: str | None = None,
           out=None, err=None) -> int:
    """Print the figures of a loaded recording (and write JSON); returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    st = got.store
    rows = st.summaries()
    meta = dict(st.meta)
    ranks = st.rank_snapshot()
    if ranks and not meta.get("backend"):
        meta["backend"] = ranks[min(ranks)].backend
    if got.damage:
        print(f"ddptui: warning: {got.path}: {got.damage}; figures of what was read: "
              f"{got.steps_text()}", file=err, flush=True)
    if got.rejected:
        print(f"ddptui: warning: {got.path}: {got.skipped_text()}", file=err, flush=True)
    if any(r.get("steps") for r in rows):
        print_summary(rows, meta, file=out, title=title or run_title(meta))
    elif not got.damage:
        print(f"ddptui: warning: {got.path}: no complete step in this recording", file=err, flush=True)
    dropped = sum(i.dropped_spans for i in ranks.values())
    if dropped:
        print(f"ddptui: warning: {dropped} spans were dropped during the recorded run "
              f"(the app could not keep up)", file=err, flush=True)
    if json_path:
        state, message = run_state(got)
        write_json(json_path, json_doc(rows, meta, {
            "state": state, "message": message, "recording": os.path.abspath(got.path),
            "dropped_spans": dropped, "damage": got.damage, "skipped_frames": len(got.rejected),
            "frames": got.frames, "spans": got.spans,
            "steps_read": {s: len(ks) for s, ks in got.steps_read().items()},
        }))
    return 0


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.json:
        _check_writable_path(a.json, "--json")
    return report(read(a.file), a.json)

