"""`ddptui bench` (real torchrun, CPU ranks) and the benchmark scripts' quick runs.

No speed goal is asserted here: the benchmarks print their figures; these tests check that
the command and the scripts run and produce well-formed, arithmetically consistent output.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from ranks import spec

from .helpers import ROOT, run_cli, run_main, assert_no_leftovers, worker_procs

TABLE_COLUMNS = ("model", "strategy", "ranks", "params", "step ms (median)", "comm ms",
                 "samples/s", "speedup vs single")
ROW_FIELDS = ("model", "strategy", "ranks", "params", "steps", "step_ms_median", "comm_ms",
              "samples_per_s", "speedup_vs_single", "ring_bytes_per_rank_per_step",
              "bus_bw_gbps", "model_bus_bw_gbps", "predicted_comm_ms", "amdahl_f",
              "amdahl_ceiling")


@pytest.mark.slow
def test_bench_table_json_csv_and_cost_model(tmp_path):
    js, cs = tmp_path / "b.json", tmp_path / "b.csv"
    p = run_cli("bench", "--models", "small", "--steps", "2", "--batch-size", "256", "--gpus", "2",
                "--json", str(js), "--csv", str(cs), timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    # progress on stderr: the model, ranks starting, steps done; CPU ranks said as such
    assert "model small" in p.stderr and "starting 2 CPU rank(s)" in p.stderr
    assert "no GPU" in p.stderr
    assert re.search(r"steps: .*single 2/2", p.stderr)
    out = p.stdout
    for col in TABLE_COLUMNS:
        assert col in out, col
    assert "cost model" in out and "Amdahl" in out

    doc = json.loads(js.read_text())
    assert doc["state"] == "finished"
    assert doc["settings"]["ranks"] == 2 and doc["settings"]["device"] == "cpu"
    rows = doc["rows"]
    assert [r["strategy"] for r in rows] == ["single", "naive", "interleaved", "ddp", "fsdp"]
    params = spec.param_count("small")
    n = 2
    for r in rows:
        for k in ROW_FIELDS:
            assert k in r, k
        assert r["model"] == "small" and r["params"] == params and r["steps"] == 2
        assert r["step_ms_median"] > 0 and r["samples_per_s"] > 0
        assert r["samples_per_s"] == pytest.approx(256 / (r["step_ms_median"] / 1e3))
        if r["strategy"] == "single":
            assert r["ranks"] == 1 and r["speedup_vs_single"] == 1.0
            assert r["ring_bytes_per_rank_per_step"] == 0
            continue
        assert r["ranks"] == n
        # seed 001: bytes per rank per step = 2(N-1)/N x params x 4 (fp32 gradients); FSDP:
        # all-gathers before forward and backward and a reduce-scatter, each (N-1)/N: 3(N-1)/N
        times = 3 if r["strategy"] == "fsdp" else 2
        assert r["ring_bytes_per_rank_per_step"] == pytest.approx(times * (n - 1) / n * params * 4)
        # every gradient byte went through an AllReduce (FSDP: every parameter byte gathered
        # twice and every gradient byte scattered once)
        assert r["allreduce_bytes_per_step"] == pytest.approx((3 if times == 3 else 1) * params * 4)
        # bus bandwidth: ring bytes over measured comm time; prediction: bytes / best bandwidth
        assert r["bus_bw_gbps"] == pytest.approx(r["ring_bytes_per_rank_per_step"] / (r["comm_ms"] / 1e3) / 1e9)
        assert r["predicted_comm_ms"] == pytest.approx(
            r["ring_bytes_per_rank_per_step"] / (r["model_bus_bw_gbps"] * 1e9) * 1e3)
        assert r["predicted_comm_ms"] <= r["comm_ms"] * (1 + 1e-9)
        assert r["speedup_vs_single"] == pytest.approx(rows[0]["step_ms_median"] / r["step_ms_median"])
    # seed 002: f = T_single / (T_single + T_comm naive), ceiling = 1 / ((1 - f) + f / N)
    m = doc["models"][0]
    naive = next(r for r in rows if r["strategy"] == "naive")
    f = rows[0]["step_ms_median"] / (rows[0]["step_ms_median"] + naive["comm_ms"])
    assert m["amdahl_f"] == pytest.approx(f)
    assert m["amdahl_ceiling"] == pytest.approx(1 / ((1 - f) + f / n))
    assert 1 <= m["amdahl_ceiling"] <= n

    with open(cs, newline="") as fh:
        got = list(csv.DictReader(fh))
    assert [g["strategy"] for g in got] == ["single", "naive", "interleaved", "ddp", "fsdp"]
    assert float(got[1]["ring_bytes_per_rank_per_step"]) == pytest.approx(params * 4)  # N = 2
    assert_no_leftovers(5)


@pytest.mark.parametrize("args,needle", [
    (["--models", "huge"], "unknown model 'huge'"),
    (["--models", ""], "--models is empty"),
    (["--strategies", "single"], "needs at least one of"),
    (["--strategies", "naive,warp"], "unknown strategy 'warp'"),
    (["--steps", "1"], "--steps must be"),
    (["--gpus", "0"], "--gpus must be"),
    (["--batch-size", "3"], "must divide evenly across 2 ranks"),
    (["--json", "/nonexistent-dir/x.json"], "does not exist"),
    (["--record-dir", "/nonexistent-dir"], "no such directory"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bench_bad_input_one_line_exit_2(args, needle):
    p = run_main("bench", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error:") and needle in lines[0], p.stderr


# the quick figures that run in minutes here, in parts that can run side by side: the ones that
# start torchrun (P1; P5, heavy: its `ddptui --headless` start-up is every headless test's, e.g.
# test_cli_verbs' cli_run, and run_all's table is checked on the other parts) and those that do
# not. (P1 stays: nothing else runs its worker, ranks/builtin/bench_overhead.py, which the GPU
# pass's P1 steps need.) P6, P9 and P11 start many ranks
# or record real runs: `benchmarks/run_all.py` runs them all (benchmarks/README.md)
QUICK = {
    "torchrun": ("P1", (r"^P1 overhead median_ratio",)),
    "P5": ("P5", (r"^P5 startup first_step_s",)),
    "in-process": ("P2,P3,P4,P7,P8,P10", (
        r"^P2 ingest events_per_s", r"^P4 replay bytes_per_span", r"^P4 replay open_index_s",
        r"^P7 hook_cost us_per_layer", r"^P10a stragglers named_pct", r"^P8 trace_import rss_ratio",
        r"^P8 trace_import mb_per_cpu_s", r"^P3\w* \S+ \S+")),
}


@pytest.mark.slow
@pytest.mark.parametrize("half", [pytest.param(h, marks=pytest.mark.heavy) if h == "P5" else h
                                  for h in sorted(QUICK)])
def test_benchmarks_quick_print_their_figures(half):
    only, patterns = QUICK[half]
    env = os.environ.copy()
    env.setdefault("OMP_NUM_THREADS", "1")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run_all.py"), "--quick", "--only", only],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    out = p.stdout
    figure = r"=\S+ goal(<=|>=)\S+ (OK|MISS|SMOKE)$"
    for pattern in patterns:
        assert re.search(pattern + figure, out, re.M), pattern
    if "P10" in only:  # synthetic recordings: a smoke test, never read as the goal met
        assert re.search(r"^P10a stragglers named_pct=\S+ goal>=\S+ SMOKE$", out, re.M)
    # the summary table names every benchmark run
    table = out[out.rindex("benchmark"):]
    for tag in only.split(","):
        assert tag in table
    assert "FAILED" not in table
    if "P10" in only:
        assert re.search(r"^P10a stragglers\s.*\sSMOKE\s", table, re.M), table
    assert worker_procs(("ranks.builtin.bench_overhead", "trivial_worker.py")) == []


def test_p3_versus_takes_frames_in_turn_from_each_revisions_own_loop(tmp_path):
    """`p3_drawing.py --vs`'s P3a: two processes, each running a revision's own frame loop,
    paced one frame at a time through their clock reads. Here both are this checkout; a
    revision whose loop stops early is reported in one line, not waited for."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import p3_drawing
    finally:
        sys.path.pop(0)
    got = p3_drawing.paced_frames({"a": ROOT, "b": ROOT}, 4)
    assert set(got) == {"a", "b"} and all(len(v) == 4 and min(v) > 0 for v in got.values()), got
    # a "revision" without the benchmark: the pacing ends with its error, no hang
    with pytest.raises(SystemExit, match="stopped"):
        p3_drawing.paced_frames({"a": ROOT, "b": str(tmp_path)}, 4, timeout_s=60)


