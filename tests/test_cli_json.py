"""`--json PATH|-` on every verb that writes JSON ('-': stdout, the text report on stderr), and
what the reports of the demo recordings say (in-process: `run_main`, no ranks started)."""
from __future__ import annotations

import json
import os

import pytest

from .helpers import ROOT, run_main

GLOO = os.path.join(ROOT, "demo", "gpu-h100-xlarge-2ranks-gloo.ddptui")
NCCL1 = os.path.join(ROOT, "demo", "gpu-h100-xlarge-1rank-nccl.ddptui")


def test_summary_json_dash_is_stdout_with_why_comm_dwarfs_compute(tmp_path):
    got = run_main("summary", GLOO, "--json", "-", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)  # stdout is the JSON alone
    assert not os.path.exists(tmp_path / "-")
    assert "why comm dwarfs compute" in got.stderr  # the text report, on stderr
    why = doc["shared_gpu"]
    assert why["ranks"] == 2 and why["backend"] == "gloo" and why["strategy"] == "ddp"
    assert why["bytes_per_step"] > 200e6 and 1 < why["bus_gbps"] < 3
    assert why["comm_ms"] > 10 * why["compute_ms"] and why["nvlink_ms"] < 2
    assert why["commands"][1] == f"ddptui whatif {GLOO} --bus-gbps 450"
    assert f"ddptui whatif {GLOO} --bus-gbps 450" in got.stderr  # the hint names the recording


def test_json_taking_the_recording_is_one_clear_line(tmp_path):
    got = run_main("summary", "--json", GLOO, cwd=tmp_path)
    assert got.returncode == 2
    assert got.stderr.count("\n") == 1 and "--json took" in got.stderr and "Traceback" not in got.stderr
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("verb", [["summary", GLOO], ["replay", "--headless", GLOO], ["whatif", GLOO],
                                  ["bench"], ["verify"], ["run", "x.py"], []])
def test_every_json_option_says_path_or_dash(verb):
    got = run_main(*[v for v in verb if v != GLOO and v != "x.py"], "--help")
    assert "--json PATH|-" in got.stdout, got.stdout[-2000:]


def test_live_verbs_take_json_dash_without_making_a_file(tmp_path):
    from ddptui.cli.main import build_live
    from ddptui.cli.run import build
    a, _, _ = build_live(["--headless", "--no-record", "--json", "-"])
    assert a.json == "-"
    script = os.path.join(ROOT, "examples", "train_cnn.py")
    assert build(["--headless", "--no-record", "--json", "-", "--", script])[0].json == "-"


def test_replay_headless_json_dash(tmp_path):
    got = run_main("replay", "--headless", GLOO, "--json", "-", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["shared_gpu"]["strategy"] == "ddp"
    assert not os.path.exists(tmp_path / "-")


def test_whatif_at_another_bus_says_which_bus_and_why_measured_is_blank():
    got = run_main("whatif", GLOO, "--bus-gbps", "450")
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "the bus asked for, 450 GB/s" in out and "not the fitted 1.08 GB/s" in out
    assert "bus 1.08 GB/s: the fitted per-MB cost" in out
    assert "measured: none (--bus-gbps 450: a what-if of another bus" in out
    doc = json.loads(run_main("whatif", GLOO, "--bus-gbps", "450", "--json", "-").stdout)
    assert doc["fit"]["bus_gbps_used"] == 450
    got = run_main("whatif", GLOO, "--world", "2,4")  # world 4 was not run: said so
    assert "measured –: the recording ran 2 ranks, not that many" in got.stdout
    assert "measured: none" not in got.stdout
