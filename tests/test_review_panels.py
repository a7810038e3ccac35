"""What panels say where a first reading misled: the buckets' layer ranges, the single pane's
layer-mark period, the who-waits bars (real Stores from SyntheticSource, no UI)."""
from __future__ import annotations

from ddptui.recording.synthetic import SyntheticSource
from tests.helpers import run_main
from ddptui.ui.widgets import buckets

BERT = ["bert.embeddings"] + [f"bert.encoder.layer.{i}" for i in range(4)] + ["bert.pooler", "classifier"]


def _text(lines) -> list[str]:
    return ["".join(t for t, _ in line) for line in lines]


def test_a_bucket_of_every_layer_reads_as_all_of_them_never_cut_mid_name():
    every = list(range(7))
    assert buckets.layer_text(every, every, BERT) == "all 7 layers"  # (was 'bert.embeddin')
    assert buckets.layer_text(every, every, BERT, 40) == "bert.embeddings…classifier (7 layers)"
    assert buckets.layer_text([1, 2, 3, 4], every, BERT) == "layer.0–3"
    assert buckets.layer_text([0], every, BERT) == "embeddings"
    assert buckets.layer_text([0, 6], every, BERT) == "2 layers"
    fc = ["fc1", "fc2", "fc3", "fc4", "fc5"]
    assert buckets.layer_text([3, 4], list(range(5)), fc) == "fc4–fc5"
    assert buckets.layer_text([0, 2], list(range(5)), fc) == "fc1,fc3"
    for ls in ([0], [1, 2, 3, 4], every, [0, 6], [2, 5]):
        got = buckets.layer_text(ls, every, BERT)
        assert len(got) <= buckets.LAYERS_WIDTH
        assert "bert.embeddin" not in got or "bert.embeddings" in got


def test_the_bucket_panel_widens_its_layers_column_where_a_name_needs_it():
    src = SyntheticSource(steps=6, world=2, model="medium")
    st = src.store
    view = st.view("ddp", st.latest_complete("ddp"))
    narrow = _text(buckets.build(st, view, 10, 52))
    assert narrow[2].split()[:2] == ["b0", "fc2–fc5"] and narrow[3].split()[:2] == ["b1", "fc1–fc2"]
    assert _text(buckets.build(st, view, 10, 120)) == narrow  # short names: the same table
    st.meta.layers = BERT[:5]  # (the same buckets, long names)
    narrow = _text(buckets.build(st, view, 10, 52))
    assert narrow[2].split()[:2] == ["b0", "layer.0–3"] and narrow[3].split()[:3] == ["b1", "2", "layers"]
    wide = _text(buckets.build(st, view, 10, 120))
    assert wide[2].split()[:4] == ["b0", "bert.encoder.layer.0…bert.encoder.layer.3", "(4", "layers)"]
    assert wide[3].split()[:2] == ["b1", "bert.embeddings–bert.encoder.layer.0"]
    assert wide[1].index("MB") + 2 == wide[2].index("10.03") + 5  # the columns stay aligned


def test_the_pane_and_the_summary_say_the_period_of_layer_marks_in_force():
    """Layers marked on steps 0 and 32 of 40 (single, the gloo demo): 'layers 1 step in 32'
    in the pane at any step after 32 and in the summary, not the running ratio of steps to
    marked steps (15, 18, 20 as the run went on)."""
    import os

    from ddptui.model.views import sampling_text
    from ddptui.recording.loader import load
    from tests.helpers import ROOT
    st = load(os.path.join(ROOT, "demo", "gpu-h100-xlarge-2ranks-gloo.ddptui")).store
    assert st.layer_sampling("single") == (2, 40) and st.layer_period("single") == 32
    assert st.layer_period("ddp") is None  # every step's layers marked
    v = st.view("single", 39)
    assert sampling_text(v.sampling, short=True, period=v.period) == "layers 1 step in 32"
    lm = st.summary("single")["layer_marks"]
    assert lm["every"] == 32 and lm["steps_marked"] == 2


def test_summary_explains_layer_marks_once_and_says_1_rank():
    import os

    from tests.helpers import ROOT
    got = run_main("summary", os.path.join(ROOT, "demo", "gpu-h100-xlarge-1rank-nccl.ddptui"))
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert out.count("forward and backward as a whole on the others") == 1, out
    for s, every in (("naive", 4), ("interleaved", 8), ("ddp", 16), ("single", 16)):
        assert f"  {s}: layers marked 1 step in {every} (" in out
    assert " · 1 rank · nccl" in out and "rank(s)" not in out


def test_who_waits_bars_share_one_scale_across_strategies_and_say_ms():
    """The gloo demo: naive's waits (2.1, 2.0 ms) drew full bars on its own scale and ddp's
    (2.6, 2.0 ms, beside a 70 ms transfer) empty ones. One scale for all: the longest wait on
    screen fills a bar, a longer wait draws a longer bar, and the title and rows say ms."""
    import os

    from ddptui.recording.loader import load
    from ddptui.ui.widgets import waits
    from tests.helpers import ROOT
    st = load(os.path.join(ROOT, "demo", "gpu-h100-xlarge-2ranks-gloo.ddptui")).store
    shown = {s: st.latest_complete(s) for s in st.strategies()}
    lines = _text(waits.build(st, shown, 160, 8))
    top = max(v for s in ("naive", "interleaved", "ddp")
              for v in waits._summary(st, s, shown[s])["wait_ms_median"].values())
    assert f"bars: one scale, full {top:.1f} ms" in lines[0]
    bars = {}
    for head, row in zip(lines[1::2], lines[2::2]):
        s = head.split()[0]
        for part in row.split(" r")[1:]:
            r, rest = part.split(" ", 1)
            value = float(rest.replace("█", "").split()[0])
            bars[s, int(r)] = (rest.count("█"), value)
        assert row.lstrip().startswith("wait, ms r0") and row.endswith(" ms")  # waits and transfer in ms
    assert bars["ddp", 0][0] > 0  # (2.6 ms: drawn, on the scale naive's are)
    by_value = sorted(bars.values(), key=lambda x: x[1])
    assert [n for n, _ in by_value] == sorted(n for n, _ in by_value)  # longer wait, longer bar
    assert max(n for n, _ in by_value) == 12
