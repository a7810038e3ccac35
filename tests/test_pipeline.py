"""The instrumented pipeline with real torchrun and 2 CPU ranks on gloo."""
from __future__ import annotations

import glob

import pytest
import torch

from ranks import spec
from ranks.wire import BWD, COMM, FWD, STEP

from .helpers import run_cli, run_main, run_live, assert_no_leftovers


MODEL = "small"
N_PARAMS = len(spec.param_table(MODEL))  # 8 tensors
N_LAYERS = len(spec.layer_names(MODEL))


STRATEGIES = ("naive", "interleaved", "ddp", "single", "gpipe", "1f1b")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real recorded run of every built-in strategy, the pipelines with 4 microbatches;
    small buckets so DDP has several."""
    d = tmp_path_factory.mktemp("w")
    r = run_live(steps=4, model=MODEL, strategies=STRATEGIES, batch=256, bucket_cap_mb=1.0,
                 record=str(d / "run.ddptui"), extra=["--save-weights", str(d / "weights"), "--microbatches", "4"])
    assert r.state == "finished", r.message
    r.weights_prefix, r.rec = str(d / "weights"), str(d / "run.ddptui")
    return r


def spans(run, strategy, step, rank):
    b = run.store.raw[strategy][step][rank]
    return [(b.kind[i], b.idx[i], b.t0[i], b.t1[i]) for i in range(len(b))]


def backward_end(sp):
    return max(t1 for k, _, _, t1 in sp if k == BWD)


@pytest.mark.slow
def test_every_strategy_reported_every_step(run):
    st = run.store
    for s in ("naive", "interleaved", "ddp"):
        assert st.complete_steps(s) == [0, 1, 2, 3]
        assert set(st.raw[s][3]) == {0, 1}
    assert st.complete_steps("single") == [0, 1, 2, 3]
    assert set(st.raw["single"][0]) == {0}  # single runs on one device only
    for s in ("gpipe", "1f1b"):
        assert st.complete_steps(s) == [0, 1, 2, 3] and set(st.raw[s][3]) == {0, 1}
    assert_no_leftovers(5)


@pytest.mark.slow
def test_the_built_in_pipelines_take_turns_with_the_other_strategies(run, tmp_path):
    """For talks: gpipe and 1f1b with 4 microbatches on 2 CPU ranks, taking turns step by step
    with the other strategies: the built-in model's blocks as one stage a rank, each pipeline
    step its 4 microbatches' forwards and backwards on the rank's own stage (1F1B's order), the
    sends and receives by direction, the bubble beside the plan (20 %), the global batch's
    samples a step, in the recording's summary and its JSON; a pipeline the run cannot make
    says so in one line."""
    import json

    from ddptui.recording.loader import load

    from .helpers import step_batches
    from .test_pipelining import microbatches
    js = tmp_path / "summary.json"
    r = run_main("summary", run.rec, "--json", str(js))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(js.read_text())
    rows = {row["strategy"]: row for row in doc["strategies"]}
    assert sorted(rows) == sorted(STRATEGIES), sorted(rows)
    for name in ("gpipe", "1f1b"):
        row = rows[name]
        assert row["steps"] == 4 and row["samples_per_s"] > 0 and row["compute_ms"] > 0, row
        pp = row["pipeline"]
        assert pp["schedule"] == name and pp["stages"] == 2 and pp["plan_pct"] == {"0": 20.0, "1": 20.0}, pp
        assert {r_: v["stages"] for r_, v in pp["ranks"].items()} == {"0": [0], "1": [1]}, pp
        assert all(v["microbatches"] == 4 for v in pp["ranks"].values()), pp
        assert f"pipeline {name}: 2 stages × 4 microbatches · bubble r0 " in r.stdout, r.stdout[-3000:]
        ops = {(c["op"], c["phase"]) for c in row["collectives"]}
        assert {("send", "forward"), ("recv", "forward"), ("send", "backward"), ("recv", "backward")} <= ops, ops
    got = load(run.rec)
    for k, ranks in step_batches(got, "1f1b").items():
        for r_, b in ranks.items():
            ms = microbatches(b)
            assert [f"{p}{mb}" for _, mb, p, _, _ in ms] == (
                ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"] if r_ == 0 else
                ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]), (k, r_, ms)
            assert {s for s, *_ in ms} == {r_}, (k, r_)
    bad = run_main("--headless", "--gpus", "2", "--strategies", "1f1b", "--microbatches", "1")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "ddptui: error: 1f1b needs --microbatches at least the stages' count (2); got 1"], bad.stderr
    bad = run_main("verify", "--gpus", "2", "--strategies", "naive,gpipe", "--steps", "3")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not the pipelines (gpipe)" in bad.stderr


@pytest.mark.slow
def test_layer_spans_forward_then_backward_reversed(run):
    for s in ("naive", "interleaved", "ddp", "single"):
        sp = spans(run, s, 2, 0)
        fwd = sorted((t0, idx) for k, idx, t0, _ in sp if k == FWD)
        bwd = sorted((t0, idx) for k, idx, t0, _ in sp if k == BWD)
        assert [i for _, i in fwd] == list(range(N_LAYERS))
        assert [i for _, i in bwd] == list(reversed(range(N_LAYERS))), s
        assert max(t for t, _ in fwd) < min(t for t, _ in bwd)
        step = [(t0, t1) for k, _, t0, t1 in sp if k == STEP][0]
        assert all(step[0] <= t0 and t1 <= step[1] for k, _, t0, t1 in sp)


@pytest.mark.slow
def test_naive_allreduces_after_backward(run):
    for step in range(4):
        for rank in (0, 1):
            sp = spans(run, "naive", step, rank)
            comm = [(idx, t0) for k, idx, t0, _ in sp if k == COMM]
            assert sorted(i for i, _ in comm) == list(range(N_PARAMS))
            assert all(t0 >= backward_end(sp) for _, t0 in comm)
    s = run.store.summary("naive")
    assert s["allreduce_calls_per_step"] == N_PARAMS
    assert s["overlap_pct"] < 5


@pytest.mark.slow
def test_interleaved_allreduces_during_backward(run):
    for step in range(4):
        for rank in (0, 1):
            sp = spans(run, "interleaved", step, rank)
            comm = [(idx, t0) for k, idx, t0, _ in sp if k == COMM]
            assert sorted(i for i, _ in comm) == list(range(N_PARAMS))
            assert any(t0 < backward_end(sp) for _, t0 in comm)
    assert run.store.summary("interleaved")["allreduce_calls_per_step"] == N_PARAMS


@pytest.mark.slow
def test_interleaved_allreduces_run_concurrently_and_the_lane_shows_it(run):
    """gloo runs async collectives on two threads at once: the comm spans overlap (their
    true intervals, not one-at-a-time), exposed communication is computed on them, and the
    comm lane gives them sub-rows (or, one row tall, marks the overlap)."""
    from ddptui.ui.widgets.lanes import comm_bars
    from ddptui.ui.widgets.theme import COMM_A, COMM_B, COMM_LAST, COMM_MULTI
    bar = (COMM_A, COMM_B, COMM_LAST)  # an AllReduce's transfer (the last arriver's in its colour)

    found = None
    for step in range(1, 4):
        for rank in (0, 1):
            comm = sorted((t0, t1) for k, _, t0, t1 in spans(run, "interleaved", step, rank) if k == COMM)
            if any(b0 < a1 for (_, a1), (b0, _) in zip(comm, comm[1:])):
                found = (step, rank)
    assert found, "no two interleaved AllReduces overlap in any step"
    step, rank = found
    view = run.store.view("interleaved", step)
    one_row = comm_bars(view.spans[rank], str, 0, 1)
    assert any(c == COMM_MULTI and z > a for a, z, c, _ in one_row)
    two_rows = [comm_bars(view.spans[rank], str, r, 2) for r in (0, 1)]
    assert all(any(c in bar for _, _, c, _ in bars) for bars in two_rows)
    n_comm = sum(1 for s in view.spans[rank] if s.kind == COMM)
    assert sum(1 for bars in two_rows for _, _, c, _ in bars if c in bar) == n_comm


@pytest.mark.slow
def test_ddp_buckets_match_what_ddp_reports(run):
    st = run.store
    history = st.bucket_assignments[("ddp", 0)]
    final = history[-1]
    assert final[0] == 1  # DDP rebuilds its buckets at the start of the second step
    sizes = [b[2] for b in sorted(final[2])]
    assert len(sizes) >= 2
    # what DDP itself reports (the worker reads _get_ddp_logging_data) vs what our comm hook saw
    assert sizes == st.ddp_reported("ddp", 0) == st.ddp_reported("ddp", 1)
    covered = sorted(p for b in final[2] for p in b[1])
    assert covered == list(range(N_PARAMS))  # every parameter exactly once
    for step in (1, 2, 3):
        for rank in (0, 1):
            sp = spans(run, "ddp", step, rank)
            comm = sorted(idx for k, idx, _, _ in sp if k == COMM)
            assert comm == list(range(len(sizes)))
            assert any(t0 < backward_end(sp) for k, _, t0, _ in sp if k == COMM)


@pytest.mark.slow
def test_figures_are_consistent(run):
    st = run.store
    for s in ("naive", "interleaved", "ddp"):
        row = st.summary(s)
        assert row["steps"] == 4
        assert 0 <= row["exposed_comm_ms"] <= row["comm_ms"] + 1e-9
        assert row["bytes_per_step"] == pytest.approx(spec.param_count(MODEL) * 4)
        assert row["samples_per_s"] == pytest.approx(256 / (row["step_ms_median"] / 1e3))
        # README: overlap % = 1 - exposed/communication, written out here, not the app's function
        assert row["overlap_pct"] == pytest.approx(100 * (1 - row["exposed_comm_ms"] / row["comm_ms"]))
        for step in range(4):  # comm and exposed comm of each rank, counted microsecond by microsecond
            for rank in (0, 1):
                sp = spans(run, s, step, rank)
                comm = {t for k, _, t0, t1 in sp if k == COMM for t in range(t0, t1)}
                comp = {t for k, _, t0, t1 in sp if k in (FWD, BWD) for t in range(t0, t1)}
                got = st.rank_figures(s, step, rank)
                assert got.comm_ms == pytest.approx(len(comm) / 1e3)
                assert got.exposed_ms == pytest.approx(len(comm - comp) / 1e3)
    assert st.summary("single")["comm_ms"] == 0


@pytest.mark.slow
def test_all_strategies_reach_the_same_weights(run):
    files = sorted(glob.glob(run.weights_prefix + ".rank*.pt"))
    assert len(files) == 2
    w0 = torch.load(files[0])
    w1 = torch.load(files[1])
    assert set(w0) == set(STRATEGIES)
    ref = w0["single"]
    for s in ("naive", "interleaved", "ddp"):
        for name, t in ref.items():
            assert torch.allclose(w0[s][name], t, rtol=1e-4, atol=1e-5), (s, name)
            assert torch.allclose(w1[s][name], w0[s][name], rtol=1e-5, atol=1e-6), (s, name)
    # the pipelines: each rank trains its own stage's part of the model (it holds the whole),
    # as single trained it (the microbatches' gradients averaged to the global batch's): every
    # parameter as single's on a rank, each rank some that the other's untrained copy is not
    for s in ("gpipe", "1f1b"):
        same = {name: [r for r, w in enumerate((w0, w1)) if torch.allclose(w[s][name], t, rtol=1e-4, atol=1e-5)]
                for name, t in ref.items()}
        assert all(rs for rs in same.values()), (s, same)
        assert {rs[0] for rs in same.values() if len(rs) == 1} == {0, 1}, (s, same)
    # and training moved them at all
    from ranks.builtin.models import build_model
    init = build_model(MODEL, seed=42).state_dict()
    assert not torch.allclose(init["fc1.0.weight"], ref["fc1.0.weight"])


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "0"], "--gpus must be 1..64"),
    (["--gpus", "-3"], "--gpus must be 1..64"),
    (["--gpus", "100000"], "--gpus must be 1..64"),
    (["--gpus", "two"], "--gpus must be a whole number"),
    (["--model", "huge"], "unknown model 'huge'"),
    (["--strategies", "naive,warp"], "unknown strategy 'warp'"),
    (["--strategies", ""], "--strategies is empty"),
    (["--batch-size", "3"], "must divide evenly across 2 ranks"),
    (["--steps", "-1"], "--steps must be"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb must be positive"),
    (["--pg-timeout", "0"], "--pg-timeout must be positive"),
    (["--bogus-flag"], "unrecognized arguments"),
    (["summry", "x.ddptui"], "unknown command 'summry' (did you mean summary?)"),
])
def test_bad_input_one_line_nonzero(args, needle):
    p = run_main("--headless", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ddptui: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in p.stderr


def test_more_gpus_than_exist():
    p = run_main("--headless", "--gpus", "4", env={"DDPTUI_GPU_COUNT": "2"})
    assert p.returncode == 2
    assert p.stderr.strip() == ("ddptui: error: --gpus 4 but only 2 GPU(s) present; "
                                "to run 4 ranks on 2 GPU(s) use --gpus 2 --ranks 4")


def test_plan_backends():
    from ddptui.live.launcher import plan
    assert plan(2, None, available=0).device == "cpu"
    p = plan(1, 2, available=1)
    assert p.device == "cuda" and p.ranks == 2 and "gloo with CUDA tensors" in p.note
    assert "nccl" in plan(2, None, available=2).note


@pytest.mark.gpu
def test_cuda_nccl_one_gpu():
    p = run_cli("--headless", "--gpus", "1", "--model", "small", "--steps", "3", "--no-record",
                "--strategies", "ddp,single", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "nccl" in p.stdout


@pytest.mark.gpu
def test_cuda_gloo_two_ranks_one_gpu():
    p = run_cli("--headless", "--gpus", "1", "--ranks", "2", "--model", "small", "--steps", "3",
                "--no-record", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "gloo with CUDA tensors" in p.stderr
