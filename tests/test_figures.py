"""Pure figure functions and the span wire format."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ddptui.model import figures
import msgspec

from ranks import frames, wire
from ranks.frames import spans_frame
from ranks.wire import BWD, COMM, FWD, OPT, STEP

intervals = hs.lists(hs.tuples(hs.integers(0, 1000), hs.integers(0, 1000)).map(sorted).map(tuple),
                     max_size=20)


def covered(ivs):
    return {t for a, b in ivs for t in range(a, b)}


@given(intervals, intervals)
@settings(max_examples=200, deadline=None)
def test_union_and_intersection_match_point_sets(xs, ys):
    ux, uy = figures.union(xs), figures.union(ys)
    assert figures.length(ux) == len(covered(xs))
    assert all(a < b for a, b in ux) and all(ux[i][1] < ux[i + 1][0] for i in range(len(ux) - 1))
    assert figures.intersection_length(ux, uy) == len(covered(xs) & covered(ys))
    assert figures.union_length(list(xs)) == len(covered(xs))
    assert figures.union_length(xs + ys) == len(covered(xs) | covered(ys))
    diff = figures.difference(ux, uy)
    assert figures.length(diff) == len(covered(xs) - covered(ys))
    assert all(a < b for a, b in diff) and all(diff[i][1] <= diff[i + 1][0] for i in range(len(diff) - 1))


def batch(spans, iss=None):
    kinds, idxs, t0, t1 = zip(*spans)
    base = 10**9
    f = spans_frame(0, "ddp", 3, base, list(kinds), list(idxs),
                    [base + t * 1000 for t in t0], [base + t * 1000 for t in t1],
                    [base + t * 1000 for t in (iss or [])])
    return wire.decode_spans(frames.decode(wire.pack(f)[4:]))


def test_exposed_communication_is_what_compute_does_not_cover():
    # compute 0-100 (fwd) and 100-300 (bwd); comm 250-400 -> 50 covered, 100 exposed
    b = batch([(STEP, 0, 0, 420), (FWD, 0, 0, 100), (BWD, 0, 100, 300), (COMM, 0, 250, 400),
               (OPT, 0, 400, 420)], iss=[240])
    r = figures.rank_step(b, lambda i: 1000)
    assert (r.step_ms, r.compute_ms, r.comm_ms, r.exposed_ms) == (0.42, 0.3, 0.15, 0.1)
    assert r.calls == 1 and r.bytes == 1000
    assert figures.overlap_pct(r.comm_ms, r.exposed_ms) == pytest.approx(100 / 3)


def test_a_collective_the_compute_waited_for_inside_its_layer_is_exposed():
    """A tensor-parallel all_reduce issued and waited on inside its layer's forward (WAIT: from
    the wait's call to its end, the frame's wait column): the layer stood waiting, so the wait
    is exposed communication and not compute; the part before the wait, while the layer went
    on computing, stays hidden. Without the wait the same spans read it all hidden (as before)."""
    from ranks.wire import COLL, WAIT
    spans = [(STEP, 0, 0, 1000), (FWD, 0, 0, 1000), (COLL, 0, 400, 600)]
    plain = figures.rank_step(batch(spans, iss=[400]), lambda i: 0)
    assert (plain.compute_ms, plain.comm_ms, plain.exposed_ms) == (1.0, 0.2, 0.0)
    b = batch(spans + [(WAIT, 0, 450, 600)], iss=[400])
    assert list(b.kind) == [STEP, FWD, COLL] and list(b.waits) == [450, 600, 0]  # (not a span on the wire)
    r = figures.rank_step(b, lambda i: 0)
    assert (r.compute_ms, r.comm_ms, r.exposed_ms) == (0.85, 0.2, 0.15)
    from ddptui.model import collectives
    (row,) = collectives.stats([{0: b}], {0: {0: (0, "all_reduce", 64, 2, "", 0, "forward", True)}},
                               ["l0"], 2)
    assert row["exposed_ms_per_step"] == pytest.approx(0.15) and row["time_ms_per_step"] == pytest.approx(0.2)


def test_a_wait_column_that_is_not_pairs_or_runs_backwards_is_refused():
    f = spans_frame(0, "ddp", 3, 10**9, [STEP], [0], [10**9], [10**9 + 5000], [])
    for bad, why in ((b"\x01\x00\x00\x00\x02\x00\x00\x00", "triples"),
                     (b"\x09\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00", "ends before")):
        g = frames.decode(wire.pack(msgspec.structs.replace(f, wait=bad))[4:])
        with pytest.raises(wire.FrameError, match=why):
            wire.decode_spans(g)
    assert len(wire.decode_spans(frames.decode(wire.pack(f)[4:])).waits) == 0  # (absent: none)
    assert b'"w"' not in wire.pack(f) and b"\xa1w" not in wire.pack(f)  # (an empty one is not sent)


def test_hta_counts_the_optimizer_as_compute():
    """HTA's get_comm_comp_overlap takes every kernel not a collective for compute, the
    optimizer's too: a collective still in flight while it runs is overlapped for HTA, exposed
    for ddptui's own figure (comm 250-400 over bwd to 300, optimizer 350-420: 50 + 50 of 150)."""
    b = batch([(STEP, 0, 0, 420), (FWD, 0, 0, 100), (BWD, 0, 100, 300), (COMM, 0, 250, 400),
               (OPT, 0, 350, 420)], iss=[240])
    r = figures.rank_step(b, lambda i: 1000)
    assert figures.hta_step(b, r) == pytest.approx((0.15, 0.1))
    assert figures.hta_overlap_pct(*figures.hta_step(b, r)) == pytest.approx(66.67)
    # the optimizer after every collective: the same as ddptui's (the usual case)
    b = batch([(STEP, 0, 0, 420), (FWD, 0, 0, 100), (BWD, 0, 100, 300), (COMM, 0, 250, 400),
               (OPT, 0, 400, 420)], iss=[240])
    r = figures.rank_step(b, lambda i: 1000)
    assert figures.hta_step(b, r) == pytest.approx((0.15, 0.05))
    assert figures.hta_overlap_pct(0.0, 0.0) is None


