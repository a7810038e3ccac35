"""The per-layer evidence of a slow rank (ddptui/model/evidence.py): the sign test's bound, the
excess against the other ranks' median, and synthetic runs with an injected slow layer and
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


def test_need_steps_keeps_the_bound():
    # 20 steps, 20 one-sided tests (2 ranks x medium's 10 sections): 18 of 20 keep it under 1 %
    assert evidence.need_steps(20, 20) == 18
    assert 20 * evidence.binom_tail(20, 18) <= evidence.ALPHA < 20 * evidence.binom_tail(20, 17)
    assert evidence.binom_tail(20, 20) == pytest.approx(2 ** -20)
    assert evidence.need_steps(5, 20) is None  # 5 steps cannot say anything at 1 %
    assert evidence.need_steps(20, 10240) == 20  # 1,024 ranks: every step


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
    out = []
    for k, secs in enumerate(rows):
        e, ref = evidence.step_excess(secs)
        out.append((k, e, ref))
    return out


def test_judge_names_a_steady_excess_not_spikes():
    f, b = (FWD, 0), (BWD, 0)
    steady = [{0: {f: 10.0, b: 20.0}, 1: {f: 10.0 + (k % 3 - 1) * 0.1, b: 60.0 + k % 2}} for k in range(20)]
    v = evidence.judge(window_of(steady))
    assert v.culprit.rank == 1 and v.culprit.section == b and v.culprit.excess_ms == pytest.approx(40.5, abs=0.6)
    assert v.culprit.slower == 20 and v.tests == 4 and v.need == 17 and v.bound <= evidence.ALPHA
    # huge but rare: rank 1 80 ms late in 8 steps of 20, slightly faster otherwise
    spikes = [{0: {f: 10.0, b: 20.0}, 1: {f: 10.0, b: 100.0 if k % 5 < 2 else 19.0}} for k in range(20)]
    assert evidence.judge(window_of(spikes)).culprit is None
    # steady but small: 1 ms over a 20 ms section (under MIN_EXCESS_MS)
    small = [{0: {b: 20.0}, 1: {b: 21.0}} for _ in range(20)]
    v = evidence.judge(window_of(small))
    assert v.culprit is None and v.excess_ms[1][b] == 1.0


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
    assert ev["need_steps"] == 18 and ev["false_alarm_bound"] <= 0.01
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
