"""Every collective on the app side (COLL spans, the colls frame, a heartbeat's collective in
flight): figures, who waits for whom, the summary's collectives section, the lanes, the
exports (Chrome, Kineto read by HTA), SyntheticRun's fsdp, what-if, and a hang that names
its collective. Through the real Store, Feed (recording.load), exporters and Textual Pilot."""
from __future__ import annotations

import importlib
import json
import os

import pytest

from ddptui.model import figures, hang, whatif
from ddptui.model.columns import Placement
from ddptui.model.store import Store
from ddptui.recording.loader import load
from ddptui.recording.synthetic import SyntheticRun, SyntheticSource, fill_store
from ddptui.reports.report import print_summary
from ddptui.ui.widgets import lanes, statuslines, theme
from ranks import frames, spec, wire
from ranks.frames import spans_frame
from ranks.wire import BWD, COLL, COMM, FWD, OPT, STEP

from .helpers import ROOT, hta_analysis, run_cli, synthetic_meta, write_recording

SMALL = os.path.join(ROOT, "demo", "cpu-small-2ranks.ddptui")
LAYERS = spec.layer_names("small")


def batch(spans, iss=None, rank=0, strategy="fsdp", step=3):
    kinds, idxs, t0, t1 = zip(*spans)
    base = 10**9
    f = spans_frame(rank, strategy, step, base, list(kinds), list(idxs),
                    [base + t * 1000 for t in t0], [base + t * 1000 for t in t1],
                    [base + t * 1000 for t in (iss or [])])
    return wire.decode_spans(frames.decode(wire.pack(f)[4:]))


def fsdp_frames(steps=6, world=2, strategies=("fsdp",), **kw) -> tuple[SyntheticRun, list]:
    run = SyntheticRun("small", world, strategies, seed=1, **kw)
    out = list(run.header_frames())
    for k in range(steps):
        out += run.step_frames(k)
    return run, out


def store_of(fr) -> Store:
    st = Store()
    for f in fr:
        st.ingest(f)
    st.update()
    return st


def recording(tmp_path, name="fsdp", steps=6, strategies=("fsdp",), **kw):
    run, fr = fsdp_frames(steps, strategies=strategies, **kw)
    p = tmp_path / f"{name}.ddptui"
    write_recording(p, fr, synthetic_meta(strategies=strategies))
    return p, run, fr


# -- 1. figures ---------------------------------------------------------------------------
ROW_AG = (0, "all_gather", 8000, 2, "default_pg", 1, "forward", True)


def test_coll_spans_are_communication_with_bytes_from_the_table():
    # compute 0-100, 100-300; an AllReduce (bucket 0) 250-400 and a COLL (row 0) 50-150
    b = batch([(STEP, 0, 0, 420), (FWD, 0, 0, 100), (COLL, 0, 50, 150), (BWD, 0, 100, 300),
               (COMM, 0, 250, 400), (OPT, 0, 400, 420)], iss=[40, 240])
    p = Placement(b.kind, b.idx)
    assert p.comm == [2, 4] and p.colls == [0] and p.allreduce == [1]
    # kind-aware: COLL row 0 and bucket 0 are two collectives, never one
    assert p.comm_keys == [(COLL, 0, 0), (COMM, 0, 0)]
    r = figures.rank_step(b, lambda i: 1000, {0: ROW_AG}.get, 2)
    assert (r.comm_ms, r.exposed_ms, r.calls, r.colls, r.bytes) == (0.25, 0.1, 2, 1, 9000)
    assert r.bus_bytes == 1000 * 1.0 + 8000 * 0.5  # AllReduce 2(N-1)/N, all_gather (N-1)/N
    # a COLL span no row describes: counted, no bytes, no crash
    u = figures.rank_step(b, lambda i: 1000, {}.get, 2)
    assert (u.calls, u.colls, u.bytes) == (2, 1, 1000)
    # without COLL spans: the old figures, nothing new
    plain = batch([(STEP, 0, 0, 420), (FWD, 0, 0, 100), (BWD, 0, 100, 300), (COMM, 0, 250, 400)], iss=[240])
    assert figures.rank_step(plain, lambda i: 1000).bus_bytes is None