def test_bus_bandwidth_like_nccl_tests():
    # 1 GB across 4 ranks in 1 s -> 1.5 GB/s bus bandwidth
    assert figures.bus_bandwidth_gbps(1e9, 1000.0, 4) == pytest.approx(1.5)
    assert figures.bus_bandwidth_gbps(1e9, 1000.0, 1) is None


def test_decode_rejects_inconsistent_frames():
    f = spans_frame(0, "naive", 0, 0, [STEP, COMM], [0, 1], [0, 0], [5, 5], [0])
    wire.decode_spans(f)
    for key, value, why in [("kind", bytes([wire.N_KINDS, wire.N_KINDS]), "unknown span kind"),
                            ("t0", b"\0" * 4, "disagree"),
                            ("iss", b"", "issue column"),
                            ("idx", b"\xff\xff\0\0", "does not exist")]:
        bad = msgspec.structs.replace(f, **{key: value})
        with pytest.raises(ValueError, match=why):
            wire.decode_spans(bad, max_idx=100)
    body = wire.pack({k: v for k, v in msgspec.msgpack.decode(frames.encode(f)).items() if k != "b"})[4:]
    with pytest.raises(ValueError, match="without field b"):
        frames.decode(body)


def test_frame_reader_splits_any_chunking_and_refuses_huge_lengths():
    packed = [wire.pack({"t": "hb", "r": i, "k": 0, "pad": "x" * i}) for i in range(50)]
    stream = b"".join(packed)
    rnd = random.Random(1)
    r = wire.FrameReader()
    got, pos = [], 0
    while pos < len(stream):
        n = rnd.randint(1, 40)
        got += r.feed(stream[pos:pos + n])
        pos += n
    assert [frames.decode(b).rank for b in got] == list(range(50))
    with pytest.raises(ValueError, match="exceeds"):
        wire.FrameReader().feed(b"\xff\xff\xff\xff")


def test_the_notes_line_never_cuts_a_note_beside_the_speedups():
    """Four strategies in a narrow panel: the speed-ups against single go alone rather than
    with a note cut mid-word; with room, the longest note that fits goes beside them."""
    from ddptui.ui.widgets.figures_panel import _notes_line
    sp = {"naive_vs_single": 1.3, "interleaved_vs_single": 1.48, "ddp_vs_single": 1.5}
    narrow = "".join(t for t, _ in _notes_line(sp, 76))
    assert narrow == "naive 1.30× vs single  interleaved 1.48× vs single  ddp 1.50× vs single"
    wide = "".join(t for t, _ in _notes_line(sp, 200))
    assert wide.startswith(narrow + " · ms, medians of") and len(wide) <= 200
    alone = "".join(t for t, _ in _notes_line({}, 30))  # no speed-ups: the shortest note, cut by the panel
    assert alone.startswith("medians of")


