"""Who waits for whom: the analysis on hand-made steps, and a real straggler on 2 CPU ranks."""
from __future__ import annotations

import pytest

from ddptui.model import stragglers
from ranks import spec
from ranks.frames import spans_frame
from ranks.wire import BWD, COMM, STEP, decode_spans

MS = 1_000_000


def batch(rank, bwd, comms, base=10**12):
    """bwd: {layer: (t0_ms, t1_ms)}; comms: [(idx, ready_ms, end_ms)] -> a decoded span batch."""
    kinds, idxs, t0, t1 = [STEP], [0], [base], [base + 500 * MS]
    for layer, (a, z) in bwd.items():
        kinds.append(BWD); idxs.append(layer); t0.append(base + int(a * MS)); t1.append(base + int(z * MS))
    iss = []
    for idx, ready, end in comms:
        kinds.append(COMM); idxs.append(idx); t0.append(base + int(ready * MS)); t1.append(base + int(end * MS))
        iss.append(base + int(ready * MS))
    return decode_spans(spans_frame(rank, "ddp", 1, base, kinds, idxs, t0, t1, iss))


def test_last_arriver_wait_union_and_culprit_layer():
    # rank 1's fc2 (layer 1) backward is 40 ms longer: its two buckets are ready 40 ms late
    b0 = batch(0, {2: (0, 10), 1: (10, 20), 0: (20, 30)}, [(0, 12, 60), (1, 31, 75)])
    b1 = batch(1, {2: (0, 10), 1: (10, 60), 0: (60, 70)}, [(0, 52, 61), (1, 71, 76)])
    sw = stragglers.step_waits({0: b0, 1: b1}, step_ms=100)
    assert [c.last for c in sw.collectives] == [1, 1]
    # waits 12..52 and 31..71 overlap: the union is 59 ms, not 40 + 40
    assert sw.wait_ms[0] == pytest.approx(59, abs=0.01)
    assert sw.wait_ms[1] == 0
    assert sw.last_arriver == 1
    # transfer = end - last ready, median over ranks (8.5, 4.5 ms), then over the collectives
    assert sw.transfer_ms == pytest.approx(6.5, abs=0.01)
    assert sw.culprit[:2] == (1, 1) and sw.culprit[2] == pytest.approx(40, abs=0.01)
    assert stragglers.culprit_text(sw.culprit, spec.layer_names("small")) == "rank 1 · fc2 backward +40 ms"


def test_no_culprit_when_nobody_waited_long():
    b0 = batch(0, {0: (0, 10)}, [(0, 10.0, 20)])
    b1 = batch(1, {0: (0, 10.5)}, [(0, 10.5, 20)])
    sw = stragglers.step_waits({0: b0, 1: b1}, step_ms=30)
    assert sw.last_arriver == 1 and sw.culprit is None
    assert stragglers.step_waits({0: b0}, step_ms=30) is None  # one rank: nobody to wait for


def test_summary_names_the_rank_the_others_waited_for_most_often():
    slow = stragglers.step_waits({0: batch(0, {1: (0, 10)}, [(0, 10, 20)]),
                         1: batch(1, {1: (0, 50)}, [(0, 50, 55)])}, step_ms=60)
    fast = stragglers.step_waits({0: batch(0, {1: (0, 12)}, [(0, 12, 20)]),
                         1: batch(1, {1: (0, 10)}, [(0, 10, 20)])}, step_ms=60)
    got = stragglers.summarize([slow] * 15 + [fast] * 5, spec.layer_names("small"))
    assert got["last_arriver_rank"] == 1 and got["last_arriver_pct"] == 75.0
    assert got["culprit_layer"] is None  # 3 steps in 4: not enough to name a culprit
    got = stragglers.summarize([slow] * 18 + [fast] * 2, spec.layer_names("small"))
    assert got["last_arriver_pct"] == 90.0 and not got["gathering"]
    assert got["culprit_layer"] == "fc2" and got["culprit"].startswith("rank 1 · fc2 backward +40")
    assert got["wait_ms_median"] == {"0": 40.0, "1": 0.0}
    assert got["named_pct"] == 90.0
    # fewer steps than a verdict's window (evidence.WINDOW = 20): who arrived last, no culprit
    got = stragglers.summarize([slow] * 7 + [fast], spec.layer_names("small"))
    assert got["last_arriver_rank"] == 1 and got["last_arriver_pct"] == 87.5
    assert got["culprit"] == "" and got["culprit_layer"] is None and got["culprit_rank"] is None
    assert got["gathering"] and stragglers.gathering_text(got) == "gathering evidence (8/20 steps)"
    assert stragglers.too_few_text(got) == "too few steps for a culprit (8 of the 20 it needs)"