def test_fsdp_steps_count_every_collective():
    run, fr = fsdp_frames()
    st = store_of(fr)
    s = st.summary("fsdp")
    n = len(LAYERS)
    assert s["collective_calls_per_step"] == 3 * n and s["allreduce_calls_per_step"] == 0
    assert s["bytes_per_step"] == 3 * sum(run.layer_bytes(i) for i in range(n))
    assert s["comm_ms"] > 0 and 0 < s["exposed_comm_ms"] < s["comm_ms"]  # prefetch hides some
    # exposed = union(compute ∪ comm) − union(compute), per rank, from the spans themselves
    b = st.step_batches("fsdp", 3)[0]
    comp = [(b.t0[i], b.t1[i]) for i in range(len(b)) if b.kind[i] in (FWD, BWD)]
    comm = [(b.t0[i], b.t1[i]) for i in range(len(b)) if b.kind[i] == COLL]
    want = (figures.union_length(comp + comm) - figures.union_length(list(comp))) / 1e3
    assert st.rank_figures("fsdp", 3, 0).exposed_ms == pytest.approx(want)


def test_no_coll_spans_no_new_fields():
    got = load(SMALL)
    for row in got.store.summaries():
        assert "collectives" not in row and "collective_calls_per_step" not in row


# -- 2. who waits for whom ------------------------------------------------------------------
def test_a_late_rank_holds_up_the_others_collectives():
    run, fr = fsdp_frames(steps=8, slow=(1, 2, 5.0))
    st = store_of(fr)
    w = st.step_waits("fsdp", 5)
    colls = [c for c in w.collectives if c.kind == COLL]
    assert len(colls) == 3 * len(LAYERS)
    assert w.last_arriver == 1 and w.wait_ms[0] > 4.0
    assert w.culprit is not None and w.culprit[:2] == (1, 2)
    v = st.view("fsdp", 5)
    lane0, lane1 = v.spans[0], v.spans[1]
    place = lane0.placement()
    late = [j for j, i in enumerate(place.comm) if lane0.others[j] is not None
            and lane0.others[j] > lane0.issued[j] + 4.0]
    assert late and all(lane1.last[j] for j in late) and not any(lane0.last[j] for j in late)


# -- 3. the summary's collectives section ---------------------------------------------------
def test_collectives_section_per_op_phase_and_layer(tmp_path):
    run, fr = fsdp_frames()
    st = store_of(fr)
    rows = st.summary("fsdp")["collectives"]
    assert [(r["op"], r["phase"]) for r in rows] == [("all_gather", "forward"), ("all_gather", "backward"),
                                                      ("reduce_scatter", "backward")]
    n = len(LAYERS)
    for r in rows:
        assert r["calls_per_step"] == n and r["group_size"] == 2
        assert [x["layer"] for x in r["layers"]] == LAYERS
        assert r["bytes_per_step"] == sum(run.layer_bytes(i) for i in range(n))
        assert 0 <= r["exposed_ms_per_step"] <= r["time_ms_per_step"]
        # bus bandwidth: bytes x (N-1)/N over their time
        assert r["bus_bw_gbps"] == pytest.approx(r["bytes_per_step"] * 0.5 / (r["time_ms_per_step"] / 1e3) / 1e9,
                                                 rel=0.02)
    p = tmp_path / "f.ddptui"
    write_recording(p, fr, synthetic_meta(strategies=("fsdp",)))
    res = run_cli("summary", str(p), "--json", str(tmp_path / "f.json"))
    assert res.returncode == 0, res.stderr
    assert "reduce_scatter (backward)" in res.stdout and "0 + 12 coll" in res.stdout
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["strategies"][0]["collectives"][2]["op"] == "reduce_scatter"


def test_ddp_with_an_all_to_all_reads_beside_its_gradients():
    run, fr = fsdp_frames(strategies=("ddp",), a2a_after=1)
    st = store_of(fr)
    s = st.summary("ddp")
    assert s["allreduce_calls_per_step"] == 1 and s["collective_calls_per_step"] == 2
    ops = [(r["op"], r["phase"], r["gradients"]) for r in s["collectives"]]
    assert ops == [("all_to_all", "forward", False), ("all_to_all", "backward", False),
                   ("all_reduce", "backward", True)]
    assert s["collectives"][0]["exposed_pct"] == 100.0  # blocking, between layers
    assert s["buckets"]  # per-bucket figures stay bucket-only
    assert set(st.bucket_figures("ddp", 3)) == {0}


