"""Data parallelism written by hand under `ddptui run --auto` (real torchrun, gloo CPU ranks):
no DDP, no FSDP2, the script reduces its gradients itself (tests/scripts/handwritten.py, the
course's 7-layer MLP). The model is found at its optimizer's first step (the modules called
with autograd on, the outermost holding parameters it updates); a step is an optimizer step;
each all_reduce of a parameter's `.grad` is that parameter's gradient AllReduce, a COMM span
as the built-in naive strategy draws its own; the run is named by the form its first step
shows: naive (every all_reduce after the backward), interleaved (issued from the backward's
hooks). A run with no collective says so in one line.
"""
from __future__ import annotations

import pytest

from tests.helpers import SPAN_BWD, SPAN_COLL, SPAN_COMM, SPAN_FWD, SPAN_OTHER, SPAN_STEP, run_cli, run_script, spans_of, step_batches, ROOT

# (real torchrun runs; the tests reading one run go to one pytest-xdist worker, made once)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("handwritten")]

ITERS = 12
N_PARAMS = 14  # 7 Linear layers: a weight and a bias each
MICRO = 2  # the loop form's micro-steps a step (gradient accumulation)


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    """The naive form, rank 0 evaluating under no_grad before every third iteration, the
    gradients of MICRO micro-steps accumulated before each reduction."""
    d = tmp_path_factory.mktemp("loop")
    return run_script(d, "handwritten.py", "--how", "loop",
                      "--iters", str(ITERS), "--eval-every", "3", "--micro", str(MICRO)) + (d / "run.ddptui",)


@pytest.fixture(scope="module")
def hook_run(tmp_path_factory):
    """The interleaved form: each parameter's post-accumulate-grad hook reduces it."""
    return run_script(tmp_path_factory.mktemp("hook"), "handwritten.py", "--how", "hook",
                      "--iters", str(ITERS))


def _linear_layers(got) -> list[int]:
    """The drawn layers holding parameters (the Linear ones), in forward order."""
    params = got.store.meta.params
    return sorted({p[2] for p in params})


def test_the_loop_form_is_naive_every_all_reduce_after_the_backward(loop_run):
    """backward(), then a blocking all_reduce per parameter: drawn as naive, one COMM span per
    parameter a step, every one after the step's last backward span, none overlapped; steps
    are the optimizer's (the first one finds the model: not drawn), numbered alike on both
    ranks, the micro-steps of an accumulation inside them; rank 0's evaluation is OTHER time,
    never a step or a forward."""
    doc, got, _, _ = loop_run
    (row,) = doc["strategies"]
    assert row["strategy"] == "naive", row
    assert row["steps"] == ITERS - 1, row
    assert row["allreduce_calls_per_step"] == N_PARAMS, row
    assert row["overlap_pct"] == 0.0, row
    assert row["exposed_comm_ms"] == pytest.approx(row["comm_ms"]), row
    batches = step_batches(got, "naive")
    assert sorted(batches) == list(range(ITERS - 1)), sorted(batches)
    n_layers = len(doc["layers"])
    evals = []
    for k, ranks in batches.items():
        assert sorted(ranks) == [0, 1], (k, sorted(ranks))
        for r, b in ranks.items():
            comm = spans_of(b, SPAN_COMM)
            assert sorted(i for i, _, _ in comm) == list(range(N_PARAMS)), (k, r, comm)
            assert not spans_of(b, SPAN_COLL), (k, r)
            bwd = spans_of(b, SPAN_BWD)
            assert bwd, (k, r)
            last_bwd = max(t1 for _, _, t1 in bwd)
            assert all(t0 >= last_bwd for _, t0, _ in comm), (k, r, last_bwd, comm)
            fwd = spans_of(b, SPAN_FWD)
            assert sorted(i for i, _, _ in fwd) == sorted(list(range(n_layers)) * MICRO), (k, r, fwd)
            (_, s0, s1), = spans_of(b, SPAN_STEP)
            assert max(t1 for _, _, t1 in comm) <= s1, (k, r)
            if spans_of(b, SPAN_OTHER):
                evals.append((k, r))
    # rank 0 evaluates before iterations 0, 3, 6, 9: steps 2, 5, 8 (iteration 0 finds the model)
    assert evals == [(k, 0) for k in (2, 5, 8)], evals