def test_the_gpu_pass_preflight_names_a_missing_extra(tmp_path):
    """The GPU pass stops at its preflight, naming the package, when anything pyproject.toml asks
    for (the test extra included) is missing or too old; here everything is."""
    script = os.path.join(ROOT, "benchmarks", "gpu_pass_needs.py")
    ok = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "packages pyproject.toml asks for are here" in ok.stdout, ok.stdout + ok.stderr
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    fake = tmp_path / "pyproject.toml"
    fake.write_text(text.replace('"tabulate>=0.9",', '"tabulate>=0.9",\n  "no-such-package-here>=1",\n  "pytest>=999",'))
    bad = subprocess.run([sys.executable, script, "--pyproject", str(fake)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "no-such-package-here missing (wants >=1)" in bad.stdout and "pytest " in bad.stdout, bad.stdout


def test_run_all_versus_a_revision_puts_each_figure_beside_its(tmp_path):
    """`run_all.py --vs REV`: REV's benchmark (from a git worktree, removed after) and this
    checkout's in turn, each figure's medians side by side with the ratio; a bad REV is one
    line and exit 2."""
    run_all = os.path.join(ROOT, "benchmarks", "run_all.py")
    # (P10's quick figures: synthetic recordings, a second a turn, the same on both sides)
    p = subprocess.run([sys.executable, run_all, "--quick", "--only", "P10", "--vs", "HEAD", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "ratio: this code / HEAD" in p.stdout, p.stdout[-2000:]
    assert re.search(r"^P10a stragglers named_pct\s+\S+\s+\S+\s+1\.000\s", p.stdout, re.M), p.stdout[-2000:]
    assert re.search(r"^P10b stragglers excess_err_ms=\S+ \(HEAD, round 1, ", p.stdout, re.M), p.stdout[-2000:]
    trees = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, cwd=ROOT).stdout
    assert "ddptui-vs-" not in trees, trees
    bad = subprocess.run([sys.executable, run_all, "--only", "P4", "--vs", "no-such-revision"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("run_all: cannot check out no-such-revision"), bad.stderr


@pytest.mark.slow
def test_the_gpu_pass_rehearses_on_a_cpu_up_to_its_first_step(tmp_path):
    """`benchmarks/gpu_pass.sh pass` on this machine, its steps all skipped and no set-up (this
    Python as it is): it parses, reports the environment, and its preflight (the project
    imports, the suite collects, every package pyproject asks for is here) passes, so a GPU
    session never loses its minutes to a broken pass. (Every step rehearsed on a CPU:
    GPU_PASS_QUICK=1, ~75 s, benchmarks/README.md.)"""
    words = ("headless-gloo headless-nccl verify-nccl verify-gloo tests-gpu p1 p1-host p7 user-nccl nvml "
             "deep40 cost nccl-timing")
    env = dict(os.environ, GPU_PASS_QUICK="1", GPU_PASS_NO_SETUP="1", GPU_PASS_PYTHON=sys.executable,
               GPU_PASS_SKIP=words, GPU_PASS_WORK=str(tmp_path / "work"))
    p = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_pass.sh"), "pass", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    summary = (tmp_path / "out" / "summary-pass.txt").read_text()
    assert p.returncode == 0, (p.stdout + p.stderr + summary)[-3000:]
    assert "preflight: the project imports and the suite collects" in summary, summary
    assert re.search(r"\d+ tests? collected", summary), summary
    assert "FAILED" not in summary and "syntax error" not in p.stderr, summary + p.stderr
    for w in words.split():
        assert f"SKIPPED {w} (GPU_PASS_SKIP)" in summary, (w, summary)
