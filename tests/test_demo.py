"""`ddptui demo`: simulated runs, recorded for real and read back through the real CLI.

- the A100 profile agrees with seed 002's table (benchmark P9c's tolerance) and uses P9c's
  collective model and table;
- a simulated recording is never reported without its label: summary (table and JSON),
  replay --headless, the Chrome and Kineto exports, and the UI (title bar, headline, figures
  panel) through Textual's Pilot;
- bad input is one line and exit status 2.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddptui.model import profiles
from ddptui.recording.replay import ReplaySource
from ddptui.ui.app import DdpApp
from ddptui.ui.widgets import FiguresPanel

from .test_app import drawn, settle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DDPTUI = [sys.executable, "-m", "ddptui.cli.main"]
LABEL = "SIMULATED · 4x A100 80GB PCIe · 2 GPUs"


def cli(*args, cwd=None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(DDPTUI + list(args), capture_output=True, text=True, cwd=cwd or ROOT, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("demo") / "sim.ddptui")
    p = cli("demo", "--headless", "--gpus", "2", "--model", "medium", "--steps", "8",
            "--strategies", "naive,interleaved,ddp,single,fsdp", "-o", path)
    assert "SIMULATED" in p.stdout and "step 8/8" in p.stderr
    return path


def test_the_profile_is_p9cs_table_and_collective_model():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import p9c_seed002 as p9c
    finally:
        sys.path.pop(0)
    assert profiles.SEED002 == p9c.TABLE
    assert profiles.comm_fit() == p9c.calibrate()
    a100 = profiles.PROFILES["a100-pcie"]
    for m in profiles.SEED_MODELS:  # calibrated: single-GPU steps match the seed's
        assert a100.single_ms(m) == pytest.approx(profiles.seed_step_ms(m, 1, "single"), rel=0.03)


def test_seed_table_side_by_side_within_p9cs_tolerance():
    p = cli("demo", "--seed-table", "--steps", "8")
    lines = p.stdout.splitlines()
    assert lines[0].startswith("SIMULATED")
    for m in profiles.SEED_MODELS:
        for n in (2, 4):
            for s in ("naive", "interleaved", "ddp"):
                assert any(ln.split()[:3] == [m, str(n), s] for ln in lines), (m, n, s)
    assert "within benchmark P9c's tolerance of 15 %" in lines[-1]


def test_extrapolations_are_named(tmp_path):
    path = str(tmp_path / "h100.ddptui")
    p = cli("demo", "--headless", "--profile", "h100-nvlink", "--gpus", "8", "--model", "small",
            "--steps", "4", "--strategies", "naive,ddp,fsdp", "-o", path)
    assert "SIMULATED · 8x H100 80GB SXM NVLink · 8 GPUs (not measured)" in p.stdout
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("small ")]
    assert len(rows) == 3 and all("extrapolation: 8x H100" in ln for ln in rows)
    assert "every other figure above is an extrapolation" in p.stdout


def test_summary_json_and_replay_headless_say_simulated(simulated, tmp_path):
    out = tmp_path / "s.json"
    p = cli("summary", simulated, "--json", str(out))
    assert f"{LABEL} (not measured)" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["simulated"]["label"] == LABEL and doc["simulated"]["profile"] == "a100-pcie"
    assert doc["simulated"]["extrapolated"]["fsdp"] and doc["simulated"]["extrapolated"]["ddp"] is None
    p = cli("replay", simulated, "--headless", "--title", "my talk")
    assert LABEL in p.stdout.splitlines()[0] + p.stdout  # a given title does not drop it
    assert "SIMULATED" in p.stdout.split("my talk")[0]


def test_whatif_says_its_input_was_simulated(simulated, tmp_path):
    out = tmp_path / "w.json"
    p = cli("whatif", simulated, "--json", str(out))
    assert p.stdout.startswith(f"{LABEL}: the recording is a simulated run"), p.stdout[:300]
    assert json.loads(out.read_text())["simulated"] == LABEL


def test_exports_say_simulated(simulated, tmp_path):
    trace = tmp_path / "t.json"
    cli("export", simulated, "-o", str(trace))
    doc = json.loads(trace.read_text())
    assert doc["otherData"]["SIMULATED"].startswith(LABEL)
    assert doc["otherData"]["simulated"]["profile"] == "a100-pcie"
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names and all(LABEL in n for n in names)
    kdir = tmp_path / "k"
    cli("export", simulated, "--format", "kineto", "-o", str(kdir))
    files = sorted(os.listdir(kdir))
    assert files == ["rank0.json", "rank1.json"]
    for f in files:
        k = json.loads((kdir / f).read_text())
        assert k["SIMULATED"].startswith(LABEL) and k["ddptui"]["simulated"]["name"] == "4x A100 80GB PCIe"


def test_a_measured_recording_carries_no_label(tmp_path):
    out = tmp_path / "s.json"
    p = cli("summary", "demo/cpu-small-2ranks.ddptui", "--json", str(out))
    assert "SIMULATED" not in p.stdout and "simulated" not in json.loads(out.read_text())


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(160, 45), (80, 24)])
async def test_the_ui_says_simulated_title_headline_figures(simulated, size):
    app = DdpApp(ReplaySource(simulated, speed=8.0), title="A talk")
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        app.source.seek(6)
        await settle(pilot)
        title = drawn(app.query_one("#title"))[0]
        assert title.startswith(" ddptui  SIMULATED")
        if size[0] >= 120:
            assert LABEL in title
        assert "SIMULATED" in drawn(app.query_one("#headline"))[0]
        if app.query_one(FiguresPanel).display:
            assert "SIMULATED" in "\n".join(drawn(app.query_one(FiguresPanel)))


@pytest.mark.parametrize("args, says", [
    (["--profile", "tpu"], "invalid choice: 'tpu'"),
    (["--gpus", "8"], "--gpus 8: profile a100-pcie (4x A100 80GB PCIe) has 4 GPUs"),
    (["--gpus", "1"], "data parallelism needs 2 GPUs"),
    (["--model", "huge"], "--model: unknown model 'huge'"),
    (["--strategies", "ddp,zero"], "unknown strategy 'zero'"),
    (["--steps", "1"], "--steps must be 2 or more"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, tmp_path):
    p = cli("demo", "--headless", "-o", str(tmp_path / "x.ddptui"), *args, check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("ddptui: error: ") and says in p.stderr
    assert not os.path.exists(tmp_path / "x.ddptui")


def test_help_explains():
    p = cli("demo", "--help")
    for want in ("SIMULATED", "a100-pcie", "h100-nvlink", "extrapolation", "--seed-table"):
        assert want in p.stdout
