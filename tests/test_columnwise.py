"""The figures of a step for every rank at once (ddptui/model/columnwise.py) against the
rank-by-rank figures (figures.rank_step, stragglers.step_waits), value for value: synthetic
runs of 2 to 64 ranks with late ranks, an injected straggler, other collectives (all_to_all,
FSDP's all-gathers and reduce-scatters), and the recordings in demo/ and tests/data."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ddptui.model import columnwise, figures, stragglers
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun
from tests.helpers import ROOT


def _store(run: SyntheticRun, steps: int) -> Store:
    store = Store()
    for f in run.header_frames():
        store.ingest(f)
    for k in range(steps):
        for f in run.step_frames(k):
            store.ingest(f)
    return store


def _both(store: Store) -> int:
    """Every complete step of every strategy both ways; returns how many went column-wise."""
    stacked = 0
    for strategy, steps in store.span_batches().items():
        want = store.expected_ranks(strategy)
        for k, ranks in steps.items():
            if len(ranks) < want:
                continue
            ranks = dict(sorted(ranks.items()))
            comm = {r: (store.comm_bytes_fn(strategy, r, k), store.coll_row_fn(strategy, r)) for r in ranks}
            rs = {r: figures.rank_step(b, *comm[r], want) for r, b in ranks.items()}
            step_ms = figures.combine(k, list(rs.values())).step_ms
            sw = stragglers.step_waits(ranks, step_ms)
            place = columnwise.usable(ranks)
            if place is None:
                continue
            stacked += 1
            st = columnwise.Stacked(ranks, place)
            assert columnwise.rank_steps(st, comm, want) == rs, (strategy, k)
            assert columnwise.hta_steps(st, rs) == {r: figures.hta_step(b, rs[r]) for r, b in ranks.items()}
            cw = columnwise.step_waits(st, step_ms)
            if sw is None:
                assert cw is None
                continue
            for field in ("wait_ms", "caused_ms", "transfer_ms", "last_arriver", "culprit",
                          "layer_excess_ms", "step", "t_ns"):
                assert getattr(cw, field) == getattr(sw, field), (strategy, k, field)
            assert [(c.key, c.ready, c.end, c.last, c.last_ready) for c in cw.collectives] == \
                   [(c.key, c.ready, c.end, c.last, c.last_ready) for c in sw.collectives], (strategy, k)
            assert cw.batches == sw.batches
            from ddptui.model import evidence
            secs = evidence.step_sections(ranks)
            flat, excess, ref = columnwise.sections_excess(ranks)
            assert flat == evidence.flatten(secs) and (excess, ref) == evidence.step_excess(secs), (strategy, k)
            assert columnwise.bucket_step(list(ranks.values())) == figures.bucket_step(list(ranks.values()))
    return stacked


@pytest.mark.parametrize("world,strategies,kw", [
    (2, ("naive", "interleaved", "ddp", "single"), {}),
    (8, ("naive", "ddp"), {"late": (0.5, 10.0, 90.0)}),
    (33, ("naive", "ddp"), {"slow": (5, 1, 40.0), "late": (0.3, 5.0, 60.0)}),
    (4, ("ddp", "fsdp"), {"a2a_after": 1, "late": (0.5, 10.0, 90.0)}),
    (64, ("fsdp",), {"slow": (7, 2, 30.0)}),
])
def test_column_wise_figures_equal_rank_by_rank(world, strategies, kw):
    run = SyntheticRun("medium", world, strategies, seed=world, **kw)
    store = _store(run, 12)
    assert _both(store) >= 12 * len([s for s in strategies if s != "single"])


@pytest.mark.parametrize("path", ["demo/cpu-medium-2ranks.ddptui", "demo/cpu-small-2ranks.ddptui",
                                  "tests/data/user-transformer-2ranks.ddptui"])
def test_column_wise_figures_equal_on_recordings(path):
    from ddptui.recording.loader import load
    got = load(os.path.join(ROOT, path))
    assert _both(got.store) > 0


def test_union_lengths_row_by_row():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(0, 9))
        s = rng.integers(0, 1000, size=(5, n))
        e = s + rng.integers(-50, 300, size=(5, n))  # (empty and reversed intervals too)
        got = columnwise.union_lengths(s.astype(np.int64), e.astype(np.int64)).tolist()
        want = [figures.union_length(list(zip(s[i].tolist(), e[i].tolist()))) if n else 0 for i in range(5)]
        assert got == want


def test_wait_medians_of_many_ranks_equal_statistics_median():
    from statistics import median

    from ddptui.model import stragglers
    run = SyntheticRun("small", 96, ("ddp",), seed=5, late=(0.5, 10.0, 90.0))
    store = _store(run, 9)
    store.update()
    steps = [store.waits["ddp"][k] for k in sorted(store.waits["ddp"])]
    ranks = sorted(steps[0].wait_ms)
    got = stragglers._wait_medians(steps, ranks)
    assert got == {str(r): round(median(s.wait_ms.get(r, 0.0) for s in steps), 3) for r in ranks}


@pytest.mark.parametrize("ranks,slow", [(2, None), (3, (1, (1, 2))), (256, (37, (1, 2))), (512, None)])
def test_a_window_judged_column_wise_equals_rank_by_rank(monkeypatch, ranks, slow):
    """evidence.judge over many ranks (numpy) gives the verdict the rank-by-rank way gives,
    value for value: findings, their figures, every rank's excess."""
    import random

    from ddptui.model import evidence as E
    rng = random.Random(ranks)
    secs = [(0, i) for i in range(4)] + [(1, i) for i in range(4)]
    window = []
    for k in range(20):
        sections = {r: {s: rng.gauss(10, 1) + (40.0 if slow and (r, s) == slow else 0.0)
                        for s in secs} for r in range(ranks)}
        ex, _ = E.step_excess(sections)
        window.append((k, E.flatten(sections), ex))
    monkeypatch.setattr(E, "COLUMNWISE_FROM", 0)
    fast = E.judge(window)
    monkeypatch.setattr(E, "COLUMNWISE_FROM", 10 ** 9)
    slow_way = E.judge(window)
    assert fast.findings == slow_way.findings and fast.tests == slow_way.tests and fast.need == slow_way.need
    assert {r: dict(fast.excess_ms[r]) for r in fast.excess_ms} == slow_way.excess_ms
    if slow:
        assert fast.culprit is not None and (fast.culprit.rank, fast.culprit.section) == slow


