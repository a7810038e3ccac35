"""Pure figure functions and the span wire format."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ddptui.model import figures
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun, fill_store
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


def test_bus_bandwidth_like_nccl_tests():
    # 1 GB across 4 ranks in 1 s -> 1.5 GB/s bus bandwidth
    assert figures.bus_bandwidth_gbps(1e9, 1000.0, 4) == pytest.approx(1.5)
    assert figures.bus_bandwidth_gbps(1e9, 1000.0, 1) is None


def test_decode_rejects_inconsistent_frames():
    f = spans_frame(0, "naive", 0, 0, [STEP, COMM], [0, 1], [0, 0], [5, 5], [0])
    wire.decode_spans(f)
    for key, value, why in [("kind", bytes([9, 9]), "unknown span kind"),
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


def test_store_summary_and_eviction_from_synthetic_run():
    st = Store(keep_steps=10)
    fill_store(st, SyntheticRun("small", 2, ("naive", "interleaved", "ddp", "single")), 30)
    rows = {r["strategy"]: r for r in st.summaries()}
    assert rows["naive"]["steps"] == 30 and rows["single"]["ranks"] == 1
    assert rows["naive"]["overlap_pct"] == 0
    assert rows["interleaved"]["overlap_pct"] > 0
    assert rows["ddp"]["allreduce_calls_per_step"] == len(st.bucket_layout("ddp"))
    assert len(st.raw["naive"]) == 10 and st.view("naive", 5) is None
    v = st.view("ddp", 29)
    assert set(v.spans) == {0, 1} and v.n_buckets == len(st.bucket_layout("ddp"))
    assert figures.speedups(list(rows.values()))["ddp_vs_naive"] > 1


def test_store_queries():
    from ddptui.model.store import in_force

    assert in_force([(0, "a"), (3, "b"), (7, "c")], 5) == "b"
    assert in_force([(2, "a")], 1, "dflt") == "dflt" and in_force([(2, "a")], 1, first=True) == "a"
    run = SyntheticRun("small", 2, ("naive", "ddp"))
    st = Store(keep_steps=10)
    fill_store(st, run, 30)
    st.ingest({"t": "event", "r": 0, "k": 12, "what": "bucket_cap_mb", "value": 5.0})
    assert st.cap_at(11) == 25.0 and st.cap_at(12) == 5.0 and st.cap_at(29) == 5.0
    assert st.cap_changed_at(11) == 0 and st.cap_changed_at(20) == 12 and st.cap_changed_at() == 12
    assert st.oldest_step() == 20  # raw spans of the last 10 steps are kept
    assert st.last_complete("ddp") == 29 and st.last_complete("ddp", 7) == 7
    figs = st.recent_figures("naive", upto=25, n=5)
    assert [f.step for f in figs] == [21, 22, 23, 24, 25]
    assert [f.step for f in st.recent_figures("ddp", since=27)] == [27, 28, 29]
    snap = st.rank_snapshot()
    snap[0].phase = "changed"  # a copy: the store is not touched
    assert st.ranks[0].phase != "changed" and sorted(snap) == [0, 1]


def test_bucket_figures_match_the_spans_of_the_view():
    """The store's per-bucket figures (computed once per step from the raw batches) equal the
    time and compute overlap of each AllReduce measured on the drawn spans, mean over ranks."""
    from statistics import mean

    from ddptui.model.store import Store
    from ddptui.recording.synthetic import SyntheticRun, fill_store
    from ranks.wire import BWD, COMM, FWD

    st = Store()
    fill_store(st, SyntheticRun("xlarge", 4, ("naive", "ddp"), seed=3), 3, gpu=True)
    k = st.latest_complete("ddp")
    v = st.view("ddp", k)
    times, over = {}, {}
    for spans in v.spans.values():
        compute = figures.union([(s.start_ms, s.end_ms) for s in spans if s.kind in (FWD, BWD)])
        for s in spans:
            if s.kind == COMM:
                d = s.end_ms - s.start_ms
                times.setdefault(s.idx, []).append(d)
                over.setdefault(s.idx, []).append(100 * figures.intersection_length([(s.start_ms, s.end_ms)], compute) / d)
    got = st.bucket_figures("ddp", k)
    assert set(got) == set(times) and len(got) > 1
    for b, (t, ov) in got.items():
        assert t == pytest.approx(mean(times[b]), rel=1e-6)
        assert ov == pytest.approx(mean(over[b]), abs=1e-6)
    assert any(0 < ov < 100 for _, ov in got.values())  # some overlap, not all


def test_gpu_pct_per_strategy_from_the_samples_inside_its_complete_steps():
    """Each complete step's interval (first rank's STEP start to last rank's end, made once
    when the step completes), and the GPU % of a strategy from the sample periods that lie
    within one of its steps; a step still missing a rank has no interval yet."""
    from ddptui.model.store import Store
    from ddptui.ui.widgets.figures_panel import gpu_pct_by_strategy
    from ranks.frames import Spans
    from ranks.wire import STEP as STEP_KIND

    from .helpers import synthetic_frames

    st = Store()
    frames = synthetic_frames(steps=4)
    late = [f for f in frames if type(f) is Spans and f.rank == 1 and f.strategy == "ddp" and f.step == 3]
    for f in frames:
        if f not in late:
            st.ingest(f)
    st.update()
    for s in ("naive", "ddp"):
        want = []
        for k, ranks in st.raw[s].items():
            ends = [(b.base_ns + b.t0[i] * 1000, b.base_ns + b.t1[i] * 1000)
                    for b in ranks.values() for i in range(len(b.kind)) if b.kind[i] == STEP_KIND]
            if len(ranks) == 2:
                want.append((k, min(a for a, _ in ends), max(z for _, z in ends)))
        assert st.step_intervals(s) == want and len(want) == (4 if s == "naive" else 3)
    samples = []  # (ts, util), as the sampler takes them: in time order
    for s, util in (("naive", 80), ("ddp", 20)):
        for _, a, z in st.step_intervals(s):
            samples += [(a + (z - a) // 4, util), (a + (z - a) // 2, util)]  # a period inside the step
    samples.append((max(t for t, _ in samples) + 10**9, 0))  # a period in no step
    for t, u in sorted(samples):
        st.ingest({"t": "gpu", "ts": t, "gpus": [{"index": 0, "util": u}]})
    got = gpu_pct_by_strategy(st)
    assert got == {"naive": 80, "ddp": 20}
    for f in late:  # the last rank comes: the step completes and gets its interval
        st.ingest(f)
    st.update()
    assert [k for k, _, _ in st.step_intervals("ddp")] == [0, 1, 2, 3]


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
