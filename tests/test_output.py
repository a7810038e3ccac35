"""The script's own output: read from torchrun's per-rank files (ddptui.live.output), passed
through headless as torchrun does (`[rank0]:` lines, `--output 0|all|none`), kept by the
recording (bounded: what it leaves out is counted) and shown in the UI (key o)."""
from __future__ import annotations

import io
import os

import pytest

from ddptui.live import output as O
from ddptui.model.store import Store
from ddptui.recording.loader import load
from ddptui.recording.synthetic import SyntheticSource
from ranks import frames

from .helpers import synthetic_frames, synthetic_meta, write_recording


def _files(root, rank: int) -> tuple[str, str]:
    d = os.path.join(str(root), "run_abc", "attempt_0", str(rank))
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "stdout.log"), os.path.join(d, "stderr.log")


def test_lines_per_rank_and_stream_partial_and_long_lines(tmp_path):
    got, echoed = [], []
    tail = O.OutputTail(str(tmp_path), got.append, lambda r, s, line: echoed.append((r, s, line)))
    out0, err0 = _files(tmp_path, 0)
    out1, _ = _files(tmp_path, 1)
    with open(out0, "w") as f:
        f.write("iter 0: loss 2.5\niter 1: loss 2.")  # the second line: no newline yet
    with open(err0, "w") as f:
        f.write("a warning\r\n" + "x" * (frames.MAX_OUTPUT_LINE + 5) + "\n")
    with open(out1, "w") as f:
        f.write("eta 10%\reta 50%\reta 100%\n")  # a progress bar: what a terminal shows
    tail.poll()
    by = {(f.rank, f.stream): f.lines for f in got}
    assert by == {(0, "out"): ["iter 0: loss 2.5"],
                  (0, "err"): ["a warning", "x" * frames.MAX_OUTPUT_LINE, "xxxxx"],
                  (1, "out"): ["eta 100%"]}
    got.clear()
    with open(out0, "a") as f:
        f.write("1\nthe end, without a newline")
    tail.poll()
    assert [f.lines for f in got] == [["iter 1: loss 2.1"]]
    tail.close()  # the last pass: what is left, partial lines too
    assert [f.lines for f in got][-1] == ["the end, without a newline"]
    assert [e for e in echoed if e[:2] == (0, "out")] == [
        (0, "out", "iter 0: loss 2.5"), (0, "out", "iter 1: loss 2.1"), (0, "out", "the end, without a newline")]
    for f in got:  # every frame follows the protocol
        frames.validate(f)


def test_output_beyond_the_budget_is_counted_never_lost_silently(tmp_path):
    got, echoed = [], []
    tail = O.OutputTail(str(tmp_path), got.append, lambda r, s, line: echoed.append(line), burst=1000, rate=0)
    out0, _ = _files(tmp_path, 0)
    with open(out0, "w") as f:
        f.writelines(f"line {i:04d}\n" for i in range(300))  # 10 bytes a line: 100 fit
    tail.poll()
    kept = [line for f in got for line in f.lines]
    assert kept == [f"line {i:04d}" for i in range(100)]
    assert sum(f.dropped for f in got) == 200 == tail.dropped_total
    assert len(echoed) == 300  # passed through whole (headless keeps nothing)
    store = Store()
    store.set_meta(synthetic_meta())
    for f in got:
        store.ingest(f)
    seq, lines, lost, dropped = store.output_since(0)
    assert (seq, lost, dropped) == (100, 0, 200) and lines[-1][1:] == (0, "out", "line 0099")


def test_pass_through_picks_ranks_and_streams():
    out, err = io.StringIO(), io.StringIO()
    echo = O.pass_through("0", out, err)
    for r in (0, 1):
        echo(r, "out", f"iter 3 on {r}")
        echo(r, "err", f"warn on {r}")
    assert out.getvalue() == "[rank0]:iter 3 on 0\n" and err.getvalue() == "[rank0]:warn on 0\n"
    out, err = io.StringIO(), io.StringIO()
    echo = O.pass_through("all", out, err)
    echo(1, "out", "x")
    assert out.getvalue() == "[rank1]:x\n"
    assert O.pass_through("none") is None


