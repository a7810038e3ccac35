"""What if with contention (ddptui.model.whatif: Contention, fit_contention, contended): the
backward's slowdown while a collective overlaps it, fitted from backward spans with and without
one, taken out of the recorded step and put back where a plan overlaps it; on hand-checkable
steps, on the demo recording and through `ddptui whatif`."""
from __future__ import annotations

import os

import pytest

from ddptui.model import whatif as W
from ddptui.recording.loader import load

from .helpers import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "demo", "cpu-medium-2ranks.ddptui")
MB = W.MIB


def _step(bwd0: float, colls: list[W.Coll]) -> dict[int, W.RankTimeline]:
    """Two ranks alike: forward 0-3, layer 1's backward 3-8, layer 0's 8-(8 + bwd0), 1 ms of tail."""
    out = {}
    for r in (0, 1):
        end0 = 8.0 + bwd0
        last = max([end0] + [c.end for c in colls])
        out[r] = W.RankTimeline(r, 0.0, last + 1.0, [(0.0, end0)], {1: 8.0, 0: end0},
                                [W.Coll(c.idx, c.ready, c.start, c.end) for c in colls],
                                bwd_span={1: (3.0, 8.0), 0: (8.0, end0)})
    return out


def _basis() -> W.Basis:
    """Interleaved, one collective per parameter: parameter 1's runs 8-20 over layer 0's backward,
    which lasts 10 ms; in the reference step (no overlap) it lasts 5."""
    steps = [_step(10.0, [W.Coll(1, 8.0, 8.0, 20.0), W.Coll(0, 18.0, 20.0, 22.0)]) for _ in range(3)]
    ref = _step(5.0, [W.Coll(1, 8.0, 13.0, 15.0), W.Coll(0, 13.0, 15.0, 17.0)])
    return W.Basis("interleaved", 2, 1, "gloo", [MB, MB], [0, 1], None, False, None, [2, 3, 4], steps,
                   [{0: MB, 1: MB}] * 3, reference=[ref], ref_bytes_of=[{}])


def test_the_slowdown_is_fitted_from_the_same_layer_with_and_without_an_overlapping_collective():
    b = _basis()
    c = W.fit_contention(b)
    assert c.bwd_per_ms == pytest.approx(0.5)  # (10 - 5) ms over 10 ms overlapped
    assert (c.layers, c.with_spans, c.without_spans) == (1, 6, 2) and not c.note
    # the recorded backward less the slowdown its overlap caused: 5 ms, what the reference shows
    assert W.bare_backward(b.traces[0][0], c.bwd_per_ms) == {1: 5.0, 0: 5.0}


def test_a_plan_that_changes_the_overlap_changes_the_backward():
    b = _basis()
    c = W.fit_contention(b)
    d = W.Delays({}, {})
    instant = W.CommFit(0.0, 0.0, 0, 0.0, 2)
    # instant collectives: nothing overlaps, the backward is its bare 5 ms (recorded: 10)
    assert W.predict(b, instant, delays=d, contention=c).step_ms == pytest.approx(3 + 5 + 5 + 1)
    assert W.predict(b, instant, delays=d).step_ms == pytest.approx(3 + 5 + 10 + 1)
    # 4 ms collectives: parameter 1's runs 8-12 over layer 0's backward, which takes 5 + 0.5 x 4
    # = 7 ms (8-15); parameter 0's then runs 15-19
    four = W.CommFit(4.0, 0.0, 0, 0.0, 2)
    p = W.predict(b, four, delays=d, contention=c)
    assert p.step_ms == pytest.approx(19 + 1)
    assert p.exposed_ms == pytest.approx(4.0)
    assert W.predict(b, four, delays=d).step_ms == pytest.approx(3 + 5 + 10 + 4 + 1)


def test_no_layer_seen_both_ways_means_no_contention_and_says_so():
    b = _basis()
    b.reference = []
    c = W.fit_contention(b)
    assert c.bwd_per_ms == 0.0 and c.layers == 0 and "no layer" in c.note
    assert not c.on


@pytest.fixture(scope="module")
def demo():
    return load(DEMO).store


