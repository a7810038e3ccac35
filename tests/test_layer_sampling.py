"""Layer marks on a sample of steps (ranks.core.instrument.LAYER_SHARE): a step too short for a mark
per layer has its layers marked one step in `every`, the forward and backward as a whole
(PASS spans) on the others, every collective on every step; and what the app makes of it."""
from __future__ import annotations

from array import array

import pytest
import torch
from torch import nn

from ranks import frames as fr
from ranks.core import instrument, recorder, sampling
from ranks import wire
from ranks.core.instrument import CpuClock, Recorder, every_for
from ranks.builtin.strategies import attach_layer_hooks
from ranks.wire import BWD, COMM, FWD, PASS

from .helpers import store_of, synthetic_frames


class CountingClock(CpuClock):
    """A CPU clock that counts its marks (each one a hook's or the step's)."""

    def __init__(self):
        super().__init__()
        self.marks = 0

    def mark(self):
        self.marks += 1
        return super().mark()


def tiny(blocks: int = 40) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(blocks)])


def kinds_of(step) -> dict[int, list[int]]:
    _, _, _, kinds, idxs, _, _, _ = step
    out: dict[int, list[int]] = {}
    for k, i in zip(kinds, idxs):
        out.setdefault(k, []).append(i)
    return out


def test_the_period_keeps_the_marks_within_their_share():
    # (their share: 1 % of the step, ddptui's whole host time: sampling.MARKS_SHARE)
    assert instrument.MARKS_SHARE == instrument.LAYER_SHARE == 0.01
    assert every_for(1_000, 10_000_000) == 1  # 1 µs of marks on a 10 ms step: 0.01 %
    assert every_for(68_000, 1_500_000) == 8  # 40 layers (~1.7 µs each) on a 1.5 ms step: 4.5
    assert every_for(180_000, 1_400_000) == 16  # 40 sampled layers (~4.5 µs each), 1.4 ms: 12.9
    assert every_for(68_000, 1_000) == instrument.MAX_EVERY == 128
    assert every_for(350_000, 1_400_000) == 32  # a marked step seen to take 350 µs more: 25
    assert every_for(68_000, 1_500_000, cur=8) == 8
    assert every_for(30_000, 1_500_000) == 2  # wants 2
    assert every_for(30_000, 1_500_000, cur=4) == 4  # wants 2: not down to a third of 4 yet
    assert every_for(10_000, 1_500_000, cur=16) == 1  # clearly less: down
    # the first H100 (xlarge, a 7.7 ms step; one mark 2.39 µs, a hook's dispatch 3.21 µs): every
    # layer of every step; deep40 (~86 ms a step, 40 layers) too
    assert every_for(8 * (2 * 2_390 + 3_210), 7_700_000) == 1
    assert every_for(40 * (2 * 2_390 + 3_210), 86_000_000) == 1


@pytest.mark.parametrize("extra_us, every, preempted", [(100, 16, False), (350, 32, False), (100, 16, True)])
def test_the_period_follows_what_a_marked_step_is_seen_to_cost(monkeypatch, extra_us, every, preempted):
    """40 layers on 1.4 ms steps: the first guess (LAYER_HOOK_NS a layer) says 1 step in 16;
    once layers are sampled, a marked step seen to take 350 µs more than the others (P7's
    marked steps here, by the minute) makes it 1 in 32, the marks' share back within 1 %;
    100 µs more keeps the guess, even with the first marked step preempted for 5 ms (the median
    of the last marked steps, not the first one seen)."""
    t = [0]
    monkeypatch.setattr(recorder, "now_ns", lambda: t[0])  # (the Recorder reads the clock there)
    rec = Recorder(CpuClock(), 40)
    rec.switches["ddp"] = lambda on: None
    rec._mark_ns = 300.0  # (one mark, as timed once)
    seen = []
    for k in range(1024):
        rec.begin("ddp", k)
        t[0] += 1_400_000 + (extra_us * 1000 if rec.cur.layers else 0)
        if preempted and k == 64:
            t[0] += 5_000_000
        rec.end()
        seen.append(rec.layer_every("ddp"))
    assert rec.layer_every("ddp") == every and max(seen[65:]) == every, sorted(set(seen))