def test_a_recording_keeps_the_output_and_its_count(tmp_path):
    """Output frames are app frames: recorded with the rest, read back by every reader."""
    fr = synthetic_frames(steps=3)
    fr.insert(5, frames.Output(rank=1, stream="err", lines=["warn: slow disk"], dropped=0, ts=1.0))
    fr.append(frames.Output(rank=0, lines=["iter 2: loss 1.5"], dropped=7, ts=2.0))
    rec = tmp_path / "o.ddptui"
    write_recording(rec, fr)
    got = load(str(rec))
    assert not got.rejected
    seq, lines, _, dropped = got.store.output_since(0)
    assert [x[1:] for x in lines] == [(1, "err", "warn: slow disk"), (0, "out", "iter 2: loss 1.5")]
    assert dropped == 7


@pytest.mark.asyncio
async def test_o_shows_the_output_over_the_timelines():
    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets.output import OutputScreen

    src = SyntheticSource(steps=6, world=2, model="small")
    src.store.ingest(frames.Output(rank=0, lines=[f"iter {i}: loss {3 - i / 10:.2f}" for i in range(5)], ts=1.0))
    src.store.ingest(frames.Output(rank=1, stream="err", lines=["a warning from rank 1"], dropped=3, ts=1.0))
    app = DdpApp(src)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        assert isinstance(app.screen, OutputScreen)

        def text() -> list[str]:
            body = app.screen.query_one("#output-body")
            return [body.render_line(y).text.rstrip() for y in range(body.size.height)]
        lines = text()
        assert "script output" in lines[0] and "6 lines" in lines[0] and "3 not recorded" in lines[0]
        assert lines[1:7] == [" r0  iter 0: loss 3.00", " r0  iter 1: loss 2.90", " r0  iter 2: loss 2.80",
                              " r0  iter 3: loss 2.70", " r0  iter 4: loss 2.60", " r1  a warning from rank 1"]
        src.store.ingest(frames.Output(rank=0, lines=["iter 5: loss 2.50"], ts=2.0))
        await pilot.pause(0.3)  # (the frame clock takes it up)
        assert " r0  iter 5: loss 2.50" in text()
        await pilot.press("r")  # one rank: rank 0
        await pilot.pause()
        assert "rank 0" in text()[0] and not any("rank 1" in ln for ln in text()[1:])
        await pilot.press("o")
        await pilot.pause()
        assert not isinstance(app.screen, OutputScreen)


def test_the_output_screen_drawn_before_its_body_is_there_waits():
    """The app's tick draws the output screen at its rate, which can come before the screen has
    composed its body (or while it is being dismissed) on a loaded machine: nothing is drawn
    then, and nothing raises (before: NoMatches took the whole attach screen down)."""
    from ddptui.ui.widgets.output import OutputScreen

    src = SyntheticSource(steps=2, world=2, model="small")
    src.store.ingest(frames.Output(rank=0, lines=["iter 0"], ts=1.0))
    screen = OutputScreen(src.store)  # (not mounted: no body)
    screen.refresh_from(src.store)
    assert list(screen.kept)[-1][-1] == "iter 0" and screen._drawn is None
    from ddptui.ui.widgets.screens import StartupScreen
    StartupScreen().show([])  # (the start-up screen, drawn by the same tick: the same)


@pytest.mark.slow
def test_run_headless_passes_the_scripts_output_through_and_records_it(user_lm_run):
    """A real `ddptui run --headless --output all` (conftest.user_lm_run: tests/scripts/tied.py,
    printing a line an iteration on stdout, one on stderr at its end): every rank's prints on
    stdout, its stderr on stderr, `[rankN]:` first, as torchrun shows them; the recording has
    every line."""
    from .helpers import SCRIPT_ITERS
    out, err = user_lm_run[2], user_lm_run.stderr
    for rank in (0, 1):
        mine = [ln for ln in out.splitlines() if ln.startswith(f"[rank{rank}]:iter ")]
        assert [ln.split(":")[1] for ln in mine] == [f"iter {i}" for i in range(SCRIPT_ITERS)], out
        assert f"[rank{rank}]:rank {rank} says goodbye" in err.splitlines()
    assert user_lm_run[0]["strategies"][0]["steps"] == SCRIPT_ITERS  # (the figures as before)
    seq, lines, _, dropped = load(user_lm_run.rec).store.output_since(0)
    recorded = {(x[1], x[2], x[3]) for x in lines}
    assert {(1, "err", "rank 1 says goodbye"), (0, "err", "rank 0 says goodbye")} <= recorded
    assert sum(1 for x in recorded if x[1] == "out" and x[2].startswith("iter ")) == 2 * SCRIPT_ITERS
    assert dropped == 0