# -- OTHER spans: a rank's own work that synchronises nothing (an evaluation) ----------------
def _with_other(f, extra):
    """A spans frame with OTHER spans added ((t0, t1) ns after its base, negative: before it):
    rebuilt on a base that is the earliest span's start, as a rank builds it."""
    b = wire.decode_spans(f)
    base = f.base_ns
    kinds, idxs = list(b.kind), list(b.idx)
    t0 = [base + x * 1000 for x in b.t0]
    t1 = [base + x * 1000 for x in b.t1]
    iss = [base + x * 1000 for x in b.iss]
    at = 1  # (after the STEP span, where a rank puts them)
    for a, z in extra:
        kinds.insert(at, wire.OTHER); idxs.insert(at, 0)
        t0.insert(at, base + a); t1.insert(at, base + z)
        at += 1
    new_base = min(t0)
    return spans_frame(f.rank, f.strategy, f.step, new_base, kinds, idxs, t0, t1, iss)


def _filled(other: bool, steps: int = 24):
    from ddptui.model.store import Store
    from ddptui.recording.synthetic import SyntheticRun
    run = SyntheticRun("small", 3, ("naive", "ddp"), slow=(1, 2, 4.0), slow_from=4, late=(0.3, 0.5, 2.0))
    st = Store()
    for f in run.header_frames():
        st.ingest(f)
    n_other = 0
    for k in range(steps):
        for f in run.step_frames(k):
            if other and type(f) is frames.Spans and f.rank in (0, 1) and k % 3 != 2:
                # before the step (an evaluation after the last optimizer step), inside it over
                # the backward and the AllReduces, and past its end
                b = wire.decode_spans(f)
                end = max(b.t1) * 1000
                f = _with_other(f, [(-3_000_000, -1_000_000), (end // 3, end - 1000), (end + 10, end + 5_000_000)])
                n_other += 3
            st.ingest(f)
        st.update()
    return st, n_other


def _waits_of(sw):
    if sw is None:
        return None
    return (sw.collectives, sw.wait_ms, sw.caused_ms, sw.transfer_ms, sw.last_arriver, sw.culprit,
            sw.layer_excess_ms, sw.step, sw.t_ns, sw.flat, sw.excess, sw.ref)


def test_other_spans_change_no_figure_and_no_wait():
    """OTHER spans (before a step, inside it, after it: the frame's base moved back) change no
    step figure, no wait, no culprit, no per-layer evidence and no summary row."""
    plain, _ = _filled(False)
    other, n = _filled(True)
    assert n > 0 and other.spans == plain.spans + n
    for s in ("naive", "ddp"):
        assert other.step_figures(s) == plain.step_figures(s) != []
        ks = [f.step for f in plain.step_figures(s)]
        for k in ks:
            assert _waits_of(other.step_waits(s, k)) == _waits_of(plain.step_waits(s, k)), (s, k)
        assert other.summary(s) == plain.summary(s)
    assert plain.summary("ddp")["stragglers"]  # (the comparison holds figures worth comparing)


def test_other_spans_sit_in_no_placement_and_are_drawn_as_other():
    from ddptui.model.columns import Placement
    from ddptui.model.views import Lane
    from ddptui.ui.widgets import lanes, theme
    b = batch([(STEP, 0, 0, 100), (wire.OTHER, 0, 0, 10), (FWD, 0, 10, 40), (BWD, 0, 40, 80),
               (COMM, 0, 50, 90), (OPT, 0, 90, 100)], iss=[45])
    p = Placement(b.kind, b.idx)
    assert p.compute == [2, 3] and p.comm == [4] and p.step == 0 and p.sections == [(FWD, 0), (BWD, 0)]
    r = figures.rank_step(b, lambda i: 4)
    assert (r.step_ms, r.compute_ms, r.comm_ms) == (0.1, 0.07, 0.04)
    lane = Lane(b.kind, b.idx, [a / 1e3 for a in b.t0], [z / 1e3 for z in b.t1], [45 / 1e3], [None], [False])
    bars = lanes.compute_bars(lane, ["l0"])
    assert (0.0, 0.01, theme.OTHER, "other") in bars and len(bars) == 4
    assert wire.KIND_NAMES[wire.OTHER] == "other" and wire.N_KINDS == 10  # (COLL: 6, PASS: 7, MB: 8, PIPE: 9)


def test_a_rank_with_other_spans_stays_in_its_band():
    from ddptui.ui.widgets.aggregate import band_spans
    plain = (bytes([STEP, FWD, COMM]), wire._from_le("H", bytes(6)), [0.0, 10.0, 50.0], [100.0, 40.0, 90.0], [45.0], [None])
    slow = (bytes([STEP, wire.OTHER, FWD, COMM]), wire._from_le("H", bytes(8)), [0.0, -30.0, 20.0, 60.0],
            [200.0, -5.0, 50.0, 190.0], [55.0], [None])
    p50, p95 = band_spans({0: slow, 1: plain}, [0, 1], (0.0, 1.0))
    assert bytes(p50.kind) == bytes([STEP, FWD, COMM])
    assert p50.ends[0] == 0.1 and p95.ends[0] == 0.2  # both ranks counted (ms)