def test_collectives_on_every_rank_only_and_ties_go_to_the_lowest_rank():
    """Ranks that sent the same AllReduces are read column by column; a rank that sent one
    more (or one fewer) leaves only those on every rank, in the first rank's order, with the
    same figures; of ranks ready at once, the lowest is the last arriver."""
    same = {r: batch(r, {0: (0, 10)}, [(0, 12, 20), (1, 15 if r else 14, 30)]) for r in range(3)}
    cols = stragglers.collectives(same)
    assert [(c.idx, c.nth, c.last) for c in cols] == [(0, 0, 0), (1, 0, 1)]  # 3 ranks tied at 12 ms: rank 0
    assert cols[1].ready == {0: 10**12 + 14 * MS, 1: 10**12 + 15 * MS, 2: 10**12 + 15 * MS}
    odd = dict(same)
    odd[2] = batch(2, {0: (0, 10)}, [(2, 11, 13), (1, 15, 30), (0, 12, 20)])  # another bucket first
    got = stragglers.collectives(odd)
    assert [(c.idx, c.nth, c.last, c.ready, c.end) for c in got] == \
        [(c.idx, c.nth, c.last, c.ready, c.end) for c in cols]
    fewer = {0: same[0], 1: batch(1, {0: (0, 10)}, [(1, 15, 30)])}
    assert [(c.idx, c.last) for c in stragglers.collectives(fewer)] == [(1, 1)]

def test_clock_mapping_is_a_separate_step():
    """Per-host offsets plug in through to_common: a rank 5 ms behind on its own clock."""
    b0 = batch(0, {0: (0, 10)}, [(0, 10, 20)])
    b1 = batch(1, {0: (0, 10)}, [(0, 5, 15)])
    plain = stragglers.step_waits({0: b0, 1: b1}, step_ms=30)
    fixed = stragglers.step_waits({0: b0, 1: b1}, step_ms=30,
                         to_common=lambda r, ns: ns + 5 * MS if r == 1 else ns)
    assert plain.wait_ms[1] == pytest.approx(5) and fixed.wait_ms == {0: 0.0, 1: 0.0}


def test_slow_rank_option_parsing():
    assert spec.parse_slow_rank("1:40:fc2", "medium", 2) == (1, 40.0, 1)
    assert spec.parse_slow_rank("0:5", "medium", 2) == (0, 5.0, 2)  # the middle layer, fc3
    for bad in ("1", "x:40", "1:abc", "2:40", "1:40:fc9", "1:-5", "1:nan"):
        with pytest.raises(ValueError):
            spec.parse_slow_rank(bad, "medium", 2)


