"""The per-layer evidence of a slow rank (ddptui/model/evidence.py): a section's cost read from a
rank's fast steps, the excess against the other ranks' median, and synthetic runs with an injected slow layer and
noise like two ranks sharing busy cores (one rank or the other 10-90 ms late in a random
layer, in half of the steps)."""
from __future__ import annotations

import pytest

from ddptui.model import evidence
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun, SyntheticSource, fill_store
from ddptui.ui.widgets import headline, waits
from ranks.wire import BWD, FWD

NOISE = (0.5, 10.0, 90.0)  # half the steps: a random rank's random layer 10-90 ms late


def noisy_store(model="medium", world=2, steps=60, slow=None, slow_from=0, seed=1, strategies=("naive", "ddp")):
    store = Store()
    fill_store(store, SyntheticRun(model, world, strategies, seed=seed, slow=slow, slow_from=slow_from,
                                   late=NOISE), steps)
    return store


def test_fast_time_and_consistency_count():
    vals = [float(v) for v in range(100, 120)]  # 20 steps
    assert evidence.fast_time(vals) == 102.0  # the 3rd fastest of 20
    assert evidence.fast_time(list(reversed(vals)) + [5.0]) == 101.0  # 21 values, one very fast
    assert evidence.fast_time([7.0]) == 7.0
    assert evidence.need_steps(20) == 12 and evidence.need_steps(10) == 6 and evidence.need_steps(1) == 1


def test_excess_is_against_the_other_ranks_median():
    s = (BWD, 1)
    exc, ref = evidence.step_excess({0: {s: 10.0}, 1: {s: 12.0}, 2: {s: 50.0}, 3: {s: 11.0}})
    assert exc[2][s] == 50 - 11  # others: 10, 11, 12
    assert exc[0][s] == 10 - 12  # others: 11, 12, 50 -> 12
    assert exc[1][s] == 12 - 11  # others: 10, 11, 50 -> 11
    assert ref[s] == 11.5
    exc, _ = evidence.step_excess({0: {s: 10.0}, 1: {s: 25.0}})
    assert exc == {0: {s: -15.0}, 1: {s: 15.0}}


def window_of(rows):
    return [(k, evidence.flatten(secs), evidence.step_excess(secs)[0]) for k, secs in enumerate(rows)]


def test_judge_names_a_steady_excess_not_spikes():
    f, b = (FWD, 0), (BWD, 0)
    steady = [{0: {f: 10.0, b: 20.0}, 1: {f: 10.0 + (k % 3 - 1) * 0.1, b: 60.0 + k % 2}} for k in range(20)]
    v = evidence.judge(window_of(steady))
    assert v.culprit.rank == 1 and v.culprit.section == b and v.culprit.excess_ms == pytest.approx(40.5, abs=0.6)
    assert v.culprit.slower == 20 and v.tests == 4 and v.need == 12 and v.culprit.ref_ms == 20.0
    # huge but rare: rank 1 80 ms late in 8 steps of 20, slightly faster otherwise
    spikes = [{0: {f: 10.0, b: 20.0}, 1: {f: 10.0, b: 100.0 if k % 5 < 2 else 19.0}} for k in range(20)]
    assert evidence.judge(window_of(spikes)).culprit is None
    # steady but small: 1 ms over a 20 ms section (under MIN_EXCESS_MS)
    small = [{0: {b: 20.0}, 1: {b: 21.0}} for _ in range(20)]
    v = evidence.judge(window_of(small))
    assert v.culprit is None and v.excess_ms[1][b] == 1.0
    # steady, over 5 ms, but 18 % of the section (under MIN_EXCESS_REL)
    v = evidence.judge(window_of([{0: {b: 100.0}, 1: {b: 118.0}} for _ in range(20)]))
    assert v.culprit is None and v.excess_ms[1][b] == 18.0
    v = evidence.judge(window_of([{0: {b: 100.0}, 1: {b: 122.0}} for _ in range(20)]))
    assert v.culprit.excess_ms == 22.0


def test_a_section_missing_from_a_step_is_not_judged_the_rest_is():
    f, b = (FWD, 0), (BWD, 0)
    rows = [{0: {f: 10.0, b: 20.0}, 1: {f: 50.0, b: 60.0}} for _ in range(20)]
    del rows[7][1][f]  # rank 1's forward not measured in one step
    v = evidence.judge(window_of(rows))
    assert [(x.rank, x.section) for x in v.findings] == [(1, b)]
    assert v.tests == 2 and v.excess_ms == {0: {b: -40.0}, 1: {b: 40.0}}