def test_the_hook_form_is_interleaved_and_hides_part_of_its_communication(hook_run):
    """all_reduce(p.grad, async_op=True) from each parameter's hook while the backward goes on:
    drawn as interleaved, a COMM span per parameter, the first ones issued before the
    backward ends (while a layer below still computes), communication partly hidden."""
    doc, got, _ = hook_run
    (row,) = doc["strategies"]
    assert row["strategy"] == "interleaved", row
    assert row["steps"] == ITERS - 1, row
    assert row["allreduce_calls_per_step"] == N_PARAMS, row
    assert row["overlap_pct"] > 0, row
    # A COMM span starts when its AllReduce runs: after the one before it on the backend's
    # queue, and not before the peer has issued it too. A rank ahead of its peer (two CPU
    # ranks on two cores take turns being late by 10-90 ms, longer than this backward) sees
    # its reductions start once the peer's arrive, after its own backward; the later rank of
    # each step sees them start during its backward. So: in every step, some rank's first
    # AllReduces ran while its backward went on; over the run, a quarter of them at least
    # (measured: 148 and 238 of 308 on a slow and a quick day; the loop form: none)
    early = 0
    for k, ranks in step_batches(got, "interleaved").items():
        most = 0
        for r, b in ranks.items():
            comm = spans_of(b, SPAN_COMM)
            assert sorted(i for i, _, _ in comm) == list(range(N_PARAMS)), (k, r, comm)
            last_bwd = max(t1 for _, _, t1 in spans_of(b, SPAN_BWD))
            n = sum(t0 < last_bwd for _, t0, _ in comm)
            early += n
            most = max(most, n)
        assert most >= 1, (k, "no rank's AllReduce ran during its backward")
    assert early >= (ITERS - 1) * 2 * N_PARAMS // 4, early


def test_a_gradient_all_reduce_belongs_to_its_parameters_layer(hook_run):
    """Each COMM span's index is a parameter of the hello's table, whose layer is a Linear's;
    in the interleaved form a parameter's all_reduce is issued after its layer's backward
    began (the layer that made the gradient)."""
    doc, got, _ = hook_run
    params = got.store.meta.params
    assert len(params) == N_PARAMS
    layer_of = [p[2] for p in params]
    for k, ranks in step_batches(got, "interleaved").items():
        for r, b in ranks.items():
            bwd_start = {i: t0 for i, t0, _ in spans_of(b, SPAN_BWD)}
            for i, t0, _ in spans_of(b, SPAN_COMM):
                assert t0 >= bwd_start[layer_of[i]], (k, r, i, layer_of[i])


def test_whatif_predicts_other_world_sizes_of_a_hand_written_run(loop_run):
    """No DDP, no bucket cap to move: `ddptui whatif` predicts world sizes by default, from the
    naive steps, and says why."""
    from tests.helpers import run_main
    rec = loop_run[3]
    r = run_main("whatif", str(rec), "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    doc = json.loads(r.stdout)
    assert [(p["strategy"], p["world"]) for p in doc["world_sizes"]] == [("naive", 2), ("naive", 4), ("naive", 8)], doc
    r = run_main("whatif", str(rec))
    assert r.returncode == 0 and "no ddp steps in the recording" in r.stdout, r.stdout[-2000:]


def test_a_run_with_no_collective_says_so_in_one_line(tmp_path):
    """One rank, no process group, no all_reduce: drawn as single, said once; never an empty
    result."""
    import json
    import os
    rec, js = tmp_path / "run.ddptui", tmp_path / "run.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "1", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "handwritten.py"), "--how", "none", "--iters", "4",
                timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [ln for ln in r.stderr.splitlines() if "no collective" in ln]
    assert len(said) == 1 and "single" in said[0], r.stderr[-3000:]
    doc = json.loads(js.read_text())
    (row,) = doc["strategies"]
    assert row["strategy"] == "single" and row["steps"] == 3 and doc["world_size"] == 1, row
    assert doc["layers"] and row["compute_ms"] > 0, doc
