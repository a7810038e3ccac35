"""What if (ddptui.model.whatif, `ddptui whatif`, the what-if panel): DDP's bucketing against a real
DDP's, the simulator on hand-checkable steps, the verb on a real run's recording."""
from __future__ import annotations

import json
import os
from array import array

import pytest
import torch

from ranks import spec
from ranks.wire import BWD, COMM, FWD, OPT, STEP, SpanBatch

from ddptui.model import whatif as W

from .helpers import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "demo", "cpu-medium-2ranks.ddptui")


# -- DDP's bucketing ------------------------------------------------------------------------
@pytest.mark.slow  # (a real DDP, re-wrapped at every cap)
# xlarge is heavy (twice medium's minute; the same bucketing code): medium covers it in CI
@pytest.mark.parametrize("model", ["medium", pytest.param("xlarge", marks=pytest.mark.heavy)])
def test_buckets_equal_a_real_ddps_at_every_cap(tmp_path, model):
    """The bucket assignment ddptui records from a real DDP (its comm hook's buckets, after DDP rebuilt
    them), at DDP's default cap and at each cap of the ladder, is what assign_buckets says."""
    import torch.distributed as dist

    from ranks.core.instrument import CpuClock, Recorder
    from ranks.builtin.models import build_model
    from ranks.builtin.strategies import DDPStrategy

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        rec = Recorder(CpuClock(), len(spec.layer_names(model)))
        base = build_model(model)
        x, y = torch.randn(8, 784), torch.randint(0, 10, (8,))
        nbytes = spec.grad_bytes(spec.param_table(model))
        order = list(reversed(range(len(nbytes))))
        s = DDPStrategy(base, rec, torch.device("cpu"), 0.01, 1)
        for cap in (None, *spec.BUCKET_LADDER_MB):
            if cap is not None:
                s.wrap(cap)  # (as the live ladder does: the same model re-wrapped)
            got = None
            for k in range(2):  # step 0: one bucket; DDP rebuilds after it, before step 1
                s.prepare(); rec.begin("ddp", k); s.step(x, y); rec.end(); rec.poll()
                change = s.take_layout_change()
                got = change[0] if change else got
            want = W.assign_buckets(order, nbytes, cap or spec.DEFAULT_BUCKET_CAP_MB, explicit=cap is not None)
            assert [(b, list(ps), nb) for b, ps, nb in got] == want, (model, cap)
            assert s.reported_sizes() == [nb for _, _, nb in want]
            # the order it reduces in is the recorded bucket assignment's
            assert W.ready_order([list(b) for b in got], len(nbytes)) == order
    finally:
        dist.destroy_process_group()


