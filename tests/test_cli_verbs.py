"""The recording verbs end to end: a real 2-rank CPU run (torchrun, gloo) recorded by
`ddptui --headless --record`, then `replay --headless`, `summary` and `export` on it; a run
killed with SIGKILL mid-step; and the verbs' argument checks.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from ddptui.recording import loader, rankset
from ranks import recfile

from .test_export import recording_counts, trace_counts, validate_trace
from .helpers import CLI_RUN_STEPS, ROOT, cli_env, run_cli, run_main, start_cli, synthetic_frames, worker_procs, write_recording

LIVE = ["--headless", "--gpus", "2", "--model", "small", "--batch-size", "256"]
RUN_FIELDS = ("model", "world_size", "batch", "backend", "device")
NO_GPU = {"DDPTUI_GPU_COUNT": "0"}


def ddptui(*args, timeout=120, **kw) -> subprocess.CompletedProcess:
    """The CLI with no GPU seen."""
    return run_cli(*args, timeout=timeout, env=NO_GPU, **kw)


def ddptui_here(*args, **kw) -> subprocess.CompletedProcess:
    """The CLI's main in this process (error paths and recordings only), no GPU seen."""
    return run_main(*args, env=NO_GPU, **kw)


@pytest.fixture
def live(cli_run):
    """The shared real recorded headless run (conftest.cli_run)."""
    return cli_run


@pytest.mark.slow
def test_headless_prints_progress_the_table_and_json(live):
    err = live["stderr"]
    assert "CPU rank" in err  # says --gpus means CPU ranks here
    assert "spawning torchrun" in err and "rank 0 connected" in err
    assert f"recorded to {live['rec']}" in err  # the path is shown
    assert "DDP vs naive speedup" in live["stdout"]
    doc = live["json"]
    assert [r["strategy"] for r in doc["strategies"]] == ["naive", "ddp"]
    for r in doc["strategies"]:
        for key in ("strategy", "steps", "step_ms_median", "compute_ms", "comm_ms", "exposed_comm_ms",
                    "overlap_pct", "allreduce_calls_per_step", "bytes_per_step", "samples_per_s"):
            assert key in r
        assert r["steps"] == CLI_RUN_STEPS
    assert doc["speedup"]["ddp_vs_naive"] > 0
    # nothing of the run left in its temporary directory: the socket's folder and torchrun's
    # are gone (torch's own compile cache, torchinductor_*, is meant to stay)
    assert [n for n in live["tmp_left"] if n.startswith(("ddptui-", "torchelastic_"))] == [], live["tmp_left"]


@pytest.mark.slow
@pytest.mark.parametrize("verb", [["replay", "--headless"], ["summary"]])
def test_recorded_run_replays_to_the_same_summary(live, verb):
    out = live["dir"] / f"{verb[0]}.json"
    args = [verb[0], str(live["rec"]), *verb[1:], "--json", str(out)]
    res = ddptui(*args)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # a complete recording: no warning
    assert res.stdout == live["stdout"]  # the very same table, title and speedup line
    got, want = json.loads(out.read_text()), live["json"]
    assert [r["strategy"] for r in want["strategies"]] == ["naive", "ddp"]
    assert all(r["steps"] == CLI_RUN_STEPS for r in want["strategies"])
    assert len(got["strategies"]) == len(want["strategies"])
    for g, w in zip(got["strategies"], want["strategies"]):
        assert set(g) == set(w)
        for field in w:
            assert g[field] == w[field], (g["strategy"], field)
    assert got["speedup"] == want["speedup"]
    for field in RUN_FIELDS:
        assert got[field] == want[field], field
    # the live run's JSON has no torch version (the store keeps the CLI's metadata); the
    # recording's header does
    assert want["torch"] in (None, got["torch"]) and got["torch"]
    assert got["state"] == want["state"] == "finished"
    assert got["recording"] == want["recording"] == str(live["rec"])
    assert got["dropped_spans"] == want["dropped_spans"]
    assert got["damage"] is None


