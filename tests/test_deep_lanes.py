"""A deep model on one screen: a compute lane with more blocks than it can draw one by one
groups consecutive blocks of a run (`h.0`, `h.1`, ...) into one bar per pass (geometry.
layer_groups), says so in the pane's header, and zooming in takes the groups apart; every
block is still in the store, the recording and the exports. And the global batch a user's
run reads from its inputs: the ranks' counts summed (RunInfo), or why it is unknown."""
from __future__ import annotations

import json

import msgspec
import pytest

from ddptui.model.views import Lane
from ddptui.ui import geometry
from ddptui.ui.widgets.lanes import compute_bars
from ranks import frames, spec
from ranks.wire import BWD, FWD, OPT

from .helpers import run_main
from .test_app import drawn, settle

BLOCKS = 48
NAMES = ["transformer.wte", "transformer.wpe"] + [f"transformer.h.{i}" for i in range(BLOCKS)] \
    + ["transformer.ln_f", "lm_head"]


# -- which layers share a bar ------------------------------------------------------------------
def test_block_runs_and_groups():
    t5 = ["shared"] + [f"encoder.block.{i}" for i in range(6)] + ["encoder.final_layer_norm"] \
        + [f"decoder.block.{i}" for i in range(6)] + ["lm_head"]
    assert geometry.block_runs(t5) == [(1, 7, "encoder.block", 0), (8, 14, "decoder.block", 0)]
    assert geometry.block_runs(["fc1", "fc2", "x.0", "y.1"]) == []  # (no run of two)
    g = geometry.layer_groups(t5, 2)
    assert g.size == 2 and g.blocks == 12
    assert g.labels == ("shared", "block.0-1", "block.2-3", "block.4-5", "encoder.final_layer_norm",
                        "block.0-1", "block.2-3", "block.4-5", "lm_head")
    assert g.of == (0, 1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6, 7, 7, 8)
    assert geometry.layer_groups(t5, 1) is None and geometry.layer_groups(["fc1", "fc2"], 4) is None
    odd = geometry.layer_groups([f"l.{i}" for i in range(5)], 2)  # (the last group shorter)
    assert odd.labels == ("l.0-1", "l.2-3", "l.4") and odd.of == (0, 0, 1, 1, 2)


def test_group_size_follows_the_room_the_layer_spans_have():
    """The smallest size giving each bar MIN_CELLS_PER_BAR cells, from the cells the layer
    spans cover and their number; the size in use kept near the mark."""
    n, spans = len(NAMES), 2 * len(NAMES)  # (a forward and a backward per layer)
    five = geometry.MIN_CELLS_PER_BAR
    assert geometry.group_size(NAMES, 2 * n * five, spans) == 1  # room for every layer
    assert geometry.group_size(NAMES, 2 * 16 * five, spans) == 4  # 4 others + 12 groups of 4
    assert geometry.group_size(NAMES, 2 * 16 * five - 1, spans) == 8
    assert geometry.group_size(NAMES, 2 * 10 * five, spans, last=8) == 8
    # near the mark, the size in use stays; well past it, it changes
    assert geometry.group_size(NAMES, 2 * 16 * five * 0.9, spans, last=4) == 4
    assert geometry.group_size(NAMES, 2 * 16 * five * 0.65, spans, last=4) == 8
    assert geometry.group_size(NAMES, 2 * 28 * five * 1.1, spans, last=4) == 4  # (2 would just fit)
    assert geometry.group_size(NAMES, 2 * 28 * five * 1.4, spans, last=4) == 2
    # two micro-steps: twice the spans in the same cells, bigger groups
    assert geometry.group_size(NAMES, 2 * 16 * five, 2 * spans) == 16
    assert geometry.group_size(["fc1", "fc2"], 1.0, 4) == 1  # (no runs of blocks)


def test_grouped_bars_merge_a_group_per_pass_and_micro_step():
    """Two micro-steps of 4 blocks, 2 a bar: each micro-step's forward and backward give two
    bars each (not one bar across both micro-steps); the optimizer stays its own bar."""
    names = [f"h.{i}" for i in range(4)]
    groups = geometry.LayerGroups(2, (0, 0, 1, 1), ("h.0-1", "h.2-3"), 4)
    spans, t = [], 0.0

    def add(kind, idx, d=1.0):
        nonlocal t
        spans.append((kind, idx, t, t + d))
        t += d
    for _ in range(2):
        for i in range(4):
            add(FWD, i)
        for i in reversed(range(4)):
            add(BWD, i, 2.0)
    add(OPT, 0, 3.0)
    lane = Lane(bytes(k for k, *_ in spans), [i for _, i, *_ in spans], [a for *_, a, _ in spans],
                [z for *_, z in spans], [], [], [])
    bars = compute_bars(lane, names, groups)
    assert [(a, z, label) for a, z, _, label in bars] == [
        (0.0, 2.0, "h.0-1"), (2.0, 4.0, "h.2-3"), (4.0, 8.0, "h.2-3"), (8.0, 12.0, "h.0-1"),
        (12.0, 14.0, "h.0-1"), (14.0, 16.0, "h.2-3"), (16.0, 20.0, "h.2-3"), (20.0, 24.0, "h.0-1"),
        (24.0, 27.0, "opt")]
    shades = [c for _, _, c, _ in bars[:4]]
    assert shades[0] != shades[1] and shades[2] != shades[3]  # groups alternate shades
    assert len(compute_bars(lane, names)) == 17  # ungrouped: every span its bar