def test_on_the_demo_recording(demo):
    """A real gloo run (naive and DDP taking turns, 2 CPU ranks): DDP's backward overlapped by its
    buckets against the same layers' in naive's steps (never overlapped)."""
    b = W.collect(demo, "ddp")
    assert b.reference  # naive's steps
    fit = W.fit_comm(b)
    c = W.fit_contention(b, fit)
    assert c.layers >= 1 and 0.02 < c.bwd_per_ms < W.K_MAX
    d = W.fit_delays(b)
    m = W.measured(demo, "ddp", b.cap_mb)
    src = W.predict(b, fit, delays=d, contention=c)
    assert src.step_ms == pytest.approx(m["step_ms"], rel=0.1)  # the source replayed
    # one bucket after the backward: no overlap left, the backward faster than recorded
    big = W.predict(b, fit, cap_mb=100.0, delays=d, contention=c)
    asis = W.predict(b, fit, cap_mb=100.0, delays=d)
    assert big.no_comm_step_ms < asis.no_comm_step_ms - 1.0
    assert big.step_ms < asis.step_ms


def test_the_verb_prints_the_contention_fit(tmp_path):
    got = run_main("whatif", DEMO, "--bucket-cap", "25,100", "--json", str(tmp_path / "w.json"))
    assert got.returncode == 0, got.stderr
    assert "contention, fitted to the recording: backward +" in got.stdout
    import json
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["fit"]["contention"]["bwd_per_ms"] > 0
    got = run_main("whatif", DEMO, "--bucket-cap", "25", "--no-contention", "--call-us", "50")
    assert got.returncode == 0, got.stderr
    assert "contention" not in got.stdout and "per-call host cost 50 µs" in got.stdout


def test_a_collective_slowed_by_the_compute_under_it():
    """alpha and beta from the collectives nothing overlapped (1 MB: 2 ms, 2 MB: 3 ms), the
    slowdown from the 2 MB one that ran 8-16 over 8 ms of backward: (8 - 3) / 8 ms per ms."""
    steps = [_step(10.0, [W.Coll(1, 8.0, 8.0, 16.0), W.Coll(0, 18.0, 18.0, 20.0)]) for _ in range(3)]
    ref = _step(5.0, [W.Coll(1, 8.0, 13.0, 16.0), W.Coll(0, 13.0, 16.0, 18.0)])
    b = W.Basis("interleaved", 2, 1, "gloo", [MB, 2 * MB], [0, 1], None, False, None, [2, 3, 4], steps,
                [{0: MB, 1: 2 * MB}] * 3, reference=[ref], ref_bytes_of=[{0: MB, 1: 2 * MB}])
    fit = W.fit_comm(b, contention=True)
    assert fit.alpha_ms == pytest.approx(1.0) and fit.beta_ms_per_mb == pytest.approx(1.0)
    assert fit.coll_per_ms == pytest.approx(5 / 8)
    assert W.fit_comm(b).coll_per_ms == 0.0  # asked for only
    # replayed with no backward contention (none fitted here: the 2 MB bucket's slowdown alone),
    # the 2 MB collective takes 3 + 5/8 x the compute under it again
    c = W.Contention()
    p = W.predict(b, fit, delays=W.Delays({}, {}), contention=c)
    q = W.predict(b, fit, delays=W.Delays({}, {}))
    assert p.comm_ms > q.comm_ms


def test_a_collective_whose_edge_touches_the_compute_counts_as_one_with_none_under_it():
    """As recorded, a collective run after the backward starts a little before the backward's
    last span ends (0.05–0.1 ms of a 2–3 ms collective): still one with no compute under it
    (at most OFF_FRAC of its time), so alpha and beta come from those, and the slowdown from
    the one that ran under 8 ms of backward (before: only exact zeros counted, none here, and
    the line through every collective, the slowed one included, was taken)."""
    steps = [_step(10.0, [W.Coll(1, 8.0, 8.0, 16.0), W.Coll(0, 17.95, 17.95, 19.95)]) for _ in range(3)]
    ref = _step(5.0, [W.Coll(1, 8.0, 12.9, 15.9), W.Coll(0, 13.0, 15.9, 17.9)])
    b = W.Basis("interleaved", 2, 1, "gloo", [MB, 2 * MB], [0, 1], None, False, None, [2, 3, 4], steps,
                [{0: MB, 1: 2 * MB}] * 3, reference=[ref], ref_bytes_of=[{0: MB, 1: 2 * MB}])
    assert 0 < 0.1 <= W.OFF_FRAC * 3.0  # (the reference's 2 MB one: 0.1 ms under compute)
    fit = W.fit_comm(b, contention=True)
    assert fit.alpha_ms == pytest.approx(1.0) and fit.beta_ms_per_mb == pytest.approx(1.0)
    assert fit.coll_per_ms == pytest.approx(5 / 8)
