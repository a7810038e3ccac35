"""Real training scripts under `ddptui run --auto` (2 CPU ranks on gloo): what a step is.

Each script in tests/scripts/ is plain DDP that knows nothing of ddptui and does what real
training scripts do: a tied embedding/output weight, with rank 0 alone evaluating through the
DDP module (tied.py); gradient accumulation by `require_backward_grad_sync` and by
`no_sync()`, with a layer used every other step (accumulate.py); two DDP modules in one model
(DLRM's bottom and top MLPs) with all_to_all between them (a2a_ddp.py: tests/test_collectives.py,
which shares its run with the collectives' tests). A step is
one gradient synchronisation, numbered the same on every rank (ranks.scripts.user.RankSession): the
step count is the optimizer iterations on every rank, no rank waits 3/4 of a step typically, no
culprit is named, every DDP module's buckets are drawn under its name, and every layer that
runs in a step has its backward span there. The tests of a script read one run of it (each
costs ~15 s, most of it starting torch): accumulate.py's a module fixture, tied.py's the
session's (conftest.user_lm_run: also the run of the tests of --auto and of the output).
"""
from __future__ import annotations

import pytest

from tests.helpers import (SCRIPT_ITERS, SPAN_BWD, SPAN_COMM, SPAN_FWD, SPAN_OTHER, SPAN_STEP,
                           sound_script_run, spans_of, step_batches)

pytestmark = pytest.mark.slow  # (real torchrun runs: ~15 s each, most of it starting torch)

ITERS = SCRIPT_ITERS
FWD, BWD, COMM, STEP, OTHER = SPAN_FWD, SPAN_BWD, SPAN_COMM, SPAN_STEP, SPAN_OTHER
_steps, _spans = step_batches, spans_of


def _sound(tmp_path, script: str, args: tuple):
    """(the JSON, the recording) of a sound run of the script (helpers.sound_script_run)."""
    return sound_script_run(tmp_path, script, args)[:2]


def _layer(doc, name: str) -> int:
    return doc["layers"].index(name)


@pytest.fixture(scope="module")
def lm_run(user_lm_run):
    """tied.py, rank 0 evaluating before every third iteration (conftest.user_lm_run, shared with
    the tests of --auto and of the output passed through): (the JSON, the recording)."""
    return tuple(user_lm_run[:2])


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """accumulate.py, 3 micro-steps per optimizer step, on the CPU's path (ddptui's comm hook;
    NCCL's own timing of the same accumulation: tests/test_flightrec.py): (the JSON, the
    recording)."""
    return _sound(tmp_path_factory.mktemp("mlp"), "accumulate.py", ("--micro", "3", "--how", "both"))


def test_rank0_only_evaluation_takes_no_step(lm_run):
    """Rank 0 alone evaluates (model.eval(), a forward through the DDP module) before every
    third iteration, in turn under no_grad and with autograd on and no backward. Those
    forwards synchronise nothing: no step of their own, none of their forwards in the steps;
    each is one OTHER span of rank 0 in the step it came before, ending by its start."""
    doc, got = lm_run
    with_other = {0: [], 1: []}
    for k, ranks in sorted(_steps(got).items()):
        for r, b in ranks.items():  # one forward of each layer a step: the training one
            fwd = [i for i, _, _ in _spans(b, FWD)]
            assert len(fwd) == len(set(fwd)) == len(doc["layers"]), (k, r, fwd)
            other = _spans(b, OTHER)
            if other:
                with_other[r].append(k)
                (_, s0, _), = _spans(b, STEP)
                assert len(other) == 1 and other[0][0] == 0, (k, r, other)
                assert other[0][1] < other[0][2] <= s0, (k, r, other, s0)
    assert with_other == {0: list(range(0, ITERS, 3)), 1: []}, with_other


def test_accumulation_is_one_step_per_optimizer_step(mlp_run):
    """3 micro-steps per optimizer step, the gradient synchronised on the last, in turn by
    require_backward_grad_sync and by no_sync(): a step is the optimizer step, its
    micro-steps' forwards and backwards drawn inside it; AllReduce/step is the buckets."""
    doc, got = mlp_run
    row = doc["strategies"][0]
    assert row["allreduce_calls_per_step"] == len(row["buckets"]) >= 1
    first = _layer(doc, "l1")  # (the first layer every micro-step runs)
    for k, ranks in _steps(got).items():
        for r, b in ranks.items():
            fwd0 = [(t0, t1) for i, t0, t1 in _spans(b, FWD) if i == first]
            bwd0 = [(t0, t1) for i, t0, t1 in _spans(b, BWD) if i == first]
            assert len(fwd0) == len(bwd0) == 3, (k, r, fwd0, bwd0)
            assert fwd0[0][1] <= bwd0[0][0] <= bwd0[0][1] <= fwd0[1][0]  # micro-step 1, then 2
            comm = _spans(b, COMM)
            assert comm and min(t0 for _, t0, _ in comm) >= fwd0[2][0]  # synchronised by the last