def test_a_slow_first_step_registers_no_hook_for_every_step(monkeypatch):
    """The first step (PyTorch's first autograd call: 26 ms against ~3 for 40 tiny layers here)
    is a warm-up: not in the steps' time, and the hooks registered once (called by PyTorch on
    every step after, even removed) wait for a few timed steps. A slow start then short steps:
    never switched on; long steps throughout: switched on after SETTLE of them."""
    for first_ms, rest_ms, on in ((30, 1.4, False), (30, 30, True)):
        t = [0]
        monkeypatch.setattr(recorder, "now_ns", lambda: t[0])
        rec = Recorder(CpuClock(), 40)
        seen: list[bool] = []
        rec.switches["ddp"] = seen.append
        rec._mark_ns = 300.0
        for k in range(12):
            rec.begin("ddp", k)
            t[0] += int((first_ms if k == 0 else rest_ms) * 1e6)
            rec.end()
        assert (True in seen) == on, (first_ms, rest_ms, seen)
        if on:  # (at the step after the warm-up and SETTLE timed ones)
            assert seen.index(True) == sampling.SETTLE + 1 and all(seen[sampling.SETTLE + 1:]), seen


@pytest.mark.serial  # the period follows a ~1 ms step's time: neighbours' ranks stretch it
def test_short_steps_mark_their_layers_on_a_sample_of_steps():
    """40 tiny blocks at batch 1 (a step of ~1 ms here, as a host-bound GPU step): after the
    first step the period grows to keep the marks within 0.5 % of the step; a marked step
    has every layer's forward and backward, the others the forward and backward as one span
    each, marked with a handful of marks (the layer hooks off), spanning what a marked step's
    layers span."""
    model = tiny()
    clock = CountingClock()
    rec = Recorder(clock, 40)
    attach_layer_hooks(model, rec, "single")
    x, y = torch.randn(1, 16), torch.zeros(1, dtype=torch.long)
    marks_per_step, periods = [], []
    for k in range(300):
        before = clock.marks
        rec.begin("single", k)
        periods.append(rec.layer_every("single"))  # (the period of this step)
        loss = nn.functional.cross_entropy(model(x), y)
        rec.backward_starts()  # (as the strategies' step does)
        loss.backward()
        rec.end()
        marks_per_step.append(clock.marks - before)
    pending = rec.poll(lazy=True)
    steps = [p() for p in pending]
    # what a dropped step counts as lost: its spans, marked or not
    assert [p.n_spans for p in pending] == [len(s[3]) for s in steps]
    assert periods[0] == 1  # nothing timed yet: every layer
    every = min(periods[48:])
    assert every >= 4, f"a ~1 ms step of 40 layers marked its layers every {every} steps"
    assert all(e & (e - 1) == 0 for e in periods)  # powers of two: every rank marks the same steps
    late = [k for k in range(48, 300)]  # (up to 1 step in 128: two of them marked at least)
    marked = [steps[k] for k in late if k % periods[k] == 0]
    unmarked = [steps[k] for k in late if k % periods[k]]
    assert marked and unmarked
    for s in marked:
        got = kinds_of(s)
        assert sorted(got[FWD]) == sorted(got[BWD]) == list(range(40)) and PASS not in got
    for s in unmarked:
        got = kinds_of(s)
        assert FWD not in got and BWD not in got and sorted(got[PASS]) == [0, 1]
    # an unmarked step: the step's start and end, the forward's, the backward's (before the
    # step calls backward(), and the first block's weight's hook): 6 marks, where a marked one makes 80+
    assert max(marks_per_step[k] for k in late if k % periods[k]) <= 6
    assert min(marks_per_step[k] for k in late if k % periods[k] == 0) >= 80, \
        [(k, periods[k], marks_per_step[k]) for k in late if k % periods[k] == 0 and marks_per_step[k] < 80]
    # sampled, the blocks' backward marks are never registered on their weights (a hook once
    # registered is called by PyTorch on every step after, even removed): the first block's only
    weights = [next(b.parameters()) for b in model.children()]
    assert weights[0]._post_accumulate_grad_hooks and all(w._post_accumulate_grad_hooks is None for w in weights[1:])
    # a marked step's backward: one mark between two blocks, in order
    _, _, _, kinds, idxs, t0s, t1s, _ = marked[0]
    bwd = {i: (a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == BWD}
    assert all(bwd[i][0] == bwd[i + 1][1] and bwd[i][0] <= bwd[i][1] for i in range(39))
    # the whole passes span what the layers do: forward from the first layer's start to the
    # last one's end, backward from the last layer's start to the first one's end
    _, _, _, kinds, idxs, t0s, t1s, _ = unmarked[0]
    fwd = next((a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == PASS and i == 0)
    bwd = next((a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == PASS and i == 1)
    assert fwd[0] < fwd[1] < bwd[0] < bwd[1]  # (the loss between them, as on a marked step)


def test_steps_whose_layers_are_not_marked_are_handed_over_in_runs():
    """A poll per short step was a tenth of its cost to the training thread: steps whose layers
    are not marked come out of poll() POLL_BATCH at a time; a marked step, and the end
    (wait), hand over whatever is pending; every step once, in order."""
    model = tiny(4)
    rec = Recorder(CpuClock(), 4, every=8)
    attach_layer_hooks(model, rec, "ddp")
    x, y = torch.randn(1, 16), torch.zeros(1, dtype=torch.long)
    handed: list[list[int]] = []
    for k in range(22):
        rec.begin("ddp", k)
        loss = nn.functional.cross_entropy(model(x), y)
        rec.backward_starts()
        loss.backward()
        rec.end()
        handed.append([p()[1] for p in rec.poll(lazy=True)])
    handed.append([p()[1] for p in rec.poll(wait=True, lazy=True)])
    batch = instrument.POLL_BATCH
    assert batch > 1
    flat = [k for got in handed for k in got]
    assert flat == list(range(22))  # each step once, in order
    for k, got in enumerate(handed[:22]):
        if k % 8 == 0:  # a marked step: itself and what was pending
            assert got and got[-1] == k
        else:  # a step whose layers are not marked: nothing, or a run of POLL_BATCH
            assert len(got) in (0, batch) and (not got or got[-1] == k)
    assert handed[-1] == [21]  # the end: the rest (17-20 were a run, 21 alone is pending)


def test_a_reused_record_carries_nothing_of_its_last_step():
    """Once resolved, a step whose layers were not marked is given back and made blank for a
    later one (Recorder._spare: no object made per short step); a step with a collective, then
    one without, then one whose collective is still running when it is resolved (never reused:
    its callback is still to write): each resolves to its own spans."""
    model = tiny(4)
    rec = Recorder(CpuClock(), 4, every=64)
    attach_layer_hooks(model, rec, "ddp")
    x, y = torch.randn(1, 16), torch.zeros(1, dtype=torch.long)
    got, ids, late = {}, {}, None
    for k in range(1, 40):
        rec.begin("ddp", k)
        ids.setdefault(id(rec.cur), []).append(k)
        loss = nn.functional.cross_entropy(model(x), y)
        rec.backward_starts()
        loss.backward()
        if k % 3 == 0:  # a collective, done within the step
            slot = rec.comm_issue(k)
            rec.comm_done(rec.cur, slot)
        if k == 20:  # one still running when the step is resolved
            late = (rec.cur, rec.comm_issue(99))
        rec.end()
        for item in rec.poll(lazy=True):
            s = item()
            got[s[1]] = kinds_of(s)
    for item in rec.poll(wait=True, lazy=True):
        s = item()
        got[s[1]] = kinds_of(s)
    assert sorted(got) == list(range(1, 40))
    for k, kinds in got.items():
        assert sorted(kinds[PASS]) == [0, 1], (k, kinds)
        want = [k] if k % 3 == 0 else []
        if k == 20:
            want = [99]
        assert kinds.get(COMM, []) == want, (k, kinds)
    assert any(len(ks) > 1 for ks in ids.values()), "no record was reused"
    assert all(20 not in ks or ks[-1] == 20 for ks in ids.values()), "a record with a collective still running was reused"
    rec.comm_done(*late)  # (its callback, late: into its own record)


@pytest.mark.parametrize("every", [1, 2])
def test_ddps_work_on_a_gradient_stays_in_its_block_across_a_rewrap(tmp_path, every):
    """DDP's reducer copies a gradient into its bucket, and issues the bucket's AllReduce, in
    its hooks on the gradient's AccumulateGrad node: that work is the block's, so each block's
    backward ends after it — with the marks registered once (every 1: after the reducer's,
    again after a re-wrap, whose new reducer comes after them on the old nodes) and with
    those a marked step registers (every 2). Every step has every bucket's AllReduce; the
    marked ones every layer, the others the whole passes."""
    import torch.distributed as dist

    from ranks.builtin.models import build_model
    from ranks.builtin.strategies import DDPStrategy

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        rec = Recorder(CpuClock(), 4, every=every)
        s = DDPStrategy(build_model("small"), rec, torch.device("cpu"), 0.01, 1, bucket_cap_mb=0.05)
        x, y = torch.randn(16, 784), torch.randint(0, 10, (16,))
        for k in range(8):
            s.prepare(); rec.begin("ddp", k); s.step(x, y); rec.end()
            if k == 3:
                s.wrap(0.1)  # a re-wrap: a new reducer
        steps = rec.poll()
    finally:
        dist.destroy_process_group()
    carries = {b: set(ps) for b, ps, _ in s.seen}  # bucket -> its parameters (the last step's)
    pidx = {id(p): i for i, p in enumerate(s.params)}
    block_of = {pidx[id(p)]: j for j, b in enumerate(s.module.children()) for p in b.parameters()}
    for k, st in enumerate(steps):
        got = kinds_of(st)
        # (DDP's first step after a wrap has one bucket, then its rebuilt ones)
        assert len(got[COMM]) >= (1 if k in (0, 4) else 2), f"step {k}: every bucket's AllReduce, every step"
        if k % every == 0:
            assert sorted(got[BWD]) == [0, 1, 2, 3] and PASS not in got, k
        else:
            assert sorted(got[PASS]) == [0, 1] and BWD not in got, k
        if k in (2, 6) or (every == 1 and k in (3, 7)):  # marked, buckets rebuilt (the second after the re-wrap)
            _, _, _, kinds, idxs, t0s, t1s, iss = st
            ends = {i: t1 for kk, i, t1 in zip(kinds, idxs, t1s) if kk == BWD}
            comm = [i for kk, i in zip(kinds, idxs) if kk == COMM]
            for b, ready in zip(comm, iss):
                block = min(block_of[p] for p in carries[b])
                assert ready <= ends[block], f"step {k}: bucket {b} issued after block {block} ended"


# -- what the app makes of it ------------------------------------------------------------------
def as_unmarked(f: fr.Spans) -> fr.Spans:
    """The same step as a rank marks it when its layers are not marked: forward and backward
    as one PASS span each."""
    kind = list(f.kind)
    idx = array("H", f.idx).tolist()
    t0, t1 = array("I", f.t0).tolist(), array("I", f.t1).tolist()
    iss = array("I", f.iss).tolist()
    keep = [i for i, k in enumerate(kind) if k not in (FWD, BWD)]
    kinds, idxs = [kind[i] for i in keep], [idx[i] for i in keep]
    a0, a1 = [t0[i] for i in keep], [t1[i] for i in keep]
    for k, n in ((FWD, 0), (BWD, 1)):
        pos = [i for i, kk in enumerate(kind) if kk == k]
        kinds.append(PASS); idxs.append(n)
        a0.append(min(t0[i] for i in pos)); a1.append(max(t1[i] for i in pos))
    base = f.base_ns
    us = lambda v: [base + x * 1000 for x in v]  # noqa: E731
    return fr.spans_frame(f.rank, f.strategy, f.step, base, kinds, idxs, us(a0), us(a1), us(iss))


def sampled_frames(steps: int = 12, every: int = 4) -> list:
    out = []
    for f in synthetic_frames(steps=steps):
        if isinstance(f, fr.Spans) and f.step % every:
            f = as_unmarked(f)
        out.append(f)
    return out


def test_the_store_counts_figures_and_says_how_layers_were_sampled():
    full = store_of(synthetic_frames(steps=12))
    st = store_of(sampled_frames(12, 4))
    assert full.layer_sampling("ddp") is None
    assert st.layer_sampling("ddp") == (3, 12) and st.layer_sampling("naive") == (3, 12)
    # the figures of an unmarked step: compute and exposed communication as the marked one's
    # (a rank's layers are end to end: their union is about the whole pass; the synthetic
    # run leaves a few µs between them)
    for k in (5, 6, 7):
        for r in (0, 1):
            a, b = full.rank_figures("ddp", k, r), st.rank_figures("ddp", k, r)
            assert b.compute_ms == pytest.approx(a.compute_ms, rel=0.02)
            assert b.exposed_ms == pytest.approx(a.exposed_ms, rel=0.02, abs=0.05)
    # per-layer evidence from the marked steps only; who-waits from every step
    assert st.step_waits("ddp", 8).ref and not st.step_waits("ddp", 9).ref
    summ = st.summary("ddp")
    assert summ["layer_marks"]["steps_marked"] == 3 and summ["layer_marks"]["steps"] == 12
    assert "layer_marks" not in full.summary("ddp")
    view = st.view("ddp", 9)
    assert view.sampling == (3, 12)
    from ddptui.model.views import sampling_text
    assert sampling_text(view.sampling) == "layers marked 1 step in 4 (3 of 12)"


def test_a_sampled_step_is_drawn_and_exported_as_whole_passes(tmp_path):
    from ddptui.ui.widgets.lanes import compute_bars
    st = store_of(sampled_frames(8, 4))
    view = st.view("ddp", 5)
    bars = compute_bars(view.spans[0], list(st.meta.layers))
    labels = [b[3] for b in bars]
    assert "fwd: all layers" in labels and "bwd: all layers" in labels
    marked = compute_bars(st.view("ddp", 4).spans[0], list(st.meta.layers))
    assert "fc1" in [b[3] for b in marked]


def test_whatif_replays_the_marked_steps():
    from ddptui.model import whatif as W
    st = store_of(sampled_frames(16, 2))
    basis = W.collect(st, "ddp")
    assert basis.steps and all(k % 2 == 0 for k in basis.steps)


def test_a_recording_with_whole_passes_reads_back(tmp_path):
    from ddptui.recording.loader import load
    from .helpers import run_cli, write_recording
    path = tmp_path / "sampled.ddptui"
    write_recording(path, sampled_frames(8, 4))
    got = load(str(path))
    assert got.damage is None and not got.rejected
    assert got.store.layer_sampling("ddp") == (2, 8)
    out = run_cli("summary", str(path))
    assert out.returncode == 0, out.stderr
    assert "ddp: layers marked 1 step in 4 (2 of 8)" in out.stdout
    assert wire.KIND_NAMES[PASS] == "pass"


@pytest.mark.slow  # (real torchrun)
@pytest.mark.serial  # the periods follow the steps' times: neighbours' ranks stretch them
def test_ranks_agree_on_the_steps_whose_layers_they_mark(tmp_path):
    """`--layer-every 2` on a real 2-rank run: both ranks mark the layers of the same steps
    (the even ones) and the whole passes of the others, every collective on every step; the
    report says so with the rate; a bad value is one line and exit 2."""
    import json

    from ddptui.recording.loader import load
    from .helpers import run_main
    rec, out = tmp_path / "run.ddptui", tmp_path / "run.json"
    res = run_main("--headless", "--gpus", "2", "--model", "small", "--batch-size", "64", "--steps", "6",
                   "--strategies", "naive,ddp", "--layer-every", "2", "--record", str(rec), "--json", str(out),
                   # (the control collective spread to 1 s: after the first iterations, timed, it
                   # skips the rest, as it does for short GPU steps)
                   env={"CUDA_VISIBLE_DEVICES": "", "DDPTUI_CONTROL_GAP_S": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "naive: layers marked 1 step in 2 (3 of 6)" in res.stdout
    doc = json.loads(out.read_text())
    rows = {r["strategy"]: r for r in doc["strategies"]}
    assert rows["ddp"]["layer_marks"]["steps_marked"] == 3 and rows["ddp"]["layer_marks"]["steps"] == 6
    st = load(str(rec)).store
    for s in ("naive", "ddp"):
        for k in range(6):
            got = {r: b.kind for r, b in st.raw[s][k].items()}
            assert set(got) == {0, 1}
            for r, kind in got.items():
                assert (PASS in kind) == (k % 2 == 1), (s, k, r)
                assert (FWD in kind) == (k % 2 == 0), (s, k, r)
                assert kind.count(COMM) >= 1, (s, k, r)
    # the control collective ran less often than every iteration once iterations were timed,
    # and the ranks still marked the same steps above
    from ddptui.recording import rankset
    from ranks import frames as fr_
    intervals = [f.value for _, f in rankset.open_reader(str(rec))
                 if isinstance(f, fr_.Event) and f.what == "control_interval"]
    assert intervals == [16], intervals
    bad = run_main("--headless", "--layer-every", "3")
    assert bad.returncode == 2 and "argument --layer-every: invalid choice: '3'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_ranks_say_in_the_period():
    """The worker's control collective keeps the largest say: a rank where the strategy does
    not run (single, on the other ranks) has no say; an injected delay or verify wants every
    step; a delay switched on by the straggler word marks that very step on every rank."""
    from ranks.builtin.worker import agreed_every, every_vote

    class Rec:
        in_force = 1

        def wanted_every(self, strategy):
            return 8

        def layer_every(self, strategy):
            return self.in_force
    assert every_vote(Rec(), "single", False, False) == -instrument.MAX_EVERY
    assert every_vote(Rec(), "single", True, False) == -8
    assert every_vote(Rec(), "ddp", True, True) == -1
    # the period in force is asked again where it ends only (every rank at the same steps)
    r = Rec()
    r.in_force = 4
    assert [every_vote(r, "ddp", True, False, k) for k in (4, 5, 6, 7, 8)] == [-8, -4, -4, -4, -8]
    votes = [every_vote(Rec(), "single", True, False), every_vote(Rec(), "single", False, False)]
    assert agreed_every(max(votes), 0) == 8  # rank 0's, not rank 1's (which never times single)
    from ranks.builtin.worker import SEQ_SHIFT, slow_from_word
    on = (1 * 256 + 2) * SEQ_SHIFT + 40
    assert slow_from_word(on) == (1, 2, 40)
    assert agreed_every(-8, on) == 1 and agreed_every(-8, (1 * 256 + 2) * SEQ_SHIFT) == 8


def test_the_culprit_is_named_from_the_marked_steps():
    """A slow rank's layer named live where layers are marked one step in 4: the panel's
    evidence takes as many steps as hold a window of marked ones."""
    from ddptui.model.store import Store
    from ddptui.recording.synthetic import SyntheticRun
    from ddptui.ui.widgets import waits
    from .helpers import synthetic_meta
    run = SyntheticRun(model="medium", world=4, strategies=("ddp",), seed=1, slow=(2, 1, 40.0))
    st = Store()
    st.set_meta(synthetic_meta(model="medium", world=4, strategies=("ddp",)))
    for f in run.header_frames():
        st.ingest(f)
    for k in range(100):
        for f in run.step_frames(k):
            st.ingest(as_unmarked(f) if isinstance(f, fr.Spans) and k % 4 else f)
        st.update()
    assert st.layer_sampling("ddp") == (25, 100)
    shown = {"ddp": st.latest_complete("ddp")}
    gist = waits.culprit_gist(st, shown)
    assert gist.startswith("rank 2 · fc2 backward"), gist
    got = waits._summary(st, "ddp", shown["ddp"])
    assert got["steps"] == waits.RECENT  # (the medians the panel says are of the last 20 steps)
    assert got["evidence"]["steps"] == 20 and got["evidence"]["first_step"] % 4 == 0


@pytest.mark.asyncio
async def test_the_pane_says_the_rate_and_draws_whole_passes(tmp_path):
    """A recording whose layers were marked one step in 4, replayed in the app: the pane's
    header says so, and an unmarked step's lane draws its forward and backward as a whole."""
    import itertools

    from textual.geometry import Region

    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets.timeline import TimelinePane
    from .helpers import write_recording
    path = tmp_path / "sampled.ddptui"
    write_recording(path, sampled_frames(8, 4))
    src = ReplaySource(str(path), clock=itertools.count(0, 10**12).__next__)  # (the whole file at once)
    app = DdpApp(src)
    async with app.run_test(size=(200, 45)) as pilot:
        for _ in range(50):
            await pilot.pause(0.05)
            pane = app.query_one("#pane-ddp", TimelinePane)
            if pane.state.view is not None and pane.state.view.step == 7:
                break
        app.redraw()
        await pilot.pause()
        lines = [s.text for s in pane.render_lines(Region(0, 0, *pane.size))]
        assert pane.state.view.step == 7  # (7: not a multiple of 4, unmarked)
        assert "step 7 · 8.0 ms" in lines[0] and "· layers 1 step in 4 ·" in lines[0], lines[0]
        assert any("bwd: all layers" in ln for ln in lines), lines


def test_the_marked_steps_the_evidence_needs_stay_past_the_kept_steps():
    """Layers marked 1 step in 16 and a store keeping 40 steps (the app's 400, scaled): the
    last 20 complete marked steps stay, so the per-layer evidence has its window (before, the
    40 kept steps held 2 or 3 marked ones: "gathering evidence" for as long as the run went
    on), one whose frame never came from a rank not counted among them; the others are
    evicted oldest first. The who-waits figures, the report's and the view's window are over
    the window of kept steps, not the marked ones kept past it."""
    from ddptui.model.store import Store
    from ddptui.ui.widgets.waits import _summary
    from .helpers import synthetic_meta
    st = Store(keep_steps=60)
    st.set_meta(synthetic_meta())
    for f in sampled_frames(400, 16):
        if isinstance(f, fr.Spans) and f.rank == 1 and f.step == 240:
            continue  # lost: step 240 never completes
        st.ingest(f)
        if isinstance(f, fr.Spans) and f.rank == 1:
            st.update()
    st.update()
    kept = list(st.raw["ddp"])
    marked = [k for k in kept if k % 16 == 0]
    window = [k for k in kept if k not in st.stays["ddp"]]
    assert len(kept) == 60 and 240 not in kept  # (complete marked ones: 16..384 but 240)
    assert marked == [k for k in range(16, 385, 16) if k != 240]
    assert sorted(st.stays["ddp"]) == [k for k in marked if k < window[0]]
    assert window == list(range(window[0], 400)) and st.oldest_step() == window[0] > 360
    for shown in (None, 399, window[0] + 1):  # (the step on screen may be behind the newest marked)
        got = _summary(st, "ddp", shown)
        assert got["evidence_steps"] == 20 and not got["gathering"], shown
    summ = st.summary("ddp")["stragglers"]
    assert summ["steps"] == len(window) and summ["evidence"]["steps"] >= 20
    full = Store(keep_steps=40)  # every step marked: evicted oldest first, as ever
    full.set_meta(synthetic_meta())
    for f in synthetic_frames(steps=100):
        full.ingest(f)
        full.update()
    assert list(full.raw["ddp"]) == list(range(60, 100)) and full.oldest_step() == 60


def test_the_control_collective_runs_about_every_20_ms_of_iterations():
    """The workers' control collective (stop, bucket cap, straggler, periods of layer marks) runs
    before an iteration's first step every `control_interval` iterations, about CONTROL_GAP_S
    apart: every iteration while an iteration takes 20 ms or more (or is not timed yet), every
    8 for xlarge's four ~1 ms steps on 8 GPUs (it was before every step: a gloo all_reduce of 8
    ranks, ~15 % of such a run), 16 at the most."""
    from ranks.builtin.worker import CONTROL_GAP_S, MAX_CONTROL_INTERVAL, control_interval
    assert CONTROL_GAP_S == 0.02 and MAX_CONTROL_INTERVAL == 16
    assert control_interval(None) == 1 and control_interval(0.0) == 1
    assert control_interval(0.3) == 1 and control_interval(0.02) == 1
    assert control_interval(0.004) == 8
    assert control_interval(0.0001) == 16 and control_interval(0.0001, cur=16) == 16
    # no flapping at a boundary: the interval in force stays while it spaces the collectives
    # between 10 and 40 ms (iterations whose shortest of 8 wanders around 10 or 20 ms)
    assert control_interval(0.011) == 1 and control_interval(0.0095, cur=2) == 2
    assert control_interval(0.012, cur=2) == 2 and control_interval(0.05, cur=2) == 1
    assert control_interval(0.004, cur=16) == 8 and control_interval(0.0055, cur=4) == 4
