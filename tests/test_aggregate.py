"""Aggregated lanes when ranks do not fit (ddptui/ui/widgets/aggregate.py), on their own and in
the app (Textual, run_test)."""
from __future__ import annotations

import pytest

from ddptui.ui.app import DdpApp
from ddptui.model.views import Span, StepView
from ddptui.recording.synthetic import SyntheticSource
from ddptui.ui.widgets import aggregate as A
from ranks.wire import BWD, COMM, FWD


def view_of(n: int, late: dict[int, float] | None = None) -> StepView:
    late = late or {}
    spans = {r: [Span(FWD, 0, 0.0, 10.0 + r % 10), Span(BWD, 0, 20.0, 30.0 + late.get(r, 0.0)),
                 Span(COMM, 0, 31.0 + late.get(r, 0.0), 40.0 + late.get(r, 0.0), 30.0)] for r in range(n)}
    return StepView("ddp", 5, spans, {}, 60.0)


def test_bands_are_quantiles_and_the_culprit_and_slowest_get_lanes():
    v = view_of(100, late={42: 25.0, 7: 5.0})
    agg, labels = A.aggregate(v, 12, None, culprit=42)
    assert len(agg.spans) <= 12 and set(labels) == set(agg.spans)
    bands = sorted(k for k in agg.spans if k < 0)
    singles = sorted(k for k in agg.spans if k >= 0)
    assert len(bands) % 2 == 0 and len(bands) >= 2
    assert 42 in singles and labels[42][1].strip() == "culprit"
    assert 7 in singles and labels[7][1].strip() == "slowest"  # done with backward last but 42
    assert agg.spans[42] is v.spans[42]  # a rank's own lane is its own spans
    # the first band is ranks 0..k: its p50 forward ends at the median of 10 + r % 10
    first = bands[0]
    assert labels[first][0].startswith("p50") and labels[first][1].startswith("r0-")
    assert labels[first + 1][0].startswith("p95") and labels[first + 1][1].strip().startswith("×")
    assert agg.spans[first][0].end_ms == pytest.approx(14.0, abs=1) and agg.spans[first + 1][0].end_ms == 19.0
    # fits: nothing changes
    assert A.for_pane(v, 2 + 2 * 100) == (v, None)
    got, lab = A.for_pane(v, 20, None, 42)
    assert len(got.spans) <= 9 and lab is not None and A.for_pane(v, 20, None, 42)[0] is got  # kept


def test_bands_per_host():
    v = view_of(64)
    hosts = {n: list(range(16 * n, 16 * n + 16)) for n in range(4)}
    agg, labels = A.aggregate(v, 12, hosts)
    names = [labels[k][1].strip() for k in sorted(agg.spans) if k < 0 and labels[k][0].startswith("p50")]
    assert names == ["n0", "n1", "n2", "n3"]
    agg, labels = A.aggregate(v, 6, hosts)  # room for 2 bands: hosts 1-3 share the last
    names = [labels[k][1].strip() for k in sorted(agg.spans) if k < 0 and labels[k][0].startswith("p50")]
    assert names[0] == "n0" and names[-1] == "n1+"


@pytest.mark.asyncio
async def test_app_draws_bands_and_the_culprit_for_256_ranks():
    src = SyntheticSource(steps=0, world=256, model="medium")
    src.run.slow, src.run.late = (200, 1, 40.0), (0.5, 10.0, 90.0)
    src.add_steps(24)
    app = DdpApp(src)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        for pane in app.panes.values():
            lines = [pane.render_line(y).text for y in range(pane.size.height)]
            text = "\n".join(lines)
            assert pane.strategy == "ddp" or lines[0].endswith("256 ranks in bands")  # (ddp: cut at 80)
            assert "p50 comp" in text and "p95 comp" in text and "r0-" in text
            i = next(i for i, t in enumerate(lines) if t.startswith("r200comp"))
            assert lines[i + 1].startswith("culprit") and "fc2" in lines[i]
            assert "hidden" not in text
        assert "slow: rank 200 · fc2 backward +40 ms" in app.headline.render_line(0).text


def test_waits_of_many_ranks_are_a_spread():
    from ddptui.model import stragglers as ST
    from ddptui.reports.report import straggler_line
    from ddptui.ui.widgets import waits
    got = ST.wait_spread({str(r): float(r % 10) for r in range(100)} | {"42": 0.0, "7": 30.0})
    assert got == "median 5.0 · p95 9.0 · most r7 30.0 · least r0 0.0 ms over 100 ranks"
    src = SyntheticSource(steps=0, world=64, model="small")
    src.run.slow = (40, 1, 30.0)
    src.add_steps(24)
    lines = ["".join(t for t, _ in line) for line in waits.build(src.store, {}, 120, 6)]
    assert any("over 64 ranks" in line and "least r40" in line for line in lines), lines
    assert all(len(line) <= 160 for line in lines)
    row = straggler_line(src.store.summary("ddp"))
    assert "over 64 ranks" in row and "culprit rank 40 · fc2 backward +30 ms" in row and " r63 " not in row


def test_bands_from_a_stores_columns_match_bands_from_its_spans():
    """A Store's view bands its ranks column-wise (no Span made per rank); the same ranks as
    lists of Spans band to the same lanes, AllReduces' ready and last-ready times included."""
    src = SyntheticSource(steps=0, world=64, model="small")
    src.run.slow, src.run.late = (40, 1, 30.0), (0.5, 10.0, 90.0)
    src.add_steps(4)
    k = src.store.latest_complete("ddp")
    v = src.store.view("ddp", k)
    as_lists = StepView(v.strategy, v.step, {r: list(v.spans[r]) for r in v.spans}, v.figures, v.duration_ms)
    fast, labels = A.aggregate(v, 12)
    slow, labels_lists = A.aggregate(as_lists, 12)
    assert labels == labels_lists and sorted(fast.spans) == sorted(slow.spans)
    assert 40 in fast.spans  # the slow rank ends its backward last: a lane of its own
    bands = [lane for lane in fast.spans if lane < 0]
    assert bands and any(s.kind == COMM and s.issued_ms is not None and s.others_ms is not None
                         for s in fast.spans[bands[0]])
    for lane in bands:
        assert len(fast.spans[lane]) == len(slow.spans[lane]) > 0
        for a, b in zip(fast.spans[lane], slow.spans[lane]):
            assert (a.kind, a.idx) == (b.kind, b.idx)
            for f in ("start_ms", "end_ms", "issued_ms", "others_ms"):
                x, y = getattr(a, f), getattr(b, f)
                assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, abs=1e-6)), (lane, f)