def test_tied_embedding_backward_goes_to_the_embedding(lm_run):
    """lm_head.weight is wte.weight: its gradient is complete when the embedding's backward
    (the last to run) is, not lm_head's (the first): wte has its backward span in every step,
    lm_head's ends before the blocks' backward."""
    doc, got = lm_run
    wte, head, h0 = _layer(doc, "wte"), _layer(doc, "lm_head"), _layer(doc, "h.0")
    params = {p[0]: p[2] for p in got.store.meta.params}
    assert params["wte.weight"] == wte and "lm_head.weight" not in params
    early = []
    for k, ranks in _steps(got).items():
        for r, b in ranks.items():
            bwd = {i: (t0, t1) for i, t0, t1 in _spans(b, BWD)}
            assert wte in bwd and head in bwd and h0 in bwd, (k, r, bwd)
            assert bwd[head][1] <= bwd[h0][0], (k, r, bwd)  # the head's backward ran first
            # the embedding's last (its output is h.0's input: one gradient, two hooks)
            if bwd[wte][0] < bwd[h0][1] - 200:
                early.append((k, r, bwd[wte], bwd[h0]))
    # (seen once in 48 step-ranks under a loaded suite: h.0's end 3 ms after the embedding's
    # start; the rule is the embedding's backward last, not a strict order in every step)
    assert len(early) <= 2, early


def test_layer_used_every_other_step_keeps_its_spans(mlp_run):
    """`extra` runs twice, once or not at all (and l1's input needs a gradient only when it
    ran): every layer that runs forward in a step has its backward span in that step."""
    doc, got = mlp_run
    extra = _layer(doc, "extra")
    for k, ranks in _steps(got).items():
        for r, b in ranks.items():
            fwd = {i for i, _, _ in _spans(b, FWD)}
            bwd = {i for i, _, _ in _spans(b, BWD)}
            assert fwd == bwd, (k, r, sorted(fwd), sorted(bwd))
            assert (extra in fwd) == (k % 2 == 0), (k, r, fwd)


def test_a_compiled_models_layers_are_named_as_the_user_named_them():
    """torch.compile keeps the user's module under `_orig_mod`: ddptui's names leave it out, and
    a layer given by the user's name is found in the compiled model."""
    import torch
    import torch.nn as nn
    from ranks.scripts.userlayers import choose_layers, shown_name
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    compiled = torch.compile(model)  # (not run: nothing compiles until it is called)
    assert shown_name("_orig_mod.2.0") == "2.0" and shown_name("module._orig_mod.2.weight") == "module.2.weight"
    assert shown_name("transformer.h.0") == "transformer.h.0" and shown_name("_orig_mod") == "_orig_mod"
    got = choose_layers(compiled, ["2.0", "0"])
    assert [m for _, m in got] == [model[2][0], model[0]]
    auto = [shown_name(n) for n, _ in choose_layers(compiled)]
    assert auto and not any("_orig_mod" in n for n in auto)


def test_a_users_layers_backward_spans_follow_one_another(lm_run, mlp_run):
    """Where one layer's input gradient is the next one's output gradient, both layers' hooks
    on that tensor mark the one moment a few µs apart (the lower's start first): the upper's end
    is taken back to it, so no backward span of a step overlaps the next (before: 2-21 µs in
    every step; the exports put the overlapping layer on a track of its own)."""
    for _doc, got in (lm_run, mlp_run):
        n = 0
        for k, ranks in got.store.span_batches()["ddp"].items():
            for r, b in ranks.items():
                bw = sorted((b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == 1)
                for (a0, a1), (b0, _) in zip(bw, bw[1:]):  # (µs; more than SAME_MOMENT_NS: as marked)
                    assert b0 >= a1 or a1 - b0 > 1000, (k, r, bw)
                    n += 1
        assert n > 50, n