# -- on screen ---------------------------------------------------------------------------------
def _deep_source(monkeypatch, steps=4):
    """A synthetic DDP run of a 52-layer model named as GPT-2 with 48 blocks."""
    from ddptui.recording.synthetic import SyntheticSource
    monkeypatch.setitem(spec.MODEL_WIDTHS, "gpt48", [256] * (len(NAMES) + 1))
    src = SyntheticSource(0, 2, "gpt48", ("ddp",), seed=1)
    src.run.us_per_mparam = 20000.0  # (compute a GPT's share of the step, not a tiny MLP's)
    head = [msgspec.structs.replace(h, layers=list(NAMES)) for h in src.run.header_frames()]
    body = [f for k in range(steps) for f in src.run.step_frames(k)]
    for f in head + body:
        src.store.ingest(f)
    src.store.update()
    src.steps = steps
    return src, head + body


@pytest.mark.asyncio
async def test_48_blocks_stay_readable_at_200x50_and_zoom_takes_the_groups_apart(monkeypatch):
    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets import TimelinePane
    src, _ = _deep_source(monkeypatch)
    app = DdpApp(src)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        pane = app.query_one(TimelinePane)
        g = pane.groups()
        assert g is not None and g.size == 4 and g.blocks == BLOCKS
        lines = drawn(pane)
        assert "48 blocks drawn 4 a bar" in lines[0]
        # rank 0's compute lane: a bar per group and pass, not one per block
        view = pane.state.view
        bars = compute_bars(view.spans[0], pane.layer_names, g)
        layer_bars = [b for b in bars if b[3] in g.labels]
        assert len(layer_bars) == 2 * g.groups
        lane = next(ln for ln in lines if ln.startswith("r0 "))[9:]
        assert "0-3" in lane or "4-7" in lane  # a group's label ('h.0-3' cut to '0-3') where a bar holds it
        # every block is still there to be drawn: the store keeps them one by one
        assert list(src.store.meta.layers) == NAMES
        assert {i for k, i in zip(view.spans[0].kind, view.spans[0].idx) if k == FWD} == set(range(len(NAMES)))
        for _ in range(3):  # zoom 8x: room for every block
            await pilot.press("plus")
            await settle(pilot)
        assert app.vm.zoom == 8 and pane.groups() is None
        assert "blocks drawn" not in drawn(pane)[0]


def test_every_block_is_in_the_recording_and_its_export(monkeypatch, tmp_path):
    from ranks.recfile import RecordWriter
    _src, fs = _deep_source(monkeypatch, steps=2)
    rec = tmp_path / "deep.ddptui"
    w = RecordWriter(str(rec), {"ddptui": "0.1.0", "model": "gpt48", "world": 2, "strategies": ["ddp"],
                                "layers": NAMES, "steps": 2})
    for f in fs:
        w.write(f)
    w.close()
    js = tmp_path / "s.json"
    assert run_main("summary", str(rec), "--json", str(js)).returncode == 0
    assert json.loads(js.read_text())["layers"] == NAMES
    out = tmp_path / "t.json"
    assert run_main("export", str(rec), "-o", str(out)).returncode == 0
    names = {e.get("name") for e in json.loads(out.read_text())["traceEvents"]}
    assert all(any(n and b in n for n in names) for b in (f"transformer.h.{i}" for i in range(BLOCKS)))


# -- the global batch from the inputs ----------------------------------------------------------
def _hello(rank, **kw):
    return frames.Hello(rank=rank, world=2, layers=["a"], params=[("a.w", 4, 0)], strategies=["ddp"], **kw)


def test_global_batch_is_the_ranks_inputs_summed():
    from ddptui.model.runinfo import RunInfo
    from ddptui.reports.report import run_title
    m = RunInfo(world=2)
    m.take_hello(_hello(0, rank_batch=8), "cpu")
    assert m.batch == 16 and m.batch_from == "inputs"  # (one rank so far: its count for each)
    m.take_hello(_hello(1, rank_batch=6), "cpu")  # (an uneven last batch: the sum, as it is)
    assert m.batch == 14 and m.rank_batches == {"0": 8, "1": 6}
    assert "global batch 14" in run_title(m.as_dict())
    # no input had a batch dimension: unknown, and the report says why
    n = RunInfo(world=2)
    for r in (0, 1):
        n.take_hello(_hello(r, rank_batch=0), "cpu")
    assert n.batch is None and n.batch_from == "inputs"
    assert "global batch unknown (no tensor the model was called with had a batch dimension" in run_title(n.as_dict())
    # given (instrument(batch=), a worker): as given, the ranks' counts not asked
    g = RunInfo(world=2)
    g.take_hello(_hello(0, batch=64), "cpu")
    assert g.batch == 64 and g.batch_from is None
    assert "global batch unknown (the ranks did not say)" in run_title(RunInfo(world=2).as_dict())