def test_slow_rank_named_although_the_others_preemptions_make_it_faster_now_and_then():
    """Rank 1 is 40 ms slower in every step, but rank 0 loses 60-90 ms to another process in
    6 steps of 20: rank 1 is slower in only 14 of 20 steps (a sign test at 1 % needs 18),
    while its fast steps still say +40 ms."""
    b = (BWD, 1)
    rows = []
    for k in range(20):
        r0 = 130.0 + (k % 4) + (60.0 + k if k % 10 in (1, 4, 7) else 0.0)
        rows.append({0: {b: r0}, 1: {b: 170.0 + (k % 3)}})
    v = evidence.judge(window_of(rows))
    assert v.culprit is not None and v.culprit.rank == 1 and v.culprit.section == b
    assert v.culprit.slower == 14 and v.culprit.excess_ms == pytest.approx(40.0, abs=1.0)
    # the same, and rank 1 itself also loses time now and then: still +40 from its fast steps
    for k in (2, 9, 15):
        rows[k][1][b] += 70.0
    v = evidence.judge(window_of(rows))
    assert v.culprit.rank == 1 and v.culprit.excess_ms == pytest.approx(40.0, abs=1.0)


@pytest.mark.parametrize("strategy", ["naive", "ddp"])
def test_slow_layer_named_through_noise(strategy):
    store = noisy_store(slow=(1, 1, 40.0), steps=60, strategies=(strategy,))
    st = store.summary(strategy)["stragglers"]
    ev = st["evidence"]
    assert st["culprit"] == "rank 1 · fc2 backward +40 ms" and st["culprit_from"] == "layers"
    assert st["culprit_rank"] == 1 and st["culprit_layer"] == "fc2"
    assert ev["culprit"]["excess_ms"] == pytest.approx(40, abs=2)
    # every 20-step window of steps 1..59 names it, nothing else
    assert ev["windows"] == 40 and ev["windows_naming_culprit"] == ev["windows"] == ev["windows_named"]
    assert ev["excess_ms"]["1"]["fc2 backward"] == pytest.approx(40, abs=2)
    assert abs(ev["excess_ms"]["0"]["fc1 forward"]) < 2
    assert ev["need_steps"] == 12 and ev["fast_quantile"] == evidence.FAST_QUANTILE
    # there from the start: detected once the first window is full
    assert ev["onset_step"] == 1 and ev["detected_step"] == 20 and ev["detection_steps"] == 19


@pytest.mark.parametrize("model", ["small", "medium"])
def test_quiet_without_a_slow_rank(model):
    """No delay, the same noise: no window of 20 names anyone (>= 100 windows per strategy)."""
    for seed in (1, 2):
        store = noisy_store(model, steps=130, seed=seed)
        for s in ("naive", "ddp"):
            st = store.summary(s)["stragglers"]
            assert st["evidence"]["windows"] >= 100
            assert st["evidence"]["windows_named"] == 0, (model, seed, s, st["evidence"]["findings"])
            assert st["culprit"] == ""


def test_change_detected_within_20_steps():
    store = noisy_store(slow=(0, 3, 40.0), slow_from=40, steps=80)
    for s in ("naive", "ddp"):
        ev = store.summary(s)["stragglers"]["evidence"]
        assert ev["culprit"]["text"] == "rank 0 · fc4 backward +40 ms"
        assert 40 <= ev["detected_step"] <= 40 + 19 and abs(ev["onset_step"] - 40) <= 1
        assert ev["detection_steps"] <= 20 and ev["detection_s"] > 0
        assert ev["windows_named"] == ev["windows_naming_culprit"] <= 80 - 40


def test_many_ranks_one_slow():
    store = noisy_store("small", world=16, steps=30, slow=(11, 2, 30.0), strategies=("ddp",))
    st = store.summary("ddp")["stragglers"]
    assert st["culprit"] == "rank 11 · fc3 backward +30 ms"
    assert set(st["evidence"]["excess_ms"]) == {str(r) for r in range(16)}