@pytest.mark.slow
def test_export_of_the_live_recording(live):
    out = live["dir"] / "trace.json"
    res = ddptui("export", str(live["rec"]), "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    names = validate_trace(doc)
    counts = recording_counts(live["rec"])
    assert trace_counts(doc, names) == counts
    assert {r for r, _ in counts} == {0, 1}
    assert {(r, lane) for r, lane in counts} >= {(0, "compute"), (1, "communication")}
    assert sorted(names["procs"].values()) == ["rank 0 (cpu)", "rank 1 (cpu)"]


@pytest.mark.slow
def test_recording_header_describes_the_run(live):
    meta = rankset.open_reader(str(live["rec"])).meta
    assert meta["model"] == "small" and meta["world"] == 2 and meta["batch"] == 256
    assert meta["strategies"] == ["naive", "ddp"]
    assert meta["layers"] == ["fc1", "fc2", "fc3", "fc4"] and len(meta["params"]) == 8
    assert meta["backend"] == "gloo" and meta["torch"] and meta["devices"] == {"0": "cpu", "1": "cpu"}
    assert meta["settings"]["steps"] == CLI_RUN_STEPS


def _our_workers(mark: str) -> list[psutil.Process]:
    """ranks.builtin.worker processes started by this test (they carry its mark as their tag)."""
    return worker_procs(("ranks.builtin.worker",), tag=mark)


@pytest.mark.slow
def test_sigkilled_run_replays_to_its_last_complete_step(tmp_path):
    rec = tmp_path / "killed.ddptui"
    mark = uuid.uuid4().hex
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err_file:
        proc = start_cli(*LIVE, "--steps", "0", "--record", str(rec), env=dict(NO_GPU, DDPTUI_TEST_SESSION=mark),
                         stdout=subprocess.DEVNULL, stderr=err_file)
    seen = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            if not rec.exists():
                continue
            try:
                got = loader.load(str(rec))  # the file as it is being written
            except recfile.RecordingError:
                continue
            seen = min((len(ks) for ks in got.steps_read().values()), default=0)
            if seen >= 3 and len(got.steps_read()) == 2:
                break
        assert seen >= 3, "the run recorded no steps in time"
        assert _our_workers(mark), "no workers were running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the workers notice the app is gone and exit by themselves
    deadline = time.monotonic() + 15
    left = _our_workers(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _our_workers(mark)
    for p in left:  # clean up before failing
        p.kill()
    assert not left, f"workers left behind: {[p.pid for p in left]}"
    # --steps 0 says at its start that it runs until Ctrl-C
    assert "ddptui: --steps 0: running until Ctrl-C (then the report)" in err_path.read_text().splitlines()[:3]

    out = tmp_path / "r.json"
    res = ddptui("replay", str(rec), "--headless", "--json", str(out))
    assert res.returncode == 0, res.stderr  # documented: damage is a warning, exit 0
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ddptui: warning: {rec}: file ends")
    doc = json.loads(out.read_text())
    assert doc["state"] == "incomplete" and "file ends" in doc["damage"]
    got = loader.load(str(rec))
    for s, ks in got.steps_read().items():
        assert ks == list(range(len(ks))) and len(ks) >= seen  # every step up to the last
        assert f"{s} steps 0–{ks[-1]}" in lines[0]
    assert {r["strategy"]: r["steps"] for r in doc["strategies"]} == \
        {s: len(ks) for s, ks in got.steps_read().items()}
    for row in doc["strategies"]:
        assert row["step_ms_median"] > 0 and row["allreduce_calls_per_step"] > 0
        assert row["strategy"] in res.stdout
    # summary and export read it the same way
    res2 = ddptui("summary", str(rec))
    assert res2.returncode == 0 and res2.stdout == res.stdout and res2.stderr == res.stderr
    res3 = ddptui("export", str(rec), "-o", str(tmp_path / "t.json"))
    assert res3.returncode == 0 and "file ends" in res3.stderr
    validate_trace(json.loads((tmp_path / "t.json").read_text()))


# -- arguments -------------------------------------------------------------------------------
@pytest.fixture
def small_rec(tmp_path):
    p = tmp_path / "s.ddptui"
    write_recording(p, synthetic_frames(steps=3))
    return p


@pytest.mark.parametrize("args,expect", [
    (["replay", "{f}", "--speed", "0.1"], "--speed must be in 0.25..8"),
    (["replay", "{f}", "--speed", "9"], "--speed must be in 0.25..8"),
    (["replay", "{f}", "--speed", "fast"], "--speed must be a number"),
    (["replay", "{f}", "--json", "x.json"], "--json needs --headless"),
    (["replay"], "FILE"),
    (["summary"], "FILE"),
    (["export"], "FILE"),
    (["summary", "{f}", "--json", "/no/such/dir/x.json"], "--json"),
    (["summary", "{f}", "--bogus"], "--bogus"),
])
def test_bad_arguments_are_one_line(small_rec, args, expect):
    res = ddptui_here(*[a.replace("{f}", str(small_rec)) for a in args])
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error: ") and expect in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("speed", ["0.25", "1", "8"])
def test_replay_ui_gets_speed_loop_and_title(small_rec, monkeypatch, speed):
    """`ddptui replay FILE` hands the file and options to the UI (launch.run_replay_app)."""
    import types

    from ddptui.cli import replay as cmd_replay
    calls = []

    def fake(path, speed=1.0, loop=False, title=None):
        calls.append((path, speed, loop, title))
        return 0
    try:
        import ddptui.ui.launch as launch
        monkeypatch.setattr(launch, "run_replay_app", fake)
    except ImportError:
        monkeypatch.setitem(sys.modules, "ddptui.ui.launch", types.SimpleNamespace(run_replay_app=fake))
    monkeypatch.setattr(cmd_replay, "require_terminal", lambda what, instead: None)  # as on a terminal
    assert cmd_replay.main([str(small_rec), "--speed", speed, "--loop", "--title", "My talk"]) == 0
    assert calls == [(str(small_rec), float(speed), True, "My talk")]


@pytest.mark.parametrize("args, says", [
    (("replay", "{f}"), "the replay UI needs a terminal; use --headless to print the figures"),
    (("--gpus", "2"), "the live UI needs a terminal; use --headless to run without one"),
    (("run", "--nproc-per-node", "2", "--", os.path.join(ROOT, "examples", "train_cnn.py")),
     "the live UI needs a terminal; use --headless to run without one"),
    (("attach", "127.0.0.1:29500"), "the attach UI needs a terminal; use --headless to print what is named"),
])
def test_uis_without_a_terminal_say_so_in_one_line(small_rec, args, says):
    res = run_main(*[a.replace("{f}", str(small_rec)) for a in args])  # (pytest's stdin is no tty)
    assert res.returncode == 2 and res.stderr.strip() == f"ddptui: error: {says}", res.stderr


def test_a_reader_that_closed_stdout_stops_it_quietly():
    """`ddptui summary DIR | head -2` was a BrokenPipeError traceback: stdout's reader gone
    (closed before anything is written, so every write fails), it stops with no word."""
    p = start_cli("summary", os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo"),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == "", err


def test_replay_headless_title(small_rec):
    res = ddptui_here("replay", str(small_rec), "--headless", "--title", "Naive vs DDP, recorded")
    assert res.returncode == 0 and "Naive vs DDP, recorded" in res.stdout


def test_talk_script():
    path = os.path.join(ROOT, "demo", "talk.sh")
    assert os.access(path, os.X_OK)
    assert subprocess.run(["bash", "-n", path]).returncode == 0
    text = open(path).read()
    assert "replay" in text and "--loop" in text and "--title" in text
    # a recording that does not exist is one error line, before any UI starts
    res = subprocess.run(["bash", path, "/no/such/run.ddptui"], capture_output=True, text=True,
                         timeout=60, env=cli_env(NO_GPU))
    assert res.returncode != 0 and "ddptui: error:" in res.stderr and "Traceback" not in res.stderr


def test_ui_without_a_terminal_is_a_clear_error(small_rec):
    for args in (["replay", str(small_rec)], ["--gpus", "2", "--no-record"]):
        res = ddptui_here(*args)
        assert res.returncode == 2
        assert res.stderr.strip().startswith("ddptui: error: the") and "use --headless" in res.stderr


# -- every numeric option of every verb ------------------------------------------------------
def _numeric_options():
    """(verb argv prefix, option) for every numeric option the verbs' parsers declare."""
    from ddptui.cli import main as cli, attach as cmd_attach, bench as cmd_bench, replay as cmd_replay, serve as cmd_serve, verify as cmd_verify
    from ddptui.cli.options import NUMERIC

    out = []
    for prefix, p in ((["--headless"], cli.live_parser()), (["bench"], cmd_bench.parser()),
                      (["replay", "rec.ddptui", "--headless"], cmd_replay.parser()),
                      (["verify"], cmd_verify.parser()), (["serve", "rec.ddptui"], cmd_serve.parser()),
                      (["attach", "127.0.0.1:1", "--headless"], cmd_attach.parser())):
        for a in p._actions:
            if a.type is None or not a.option_strings:
                continue
            # a typed option that bypassed ddptui.cli.options would escape the shared checks
            assert a.option_strings[0] in NUMERIC, a.option_strings
            assert a.type.__qualname__.split(".")[0] in ("Whole", "Real"), a.option_strings
            out.append((prefix, a.option_strings[0]))
    return out


def _out_of_range(opt: str) -> list[str]:
    from ddptui.cli.options import NUMERIC
    spec = NUMERIC[opt]
    lo = spec.lo if opt != "--steps" else 0
    return [str(lo - 1), str(spec.hi + 1)]


@pytest.mark.parametrize("prefix,opt", _numeric_options(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_every_bad_numeric_option_is_one_line_exit_2(prefix, opt, capsys):
    from ddptui.cli.main import main

    for bad in ["nan", "inf", "-inf", "NaN", "1e999", "x", ""] + _out_of_range(opt):
        rc = main(prefix + [f"{opt}={bad}"])  # "=": argparse would take "-inf" for an option
        err = capsys.readouterr()
        assert rc == 2, (opt, bad)
        assert err.out == ""
        lines = err.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"ddptui: error: {opt} must be"), (opt, bad, lines)


@pytest.mark.parametrize("verb", [["--headless", "--no-record"], ["bench"], ["replay", "x.ddptui"]])
def test_pg_timeout_and_speed_nan_refused_by_the_real_command(verb):
    opt = "--speed" if verb[0] == "replay" else "--pg-timeout"
    res = ddptui_here(*verb, opt, "nan")
    assert res.returncode == 2
    assert res.stderr == f"ddptui: error: {opt} must be a finite number (got 'nan')\n"