def test_first_bucket_rule_and_a_parameter_that_crosses_the_cap_stays_in():
    mib = W.MIB
    nb = [3 * mib, mib // 2, mib // 2, 2 * mib]  # in ready order 0, 1, 2, 3
    assert W.assign_buckets([0, 1, 2, 3], nb, 1.0) == [(0, [0], 3 * mib), (1, [1, 2], mib), (2, [3], 2 * mib)]
    # the default cap: first bucket 1 MiB, then 25 MiB
    assert W.assign_buckets([1, 2, 3, 0], nb, 25.0, explicit=False) == [(0, [1, 2], mib), (1, [3, 0], 5 * mib)]
    assert W.assign_buckets([1, 2, 3, 0], nb, 25.0) == [(0, [1, 2, 3, 0], 6 * mib)]


# -- the simulator on hand-made steps ---------------------------------------------------------
def batch(rank: int, spans: list[tuple[int, int, int, int]], iss: list[int], base: int = 0) -> SpanBatch:
    """spans: (kind, idx, t0 µs, t1 µs)."""
    return SpanBatch(rank, "ddp", 5, base, bytes(s[0] for s in spans), array("H", [s[1] for s in spans]),
                     array("I", [s[2] for s in spans]), array("I", [s[3] for s in spans]), array("I", iss))


def two_layer_step(rank: int, comm: list[tuple[int, int, int, int]]) -> SpanBatch:
    """fc1, fc2: forward 0-10 ms, backward fc2 10-20, fc1 20-40; then `comm` (idx, ready,
    start, end in µs), optimizer 2 ms after the last of backward and comm."""
    last = max([40_000] + [c[3] for c in comm])
    spans = [(STEP, 0, 0, last + 2_000), (FWD, 0, 0, 5_000), (FWD, 1, 5_000, 10_000),
             (BWD, 1, 10_000, 20_000), (BWD, 0, 20_000, 40_000)]
    spans += [(COMM, c[0], c[2], c[3]) for c in comm]
    spans += [(OPT, 0, last, last + 2_000)]
    return batch(rank, spans, [c[1] for c in comm])


def hand_basis(lanes: int = 2, world: int = 2) -> W.Basis:
    """Params fc1.w 4 MiB, fc1.b 1 KiB, fc2.w 2 MiB, fc2.b 1 KiB; recorded at cap 25 as one
    bucket [3, 2, 1, 0] ready at 40 ms, reduced 40-60 ms on both ranks."""
    kb = 1024
    pbytes = [4 * W.MIB, kb, 2 * W.MIB, kb]
    assignment = [[0, [3, 2, 1, 0], sum(pbytes)]]
    tr = W.trace_step({r: two_layer_step(r, [(0, 40_000, 40_000, 60_000)]) for r in range(world)})
    return W.Basis("ddp", world, lanes, "gloo", pbytes, [0, 0, 1, 1], 25.0, True, assignment, [5], [tr],
                   [{0: sum(pbytes)}])


def test_one_bucket_is_exposed_whole_and_smaller_buckets_hide_behind_the_backward():
    b = hand_basis()
    fit = W.CommFit(alpha_ms=0.0, beta_ms_per_mb=20.0 / (6 + 2 / 1024), n=1, err_pct=0.0, world=2)
    d = W.fit_delays(b)
    assert d.ready == {0: 0.0, 1: 0.0}
    one = W.predict(b, fit, cap_mb=25.0, delays=d)
    assert one.collectives == 1
    assert one.step_ms == pytest.approx(62.0) and one.exposed_ms == pytest.approx(20.0)
    assert one.overlap_pct == pytest.approx(0.0)
    # cap 1 MB: fc2 (2 MiB + 1 KiB) ready at 20 ms, reduced 20-26.7 ms under fc1's backward;
    # fc1 (4 MiB + 1 KiB) at 40 ms, 13.3 ms exposed
    two = W.predict(b, fit, cap_mb=1.0, delays=d)
    assert two.collectives == 2
    per_mb = fit.beta_ms_per_mb
    assert two.exposed_ms == pytest.approx(per_mb * (4 + 1 / 1024))
    assert two.step_ms == pytest.approx(40 + per_mb * (4 + 1 / 1024) + 2)
    assert two.overlap_pct > 30


def test_exposed_communication_grows_with_bytes_and_world_and_never_exceeds_the_communication():
    b = hand_basis()
    fit = W.CommFit(alpha_ms=0.5, beta_ms_per_mb=3.0, n=1, err_pct=0.0, world=2)
    prev = None
    for n in (2, 4, 8, 16, 32, 64):
        p = W.predict(b, fit, cap_mb=1.0, world=n)
        assert 0 <= p.exposed_ms <= p.comm_ms + 1e-9
        if prev is not None:
            assert p.exposed_ms >= prev.exposed_ms and p.step_ms >= prev.step_ms
            assert p.efficiency_pct <= prev.efficiency_pct
        prev = p
    # a faster bus never makes the step longer
    slow, fast = (W.predict(b, fit, cap_mb=1.0, world=8, bus_gbps=g) for g in (1.0, 100.0))
    assert fast.step_ms <= slow.step_ms and fast.exposed_ms <= slow.exposed_ms
    # instant collectives: the step of the backward and the tail, fully efficient
    zero = W.predict(b, W.CommFit(0.0, 1e-12, 1, 0.0, 2), cap_mb=1.0)
    assert zero.step_ms == pytest.approx(42.0, abs=1e-6) and zero.efficiency_pct == pytest.approx(100.0)


def test_one_nccl_stream_serialises_what_two_gloo_threads_overlap():
    b2, b1 = hand_basis(lanes=2), hand_basis(lanes=1)
    fit = W.CommFit(alpha_ms=0.0, beta_ms_per_mb=30.0, n=1, err_pct=0.0, world=2)
    # cap 1: fc2's bucket (ready 20 ms) runs 20-80 ms; fc1's (ready 40 ms) starts at 40 on a
    # second gloo thread, at 80 on the one NCCL stream
    g, s = W.predict(b2, fit, cap_mb=1.0), W.predict(b1, fit, cap_mb=1.0)
    c1 = 30.0 * (4 + 1 / 1024)
    assert g.step_ms == pytest.approx(40 + c1 + 2)
    assert s.step_ms == pytest.approx(20 + 30.0 * (2 + 1 / 1024) + c1 + 2)


def test_the_fit_recovers_alpha_and_beta_and_ignores_waiting_for_a_late_rank():
    a, bms = 1.5, 2.0
    steps, sizes = [], []
    for i, mb in enumerate((1, 2, 4, 8, 16)):
        nb = int(mb * W.MIB)
        t = (a + bms * mb) * 1000
        # rank 1 ready 7 ms after rank 0: rank 0's span starts early and waits
        tr = W.trace_step({0: two_layer_step(0, [(0, 40_000, 40_000, int(47_000 + t))]),
                           1: two_layer_step(1, [(0, 47_000, 47_000, int(47_000 + t))])})
        steps.append(tr)
        sizes.append({0: nb})
    basis = W.Basis("ddp", 2, 2, "gloo", [1] * 4, [0, 0, 1, 1], 25.0, True, None, list(range(5)), steps, sizes)
    fit = W.fit_comm(basis)
    assert fit.alpha_ms == pytest.approx(a, rel=1e-2) and fit.beta_ms_per_mb == pytest.approx(bms, rel=1e-2)
    assert fit.err_pct < 1 and fit.n == 5 and fit.sizes == 5
    # the ring: 2(N-1)/N of the bytes per rank, 2(N-1) latency steps
    assert fit.ms(W.MIB, world=4) == pytest.approx(a * 3 + bms * 1.5)
    assert fit.ms(W.MIB, world=4, bus_gbps=1.5 * W.MIB / 1e6) == pytest.approx(a * 3 + 1.0)


# -- from a recording ----------------------------------------------------------------------------
def test_whatif_of_the_demo_recording_predicts_every_cap_and_matches_the_cap_it_ran():
    from ddptui.recording.loader import load

    st = load(DEMO).store
    rep = W.whatif(st, caps=[1.0, 5.0, 25.0, 100.0])
    caps = {p.cap_mb: p for p in rep.caps}
    assert [caps[c].collectives for c in (1.0, 5.0, 25.0, 100.0)] == [4, 3, 2, 1]
    assert caps[25.0].measured and caps[25.0].measured["steps"] >= 20
    assert caps[1.0].measured is None
    # the recorded cap, replayed: within 15 % of the measured median step
    m = caps[25.0].measured
    assert abs(caps[25.0].step_ms - m["step_ms"]) / m["step_ms"] < 0.15
    # one bucket cannot overlap the backward; smaller buckets can only hide more
    assert caps[100.0].overlap_pct == 0.0
    assert caps[1.0].exposed_ms <= caps[25.0].exposed_ms <= caps[100.0].exposed_ms + 1e-9


def test_the_verb_on_a_real_runs_recording(tmp_path, cli_run):
    rec = str(cli_run["rec"])  # a real recorded run of naive and ddp (conftest)
    out = tmp_path / "w.json"
    r = run_main("whatif", rec, "--bucket-cap", "1,25,100", "--world", "2,8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "PREDICTIONS" in r.stdout and "fit error" in r.stdout and "unchecked" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "prediction" and doc["basis"]["world"] == 2 and doc["basis"]["steps"] >= 3
    assert [p["cap_mb"] for p in doc["bucket_caps"]] == [1.0, 25.0, 100.0]
    assert {(p["strategy"], p["world"]) for p in doc["world_sizes"]} == {
        ("naive", 2), ("naive", 8), ("ddp", 2), ("ddp", 8)}
    assert doc["fit"]["collectives"] > 0 and doc["fit"]["beta_ms_per_mb"] > 0
    ddp25 = next(p for p in doc["bucket_caps"] if p["cap_mb"] == 25.0)
    assert ddp25["measured"]["steps"] >= 3  # the cap it ran: measured next to predicted
    r = run_main("whatif", rec, "--json", "-", "--strategy", "ddp")
    assert r.returncode == 0 and json.loads(r.stdout)["bucket_caps"]


@pytest.mark.parametrize("args, says", [
    (["--bucket-cap", "0"], "--bucket-cap must be positive"),
    (["--bucket-cap", "1,abc"], "--bucket-cap must be a number"),
    (["--bucket-cap", ","], "--bucket-cap is empty"),
    (["--world", "2,x"], "--world must be a whole number"),
    (["--bus-gbps", "inf"], "--bus-gbps must be a finite number"),
    (["--from-cap", "3"], "no kept ddp step ran with bucket_cap_mb 3"),
    (["--hop-us", "-1"], "--hop-us must be in"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    r = run_main("whatif", DEMO, *args)
    assert r.returncode == 2 and says in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not r.stdout


def test_bad_files_are_one_line(tmp_path):
    r = run_main("whatif", str(tmp_path / "missing.ddptui"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    junk = tmp_path / "junk.ddptui"
    junk.write_bytes(b"not a recording")
    r = run_main("whatif", str(junk))
    assert r.returncode == 2 and r.stderr.startswith("ddptui: error:") and "Traceback" not in r.stderr


# -- the panel ---------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_the_whatif_panel_draws_the_ladder_as_predictions_in_the_replay_ui():
    from ddptui.ui.app import DdpApp
    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.widgets.whatif import WhatIfPanel

    src = ReplaySource(DEMO, speed=8.0)
    app = DdpApp(src)
    async with app.run_test(size=(200, 70)) as pilot:
        for _ in range(60):
            await pilot.pause(0.05)
            app.redraw()
            panel = app.query_one(WhatIfPanel)
            if panel.display and "PREDICTED" in panel.plain:
                break
        text = panel.plain
        assert panel.display, "the what-if panel has room at 200x70"
        assert "PREDICTED" in text and "α" in text and "fit ±" in text
        rows = {ln.split()[0]: ln for ln in text.splitlines()[2:]}
        assert set(rows) == {f"{c:g}" for c in spec.BUCKET_LADDER_MB}
        assert "in force" in rows["25"] and "in force" not in rows["1"]
        # measured only where the run ran: the cap in force
        assert rows["1"].split()[-1] == "–" and rows["25"].split()[-3] != "–"


def test_many_ranks_replay_a_few_and_predict_what_all_would():
    """With many ranks the panel replays 64 of them (the ranks last ready, a spread of the
    rest): a step's prediction within a few per cent of replaying every rank, at a small
    part of its cost, and the panel says how many were replayed."""
    from ddptui.ui.widgets.whatif import build
    from tests.helpers import store_of, synthetic_frames, synthetic_meta
    st = store_of(synthetic_frames(steps=8, model="medium", world=256), synthetic_meta(model="medium", world=256))
    full = W.ladder(st, last=2, reference_last=2)
    few = W.ladder(st, last=2, reference_last=2, max_ranks=64)
    assert full[1].ranks is None and len(few[1].ranks) == 64
    newest = st.step_batches("ddp", few[1].steps[-1])
    latest = max(newest, key=lambda r: newest[r].base_ns + newest[r].iss[-1] * 1000)
    assert latest in few[1].ranks  # the rank the others waited for is replayed
    for (c, p, _), (_, q, _) in zip(full[2], few[2]):
        assert q.step_ms == pytest.approx(p.step_ms, rel=0.05), c
    text = "".join(t for line in build(st, few, None) for t, _ in line)
    assert "64 of 256 ranks replayed" in text


def test_the_ranks_replayed_hold_whoever_was_last_in_any_step():
    """replay_ranks: the ranks ready last in each step replayed (a rank late in an older step
    only is kept too), a spread of the others; every rank where there are few."""
    def step(late: int, n: int = 256):
        return {r: SpanBatch(r, "ddp", 0, 0, bytes([COMM]), array("H", [0]), array("I", [0]),
                             array("I", [100]), array("I", [90 if r == late else 10])) for r in range(n)}
    got = W.replay_ranks([step(200), step(7)], 64)
    assert len(got) == 64 and 200 in got and 7 in got and got == sorted(got)
    assert W.replay_ranks([step(3, n=40)], 64) == list(range(40))
