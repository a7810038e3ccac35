"""Real training scripts under `ddptui run --auto` (2 CPU ranks on gloo): what a step is.

Each script in tests/scripts/ is plain DDP that knows nothing of ddptui and does what real
training scripts do: a tied embedding/output weight, with rank 0 alone evaluating through the
DDP module (tied.py); gradient accumulation by `require_backward_grad_sync` and by
`no_sync()`, with a layer used every other step (accumulate.py); two DDP modules in one model
(DLRM's bottom and top MLPs) with a collective of its own between them (two_ddp.py). A step is
one gradient synchronisation, numbered the same on every rank (ranks.user.RankSession): the
step count is the optimizer iterations on every rank, nobody waits half a step for nobody, no
culprit is named, every DDP module's buckets are drawn under its name, and every layer that
runs in a step has its backward span there. The two tests of a script that does two things
read one run of it (a module fixture: each run costs ~15 s, most of it starting torch).
"""
from __future__ import annotations

from statistics import median

import pytest

from tests.helpers import run_script

pytestmark = pytest.mark.slow  # (real torchrun runs: ~15 s each, most of it starting torch)

ITERS = 24  # optimizer iterations of every script: more than the 20-step evidence window
FWD, BWD, COMM, STEP, OTHER = 0, 1, 2, 4, 5  # (ranks.wire's span kinds)


def _run(tmp_path, script: str, *args: str):
    """Run a script under `ddptui run --auto --headless`: (the JSON, the recording loaded)."""
    return run_script(tmp_path, script, *args)[:2]


def _steps(got) -> dict[int, dict[int, object]]:
    """step -> rank -> its span batch."""
    return got.store.span_batches()["ddp"]


def _spans(b, kind: int) -> list[tuple[int, int, int]]:
    """(idx, t0, t1) of a batch's spans of one kind, in order."""
    return [(b.idx[i], b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == kind]


def _sound(tmp_path, script: str, args: tuple, iters: int = ITERS, tries: int = 3):
    """Run the script; its steps are the optimizer iterations on every rank; the typical
    step has no wait over half the median step and no culprit is named. The timing is
    judged again on another run when a run fails it (other work on the two shared cores can
    make one rank late for a whole run: measured, with no evaluation at all, one rank last
    in 74 % of the steps; a step matched with the wrong step fails every run); the step
    counts are checked on every run."""
    doc, got = _run(tmp_path / "0", script, *args)
    _steps_are_iterations(doc, got, iters)
    why = [_timing_problem(doc, got, iters)]
    while why[-1] and len(why) < tries:
        again = _run(tmp_path / str(len(why)), script, *args)
        _steps_are_iterations(*again, iters)
        why.append(_timing_problem(*again, iters))
    assert not why[-1], "; ".join(f"run {i + 1}: {w}" for i, w in enumerate(why))
    return doc, got


def _steps_are_iterations(doc, got, iters: int) -> None:
    row = doc["strategies"][0]
    assert row["steps"] == iters, row["steps"]
    steps = _steps(got)
    for r in (0, 1):
        mine = sorted(k for k, ranks in steps.items() if r in ranks)
        assert mine == list(range(iters)), (r, mine)


def _timing_problem(doc, got, iters: int) -> str | None:
    from ddptui.model import stragglers
    row = doc["strategies"][0]
    steps = _steps(got)
    half = row["step_ms_median"] / 2
    waited = []
    for k in range(1, iters):  # (step 0: warm-up)
        b = steps[k]
        step_ms = max((s[2] - s[1]) / 1e3 for x in b.values() for s in _spans(x, STEP))
        sw = stragglers.step_waits(b, step_ms)
        waited.append(max(sw.wait_ms.values()) if sw else 0.0)
    # a step matched with another step of the other rank makes one rank wait in nearly every
    # step, longer and longer; two ranks on two cores shared with other work hold each other
    # up by 20-40 ms now and then (measured), so the waits are judged on the typical step
    if median(waited) > half:
        return f"median wait over half the median step ({half:.1f} ms): {[round(w, 1) for w in waited]}"
    med = row["stragglers"]["wait_ms_median"]
    if any(w > half for w in med.values()):
        return f"a rank's median wait over {half:.1f} ms: {med}"
    st = row["stragglers"]
    if st.get("culprit") or st.get("culprit_rank") is not None:
        return f"a culprit named: {st.get('culprit')} (last in {st.get('last_arriver_pct')} % of steps)"
    return None


def _layer(doc, name: str) -> int:
    return doc["layers"].index(name)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """tied.py, rank 0 evaluating before every third iteration: (the JSON, the recording)."""
    return _sound(tmp_path_factory.mktemp("lm"), "tied.py", ("--every", "3", "--how", "both"))


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """accumulate.py, 3 micro-steps per optimizer step: (the JSON, the recording)."""
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


def test_two_ddp_modules_in_one_picture(tmp_path):
    """net.bot_l and net.top_l, each a DDP, and an all_reduce of the script's own between
    them: both modules' layers and buckets, labelled by their attribute paths; one step
    spans both modules' AllReduces."""
    doc, got = _sound(tmp_path, "two_ddp.py", ())
    assert doc["layers"] == [f"bot_l.{i}" for i in range(4)] + [f"top_l.{i}" for i in range(5)]
    row = doc["strategies"][0]
    names = sorted(p for b in row["buckets"] for p in b["params"])
    assert names == sorted([f"bot_l.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")]
                           + [f"top_l.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")])
    by_module = {}
    for b in row["buckets"]:
        mods = {p.split(".")[0] for p in b["params"]}
        assert len(mods) == 1, b  # a bucket holds one module's parameters
        by_module.setdefault(mods.pop(), []).append(b["index"])
    assert set(by_module) == {"bot_l", "top_l"}
    assert row["allreduce_calls_per_step"] == len(row["buckets"])
    assert [b["bytes"] for b in row["buckets"]] == row["ddp_reported"]
    for k in range(1, ITERS):
        for r, b in _steps(got)[k].items():
            idx = {i for i, _, _ in _spans(b, COMM)}
            assert idx == {x["index"] for x in row["buckets"]}, (k, r, idx)


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