def test_waits_panel_and_headline_name_it():
    src = SyntheticSource(steps=0, model="medium")
    src.run.slow, src.run.late = (1, 1, 40.0), NOISE
    src.add_steps(30)
    shown = {"naive": None, "ddp": None}
    text = "".join(t for line in waits.build(src.store, shown, 160, 6) for t, _ in line)
    assert "culprit rank 1 · fc2 backward +40 ms" in text
    gist = waits.culprit_gist(src.store, shown)
    assert gist == "rank 1 · fc2 backward +40 ms"
    line, _ = headline.headline({"ddp_vs_naive": 1.5}, {"ddp": 40.0}, 100, gist)
    assert line.endswith("· slow: rank 1 · fc2 backward +40 ms") and line.startswith("DDP 1.50× faster")
    line, verdict = headline.headline({"ddp_vs_naive": 1.5}, {"ddp": 40.0}, 40, gist)
    assert line == "slow: rank 1 · fc2 backward +40 ms" and verdict == "bad"
    quiet = SyntheticSource(steps=30, model="medium")
    assert waits.culprit_gist(quiet.store, shown) == ""


def test_no_verdict_before_a_full_window():
    """A few steps of two ranks on busy cores name anyone (a live xlarge run read "slow: rank 0
    · fc5 backward +35 ms" at step 2, gone by step 18): until a window of evidence.WINDOW
    steps is full, nothing is named, even a real 40 ms straggler; the waits panel, the headline
    and the headless line say how far the evidence is instead. At 20 steps it is named."""
    from ddptui.reports.report import straggler_line

    src = SyntheticSource(steps=0, model="medium")
    src.run.slow, src.run.late = (1, 1, 40.0), NOISE
    src.add_steps(10)  # steps 1..9 have collectives to judge (step 0 is never judged)
    shown = {"naive": None, "ddp": None}
    for s in ("naive", "ddp"):
        st = src.store.summary(s)["stragglers"]
        assert st["culprit"] == "" and st["culprit_rank"] is None and st["culprit_from"] is None, st
        assert st["gathering"] and (st["evidence_steps"], st["window_steps"]) == (9, evidence.WINDOW)
        assert st["evidence"]["culprit"] is None and st["evidence"]["findings"] == []
        line = straggler_line({"strategy": s, "stragglers": st})
        # (the report is at the end of a run: more steps will not come)
        assert line.endswith("· too few steps for a culprit (9 of the 20 it needs)"), line
        assert "gathering" not in line
    text = "".join(t for line in waits.build(src.store, shown, 160, 6) for t, _ in line)
    assert "culprit rank" not in text and text.count("gathering evidence (9/20 steps)") == 2, text
    assert waits.culprit_gist(src.store, shown) == "" and waits.compact(src.store, shown) == ""
    assert waits.culprit_rank(src.store, shown, "ddp") is None
    note = waits.gathering(src.store, shown)
    assert note == "gathering evidence (9/20 steps)"
    line, verdict = headline.headline({"ddp_vs_naive": 1.5}, {"ddp": 40.0}, 120, "", note)
    assert line == "DDP 1.50× faster than naive — 40 % of communication hidden behind backward · " \
        "gathering evidence (9/20 steps)" and verdict == "good"
    line, _ = headline.headline({"ddp_vs_naive": 1.5}, {"ddp": 40.0}, 60, "", note)
    assert "slow" not in line and line.startswith("DDP 1.50× faster")  # the figures first
    src.add_steps(11)  # 20 steps judged: a full window
    st = src.store.summary("ddp")["stragglers"]
    assert not st["gathering"] and st["culprit"] == "rank 1 · fc2 backward +40 ms"
    assert waits.gathering(src.store, shown) == ""
    assert waits.culprit_gist(src.store, shown) == "rank 1 · fc2 backward +40 ms"


def test_median_of_the_others_matches_the_plain_definition():
    import random
    from statistics import median
    rng = random.Random(3)
    s = (BWD, 0)
    for n in range(3, 12):
        for t in range(200):  # ties (few distinct values) and no ties
            vals = {r: {s: float(rng.choice([1, 2, 3, 5, 8])) if t % 2 else rng.random()} for r in range(n)}
            exc, ref = evidence.step_excess(vals)
            for r in range(n):
                others = [vals[q][s] for q in range(n) if q != r]
                assert exc[r][s] == pytest.approx(vals[r][s] - median(others), abs=1e-12), (n, t, r)
            assert ref[s] == median(v[s] for v in vals.values())