def test_unknown_collective_is_counted_and_drawn_as_unknown():
    st = Store()
    run, fr = fsdp_frames(steps=4)
    for f in fr:
        if type(f) is not frames.Colls or f.rank != 1:  # rank 1 never says what its collectives were
            st.ingest(f)
    st.update()
    s = st.summary("fsdp")
    assert s["collective_calls_per_step"] == 12
    by = {r["op"]: r for r in s["collectives"]}
    assert set(by) == {"all_gather", "reduce_scatter", "unknown"}  # rank 0's, and rank 1's unknown ones
    assert by["unknown"]["calls_per_step"] == 6 and by["unknown"]["bytes_per_step"] == 0  # (per rank: mean)
    assert st.rank_figures("fsdp", 2, 1).bytes == 0 and st.rank_figures("fsdp", 2, 1).calls == 12
    v = st.view("fsdp", 2)
    v.colls = {1: {}}
    bars = lanes.comm_bars(v.spans[1], str, coll_of=lambda i: lanes.coll_look(v.coll_table(1).get(i), LAYERS))
    assert {c for _, _, c, _ in bars} >= {theme.COLL_UNKNOWN}


# -- 4. the lanes and the screen ------------------------------------------------------------
def test_coll_bars_coloured_by_op_and_labelled():
    run, fr = fsdp_frames()
    st = store_of(fr)
    v = st.view("fsdp", 3)
    coll_of = lambda i: lanes.coll_look(v.coll_table(0).get(i), LAYERS)  # noqa: E731
    bars = lanes.comm_bars(v.spans[0], str, coll_of=coll_of)
    got = {(c - (c - theme.COLL_AG) % 2, label) for _, _, c, label in bars if label}
    assert (theme.COLL_AG, f"AG {LAYERS[0]}") in got and (theme.COLL_RS, f"RS {LAYERS[-1]}") in got
    # wide enough: the label is on the lane
    segs = lanes.lane_segments(bars, 4000, max(e for _, e, _, _ in bars) / 3900)
    text = "".join(s.text for s in segs)
    assert f"AG {LAYERS[1]}" in text and f"RS {LAYERS[2]}" in text
    assert statuslines.coll_entries({"all_gather", "reduce_scatter", "barrier"}) == (
        ("AG all-gather", theme.COLL_AG), ("RS reduce-scatter", theme.COLL_RS), ("other collective", theme.COLL_OTHER))


@pytest.mark.asyncio
async def test_screen_counts_and_names_collectives():
    from ddptui.ui.app import DdpApp
    app = DdpApp(SyntheticSource(8, 2, "medium", ("ddp", "fsdp"), seed=7, a2a_after=1))
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    assert "15 collectives" in text and "2 AllReduce + 2 coll" in text
    assert "AR+coll" in text and "0+15" in text and "2+2" in text
    assert "AG all-gather" in text and "RS reduce-scatter" in text and "A2A all-to-all" in text


# -- 5. exports -----------------------------------------------------------------------------
def test_chrome_trace_names_collectives_with_their_args(tmp_path):
    p, run, _ = recording(tmp_path)
    out = tmp_path / "t.json"
    res = run_cli("export", str(p), "-o", str(out))
    assert res.returncode == 0, res.stderr
    ev = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]
    colls = [e for e in ev if e["cat"] == "communication"]
    assert len(colls) == 6 * 2 * 3 * len(LAYERS)
    ag = next(e for e in colls if e["name"] == f"all_gather {LAYERS[1]}" and e["args"]["phase"] == "backward")
    a = ag["args"]
    assert (a["op"], a["bytes"], a["group"], a["group_size"], a["layer"], a["async"]) == \
        ("all_gather", run.layer_bytes(1), "default_pg", 2, LAYERS[1], True)
    assert "queued_us" in a and "last_arriver" in a and "wait_us" in a


@pytest.fixture
def hta():
    return pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")


