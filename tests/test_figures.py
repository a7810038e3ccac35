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