@pytest.mark.parametrize("world", [columnwise.EAGER_EVIDENCE_FROM, 256])
def test_evidence_made_with_the_figures_at_many_ranks_equals_the_evidence_made_when_asked(world):
    """From EAGER_EVIDENCE_FROM ranks, Store.update makes each step's per-layer evidence from
    the step's own matrices: the same flat, excess and reference as made later from the
    batches, and the same as rank by rank (where the flat values are an array: many columns)."""
    from ddptui.model import evidence
    run = SyntheticRun("medium", world, ("ddp",), seed=3, slow=(5, 1, 40.0))
    store = _store(run, 4)
    store.update()
    kept = list(store.waits["ddp"].values())
    assert len(kept) == 4
    for sw in kept:
        assert sw._evidence is not None  # made ahead, not when first asked for
        flat, excess, ref = sw._evidence
        later_flat, later_excess, later_ref = columnwise.sections_excess(sw.batches)
        secs = evidence.step_sections(sw.batches)
        want_flat = evidence.flatten(secs)
        assert flat[0] == later_flat[0] == want_flat[0]
        assert list(flat[1]) == list(later_flat[1]) == list(want_flat[1])
        assert (excess, ref) == (later_excess, later_ref) == evidence.step_excess(secs)
        assert isinstance(flat[1], np.ndarray) == (len(flat[0]) >= evidence.COLUMNWISE_FROM)
    if world >= 256:  # (the judge stacks the arrays: the same verdict as from tuples)
        rows = [(s.step, s.t_ns, s.flat, s.excess) for s in kept]
        as_tuples = [(k, t, (f[0], tuple(f[1].tolist())), e) for k, t, f, e in rows]
        a = evidence.judge([(k, f, e) for k, _, f, e in rows], min_slower=0.5)
        b = evidence.judge([(k, f, e) for k, _, f, e in as_tuples], min_slower=0.5)
        assert a.findings == b.findings and a.culprit == b.culprit


def test_hta_overlap_column_wise_counts_an_optimizer_over_a_collective():
    """HTA counts the optimizer as compute: rank 1's optimizer runs while its AllReduce is
    still in flight (20 µs of it), rank 0's after; column-wise as rank by rank."""
    from ranks import frames, wire
    from ranks.frames import spans_frame
    from ranks.wire import BWD, COMM, FWD, OPT, STEP

    def batch(rank, opt_at):
        spans = [(STEP, 0, 0, 420), (FWD, 0, 0, 100), (BWD, 0, 100, 300), (COMM, 0, 250, 400),
                 (OPT, 0, opt_at, opt_at + 20)]
        kinds, idxs, t0, t1 = zip(*spans)
        base = 10**9
        f = spans_frame(rank, "ddp", 3, base, list(kinds), list(idxs), [base + t * 1000 for t in t0],
                        [base + t * 1000 for t in t1], [base + 240_000])
        return wire.decode_spans(frames.decode(wire.pack(f)[4:]))

    ranks = {0: batch(0, 400), 1: batch(1, 350)}
    rs = {r: figures.rank_step(b, lambda i: 1000) for r, b in ranks.items()}
    sk = columnwise.Stacked(ranks, columnwise.usable(ranks))
    got = columnwise.hta_steps(sk, rs)
    assert got == {r: figures.hta_step(b, rs[r]) for r, b in ranks.items()}
    assert got[0] == pytest.approx((0.15, 0.05)) and got[1] == pytest.approx((0.15, 0.07))