def test_kineto_export_hta_counts_collectives(tmp_path, hta):
    p, run, fr = recording(tmp_path, steps=8)
    out = tmp_path / "k"
    res = run_cli("export", str(p), "--format", "kineto", "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "rank0.json").read_text())
    names = {e["name"].split("(")[0] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    assert {"ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"} <= names
    rs = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "ReduceScatter" in e["name"])
    assert rs["args"]["Collective name"] == "_reduce_scatter_base"
    assert rs["args"]["Out msg nelems"] * 2 == rs["args"]["In msg nelems"]
    a = hta_analysis(out)
    its = set(a["iterations"])
    got = a["overlap"]
    st = store_of(fr)
    for r in (0, 1):
        c = sum(st.rank_figures("fsdp", k, r).comm_ms for k in its)
        e = sum(st.rank_figures("fsdp", k, r).exposed_ms for k in its)
        ours = figures.overlap_pct(c, e)
        assert ours > 20 and abs(got[r] - ours) <= 2, (r, got[r], ours)


# -- 6. synthetic runs through the Feed's checks --------------------------------------------
def test_synthetic_fsdp_frames_pass_the_feed(tmp_path):
    p, _, _ = recording(tmp_path, strategies=("ddp", "fsdp"), a2a_after=0)
    got = load(str(p))
    assert got.rejected == [] and got.damage is None
    assert got.store.complete_steps("fsdp") and got.store.collective_tables("ddp")[1]


# -- 7. a hang names its collective ---------------------------------------------------------
def hb(rank, ts_s, waiting=None, n=None, step=4):
    return frames.Hb(rank=rank, step=step, phase="training", dropped=0, ts=int(ts_s * 1e9),
                     waiting=frames.UNSET if waiting is None else waiting,
                     colls=frames.UNSET if n is None else n)


def test_stall_names_the_collective_and_who_never_entered():
    run, fr = fsdp_frames(steps=2, world=3)
    st = store_of(fr)
    issued = int(100e9)
    ag = ("all_gather", 17, 12_600_000, 2, issued)
    for f in (hb(0, 101.0, ag, 40), hb(1, 101.0, ag, 40), hb(2, 101.0, None, 39)):
        st.ingest(f)
    assert hang.stall(st.rank_snapshot(), list(st.meta.layers)) is None  # 1 s: not yet
    for f in (hb(0, 104.2, ag, 40), hb(1, 104.1, ag, 40), hb(2, 104.0, None, 39)):
        st.ingest(f)
    s = hang.stall(st.rank_snapshot(), list(st.meta.layers))
    assert (s.op, s.seq, s.nbytes, s.layer) == ("all_gather", 17, 12_600_000, LAYERS[2])
    assert sorted(s.inside) == [0, 1] and list(s.never) == [2]
    text = s.text()
    assert f"all_gather #17 (12.6 MB, {LAYERS[2]})" in text
    assert "rank 2 never entered it (inside no collective; 39 entered, 40 by those inside)" in text
    assert s.lines()[0] == f"rank 0 inside all_gather #17 (12.6 MB, {LAYERS[2]}) for 4 s"
    for f in (hb(0, 105.0, None, 41), hb(1, 105.0, None, 41)):  # it completed: nothing to say
        st.ingest(f)
    assert hang.stall(st.rank_snapshot(), list(st.meta.layers)) is None


def test_a_rank_past_the_stuck_collective_went_past_it():
    """A rank whose group sequence number is beyond the stuck collective (inside a later one),
    or that is inside none having entered as many as those inside, went past it: not 'never
    entered'. A rank inside an earlier one, or behind in its count, never entered it."""
    run, fr = fsdp_frames(steps=2, world=5)
    st = store_of(fr)
    issued = int(100e9)
    ag = ("all_gather", 17, 12_600_000, 2, issued)
    later = ("reduce_scatter", 18, 12_600_000, 2, int(103e9))
    earlier = ("all_gather", 16, 12_600_000, 1, int(103.5e9))
    for f in (hb(0, 104.0, ag, 40), hb(1, 104.0, ag, 40), hb(2, 104.0, later, 41),
              hb(3, 104.0, None, 40), hb(4, 104.0, earlier, 39)):
        st.ingest(f)
    s = hang.stall(st.rank_snapshot(), list(st.meta.layers))
    assert (s.op, s.seq) == ("all_gather", 17) and sorted(s.inside) == [0, 1]
    assert sorted(s.past) == [2, 3] and sorted(s.never) == [4]
    text = s.text()
    assert f"rank 2 went past it (inside reduce_scatter #18 ({LAYERS[2]}); 41 entered)" in text
    assert "rank 3 went past it (inside no collective; 40 entered)" in text
    assert f"rank 4 never entered it (inside all_gather #16 ({LAYERS[1]}); 39 entered, 40 by those inside)" in text
    assert "rank 2 never" not in text and "rank 3 never" not in text
    assert [ln.split(" (")[0] for ln in s.lines()[2:]] == [
        "rank 2 went past it", "rank 3 went past it", "rank 4 never entered it"]
    assert s.short().endswith("· r4 never entered · r2 r3 went past")


def test_a_stall_in_a_ddp_bucket_names_the_bucket_and_its_layers():
    """A rank blocked in DDP's reducer is inside its bucket's AllReduce (ddptui's comm hook
    puts it in flight; the heartbeat says the bucket): named with the bucket's layers, as the
    assignment holds them, and bytes; the other rank, inside none and behind in its count,
    never entered it. Without an assignment yet (a stall in the first step), the layer the
    rank said."""
    run, fr = fsdp_frames(steps=2, strategies=("ddp",))
    st = store_of(fr)
    ar = ("all_reduce", 13, 5_850_152, 3, int(100e9))
    st.ingest(frames.Hb(rank=0, step=2, phase="training", ts=int(104.2e9), waiting=ar, colls=13, bucket=0))
    st.ingest(hb(1, 104.0, None, 12, step=2))
    s = st.stall()
    assert (s.bucket, s.layers) == (0, ["fc4", "fc3", "fc2", "fc1"])
    assert s.text() == ("rank 0 inside DDP bucket 0 AllReduce #13 (5.9 MB, layers fc4 … fc1 (4)) for 4 s; "
                        "rank 1 never entered it (inside no collective; 12 entered, 13 by those inside)")
    assert s.short() == "stuck in bucket 0 AR #13 (fc4 … fc1 (4)): r0 inside 4 s · r1 never entered"
    got = hang.stall(st.rank_snapshot(), list(st.meta.layers))  # (no assignment: the rank's layer)
    assert got.collective() == "DDP bucket 0 AllReduce #13 (5.9 MB, fc4)"


def _watched(beats):
    """A 2-step FSDP2 run's Store, rank 0 training with these heartbeats, and a Watchdog whose
    last progress was at 0 s."""
    from ddptui.live.watchdog import Watchdog
    run, fr = fsdp_frames(steps=2)
    st = store_of(fr)
    for f in (frames.Phase(rank=0, phase="training"), *beats):
        st.ingest(f)
    w = Watchdog(st, hang_s=30.0, hb_timeout_s=60.0, on_rank_gone=lambda r: None, now=0.0)
    w.last_progress = 0.0
    w._last_spans = st.spans
    return run, st, w


def test_watchdog_logs_the_stall_within_seconds():
    ag = ("reduce_scatter", 9, 4_000_000, 1, int(50e9))
    run, st, w = _watched((hb(0, 53.5, ag, 20), hb(1, 53.5, None, 19)))
    assert w.check(2.0) is None and not any("no progress" in t for _, _, t in st.log_lines())
    assert w.check(4.0) is None
    said = [t for _, lvl, t in st.log_lines() if t.startswith("no progress")]
    assert len(said) == 1 and "rank 0 inside reduce_scatter #9 (4.0 MB" in said[0]
    assert "rank 1 never entered it" in said[0]
    w.check(5.0)
    assert len([t for _, _, t in st.log_lines() if t.startswith("no progress")]) == 1  # said once
    why = w.check(31.0)
    assert why.startswith("no step finished for 30 s: rank 0 inside reduce_scatter #9")


def test_watchdog_says_a_stall_no_collective_explains_and_when_steps_come_again():
    """No rank inside a collective ddptui sees (a stall before any): after 2 x STALL_S (and
    10 typical steps) without a step, said anyway, once, with each rank's step; when steps
    come again, said too."""
    run, st, w = _watched((hb(0, 53.5, None, 20), hb(1, 53.5, None, 20)))
    assert w.check(4.0) is None and not any("no progress" in t for _, _, t in st.log_lines())
    w.check(6.5)
    w.check(7.0)
    said = [t for _, _, t in st.log_lines() if t.startswith("no progress")]
    assert said == ["no progress for 6 s (rank 0 step 4, rank 1 step 4; no rank is inside a collective "
                    "ddptui sees)"], said
    for f in run.step_frames(2):
        st.ingest(f)
    w.progress(9.0)
    assert st.log_lines()[-1][2] == "steps again after 9 s without one (the stall: no collective named)"


@pytest.mark.asyncio
async def test_status_line_shows_the_stall():
    from ddptui.ui.app import DdpApp
    src = SyntheticSource(4, 2, "small", ("fsdp",), seed=7)
    ag = ("all_gather", 5, 2_000_000, 0, int(10e9))
    src.store.ingest(hb(0, 14.0, ag, 8))
    src.store.ingest(hb(1, 14.0, None, 7))
    app = DdpApp(src)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    assert f"stuck in AG #5 {LAYERS[0]}: r0 inside 4 s · r1 never entered" in text


# -- 8. what-if keeps COLL spans as they are ------------------------------------------------
def test_whatif_keeps_collectives_fixed():
    run, fr = fsdp_frames(steps=10, strategies=("ddp", "fsdp"), a2a_after=1)
    st = store_of(fr)
    rep = whatif.whatif(st, caps=[1.0, 25.0], worlds=[2])
    assert [p.strategy for p in rep.worlds] == ["ddp"]  # fsdp: nothing to re-bucket
    same = rep.caps[1]
    # the recorded cap and world: the prediction holds the all_to_alls' time
    assert same.comm_ms == pytest.approx(same.measured["comm_ms"], rel=0.15)
    assert same.no_comm_step_ms > 0
    with pytest.raises(whatif.WhatIfError, match="fsdp"):
        whatif.collect(st, "fsdp")
    b = whatif.collect(st, "ddp")
    t = b.traces[0][0]
    assert len(t.fixed) == 2 and len(t.colls) == 1  # (the issue column read past the COLL spans)
    assert t.colls[0].ready >= max(t.bwd_end.values()) - 1e-6


@pytest.mark.asyncio
async def test_a_scripts_fsdp2_alone_gets_its_pane_and_headline():
    """`ddptui run` names ddp until a rank's hello says the script's model is FSDP2: the
    pane drawn meanwhile goes (it once waited forever beside the fsdp pane's empty slot), the
    fsdp pane takes the screen, and the headline says what FSDP hides (not "waiting for
    complete steps of two strategies")."""
    from ddptui.ui.app import DdpApp
    src = SyntheticSource(0, 2, "medium", ("fsdp",), seed=7)
    src.store.meta.strategies = ["ddp"]  # (as `ddptui run --auto` starts)
    app = DdpApp(src)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        assert set(app.panes) == {"ddp"}
        src.add_steps(8)
        assert src.store.strategies() == ["fsdp"]
        for _ in range(3):
            app.redraw()
            await pilot.pause()
        assert set(app.panes) == {"fsdp"}
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    assert "FSDP hides" in app.headline.render_line(0).text
    assert "waiting for the first complete step" not in text and "FSDP  step" in text


def test_whatif_on_fsdp_alone_says_why_it_predicts_none(tmp_path):
    """An FSDP2 run alone: nothing to re-bucket; `whatif` says so in one line (it said the
    recording had no strategy that communicates)."""
    from .helpers import run_main
    p, _, _ = recording(tmp_path, steps=4)
    r = run_main("whatif", str(p))
    assert r.returncode == 2 and "fsdp: no gradient AllReduce to re-bucket" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_watchdog_says_nothing_while_a_strategy_has_not_passed_its_first_step():
    """A strategy's first step takes its start-up (DDP's wrap; 6 s on a loaded 2-core machine):
    with naive past its warm-up and ddp's first step alone complete, 20 s without a step and no
    collective named is not called a stall (a full-disk test counted such a warning), but once
    every strategy has two steps it is."""
    from ddptui.live.watchdog import Watchdog
    run = SyntheticRun("small", 2, ("naive", "ddp"), seed=1)
    fr = list(run.header_frames())
    for k in range(4):
        fr += [f for f in run.step_frames(k) if getattr(f, "strategy", "naive") != "ddp" or k == 0]
    st = store_of(fr)
    for f in (frames.Phase(rank=0, phase="training"), hb(0, 53.5, None, 4), hb(1, 53.5, None, 4)):
        st.ingest(f)
    w = Watchdog(st, hang_s=60.0, hb_timeout_s=60.0, on_rank_gone=lambda r: None, now=0.0)
    w.last_progress, w._last_spans = 0.0, st.spans
    for t in (7.0, 20.0):
        w.check(t)
    assert not [t for _, _, t in st.log_lines() if t.startswith("no progress")]
    for f in run.step_frames(1):  # ddp's second step (and naive's again)
        if getattr(f, "strategy", None) == "ddp":
            st.ingest(f)
    st.update()
    w.last_progress, w._last_spans = 20.0, st.spans
    w.check(27.0)
    assert [t for _, _, t in st.log_lines() if t.startswith("no progress")]