@pytest.mark.slow
@pytest.mark.serial  # arrival order and per-layer times: a neighbour test's ranks would blur them
def test_slow_rank_is_found_on_two_real_ranks(tmp_path):
    """2 CPU ranks, small, rank 1's fc2 backward 80 ms longer: naive and DDP name rank 1 and
    fc2; rank 0 waits ~80 ms a step, rank 1 hardly at all. The JSON carries the figures.
    (80 ms, not 40: two CPU ranks on two cores take turns being late by 10-90 ms, and the
    trace's per-step check below read 12 of 22 steps with 40 in a fresh clone's CI. small, not
    medium: the same layers' evidence at a fifth of the compute, this test running alone.)"""
    import json

    from .helpers import run_cli

    out, rec, trace = tmp_path / "s.json", tmp_path / "s.ddptui", tmp_path / "t.json"
    # (21 steps: no culprit is named before a full window of 20 steps with collectives, step 0 not one)
    r = run_cli("--headless", "--gpus", "2", "--model", "small", "--strategies", "naive,ddp",
                "--steps", "21", "--batch-size", "256", "--slow-rank", "1:80:fc2", "--record", str(rec),
                "--json", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "who waits for whom" in r.stdout and "culprit rank 1 · fc2 backward" in r.stdout
    doc = json.loads(out.read_text())
    for s in doc["strategies"]:
        st = s["stragglers"]
        # (measured with 40 ms on an idle 2-core machine: 100 %, rank 0 waits 40 ms, rank 1 under 1.1 ms;
        # other work on the machine delays rank 0 now and then (73 % seen with a test suite
        # beside it): the bounds leave room for that; the culprit comes from per-layer evidence)
        assert st["last_arriver_rank"] == 1 and st["last_arriver_pct"] >= 60, (s["strategy"], st)
        assert st["wait_ms_median"]["0"] >= 30, (s["strategy"], st)  # ~80 on a quiet machine
        # (rank 1 waits for rank 0 now and then too: 11 ms was seen beside rank 0's ~80)
        assert st["wait_ms_median"]["1"] < 20 and st["wait_ms_median"]["1"] * 3 < st["wait_ms_median"]["0"], \
            (s["strategy"], st)
        assert st["culprit_layer"] == "fc2", (s["strategy"], st)
    # the Chrome trace carries who waited: per step, rank 0's longest wait is on rank 1 (in
    # most steps: the cores' own turns at being late flip some, as for the arrival order
    # above; with a 40 ms straggler, 15 and 12 of 22 were seen in fresh clones' CI)
    assert run_cli("export", str(rec), "-o", str(trace), timeout=120).returncode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    waits: dict = {}
    for e in events:
        a = e.get("args", {})
        if e.get("ph") == "X" and "wait_us" in a and a["rank"] == 0 and a["step"] > 0:
            key = (a["strategy"], a["step"])
            if key not in waits or a["wait_us"] > waits[key][0]:
                waits[key] = (a["wait_us"], a["last_arriver"])
    assert waits and sum(1 for w, who in waits.values() if w > 20_000 and who == 1) >= 0.6 * len(waits), waits


def test_slow_rank_bad_values_are_one_line(tmp_path):
    from .helpers import run_main
    for bad, needle in (("5:40", "not one of the run's ranks"), ("1:40:fc9", "no layer"),
                        ("1:x", "number of ms")):
        r = run_main("--headless", "--gpus", "2", "--slow-rank", bad, "--no-record")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.asyncio
async def test_d_key_switches_a_straggler_on_every_rank_of_a_real_run():
    """The live app on 2 real CPU ranks: `d` puts a straggler on rank 1 (small's middle layer,
    fc2) at one agreed step — the timeline marks it —, the per-layer evidence names it within
    20 steps (headline and waits panel), the waits figures name rank 1; `d` again switches it
    off."""
    import asyncio
    import time

    from ddptui.ui.app import DdpApp
    from ddptui.live.launcher import plan
    from ddptui.live.session import LiveRun, RunOptions
    from ddptui.ui.widgets import waits

    from .helpers import assert_no_leftovers

    run = LiveRun(RunOptions(model="small", strategies=["naive", "ddp"], steps=0, batch_size=1024,
                             record=None), plan(2, None, "cpu"))
    app = DdpApp(run)

    async def until(check, timeout, what):
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.2)

    try:
        async with app.run_test(size=(160, 45)) as pilot:
            st = run.store
            # (six steps before the change: the onset is estimated against the steps before it,
            # and two CPU ranks take turns being late in the first few: with three, a fresh
            # clone's CI once saw the onset put at the run's first step, 3 before the change)
            await until(lambda: len(st.complete_steps("ddp")) >= 6, 90, "six DDP steps")
            await pilot.press("d")
            await until(lambda: len(st.slow_changes) >= 1, 30, "the straggler to be applied")
            k, ms, rank, layer = st.slow_changes[0]
            assert ms > 0 and rank == 1 and layer == 1

            def named_by_evidence(strategy):
                ev = (st.summary(strategy)["stragglers"] or {}).get("evidence") or {}
                c = ev.get("culprit")
                return c is not None and (c["rank"], c["layer"], c["pass"]) == (1, "fc2", "backward")

            # the per-layer evidence names the change within 20 steps (and a poll or two)
            for s in ("naive", "ddp"):
                await until(lambda: named_by_evidence(s), 240, f"{s}: evidence naming rank 1 · fc2")
                assert st.latest_complete(s) - k <= 22, (s, k, st.latest_complete(s))
                ev = st.summary(s)["stragglers"]["evidence"]
                assert abs(ev["onset_step"] - k) <= 2 and ev["detection_steps"] <= 20, (s, ev)
            assert waits.culprit_gist(st, {}).startswith("rank 1 · fc2 backward +")

            def headline_names_it():  # (the headline reads the steps on screen: a frame behind)
                app.redraw()
                return "slow: rank 1 · fc2 backward +" in app.headline.render_line(0).text
            await until(headline_names_it, 15, "the headline to name rank 1 · fc2")
            await until(lambda: (st.latest_complete("ddp") or 0) >= k + 20, 120, "20 steps with the straggler")
            since = [w for w in st.recent_waits("ddp", n=1000) if w is not None and w.step > k][-20:]
            got = stragglers.summarize(since, spec.layer_names("small"))
            assert got["last_arriver_rank"] == 1, got
            # the steps that clearly had a culprit name rank 1's fc2 (small steps: the delay is
            # half of one, so a busy core now and then hides it: 7 of 9 in 10 steps under the
            # suite's load once; over 20 the share holds, where a broken culprit would be ~half)
            named = [w.culprit[:2] for w in since if w.culprit]
            assert len(named) >= 12 and sum(1 for c in named if c == (1, 1)) >= 0.7 * len(named), named
            view = st.view("ddp", k)
            assert view.marks and view.marks[0].startswith("straggler rank 1 fc2")
            await pilot.press("d")
            await until(lambda: len(st.slow_changes) >= 2, 30, "the straggler to be switched off")
            assert st.slow_changes[1][1] == 0
            await pilot.press("q")
    finally:
        if run.state in ("running", "starting"):
            run.stop("test ended")
    assert_no_leftovers(15)


def test_waits_panel_header_keeps_whole_clauses():
    """The panel's title line says as many of its clauses as fit the width, each whole."""
    from ddptui.recording.synthetic import SyntheticSource
    from ddptui.ui.widgets import waits
    src = SyntheticSource(steps=12, world=2, model="small")
    full = "".join(t for t, _ in waits.build(src.store, {}, 400, 6)[0])
    assert full.endswith("· transfer: once all are ready")
    clauses = full.split(" · ")
    for width in (30, 60, 80, 100, 140):
        head = "".join(t for t, _ in waits.build(src.store, {}, width, 6)[0])
        assert len(head) <= width and head.split(" · ") == clauses[:len(head.split(" · "))], (width, head)
    assert "".join(t for t, _ in waits.build(src.store, {}, 80, 6)[0]).endswith("steps")
