"""Pilot tests of the Textual UI, fed by deterministic synthetic runs (no ranks).

The app, the store and the widgets are real; the source is ddptui.recording.synthetic.SyntheticSource,
a Store filled with synthetic steps that records what the app asks of it.
"""
from __future__ import annotations

import re
import types

import pytest
from textual.widgets._footer import FooterKey

from ddptui.live import nvml
from ddptui.ui.app import DdpApp
from ddptui.recording.replay import ReplaySource
from ddptui.recording.synthetic import SyntheticSource, ddp_buckets
from ddptui.ui.widgets import FiguresPanel, GpuPanel, HelpScreen, StartupScreen, TimelinePane, figures_panel
from ddptui.model.views import Lane
from ddptui.ui.widgets.lanes import comm_bars, compute_bars, lane_segments
from ddptui.ui.widgets.theme import COMM_A, COMM_B, COMM_LAST, FWD_A, WAIT
from ranks.wire import COMM

from .helpers import StubNvml, drawn

DEMO = "demo/cpu-medium-2ranks.ddptui"


class NotingApp(DdpApp):
    """The real app, keeping the notifications it shows."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.notes: list[str] = []

    def notify(self, message, **kw):
        self.notes.append(str(message))
        return super().notify(message, **kw)


def lanes(pane: TimelinePane, rank: int) -> tuple[str, str]:
    """The first row of the compute and the comm lane of a rank, gutter removed."""
    lines = drawn(pane)
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"r{rank} "))
    comm = next(ln for ln in lines[i + 1:] if ln.startswith("    comm"))
    return lines[i][9:], comm[9:]


def last_filled(lane: str) -> int:
    return len(lane.rstrip())


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.redraw()
    await pilot.pause()


# -- lanes (pure drawing) ---------------------------------------------------------------------
def test_lane_has_eighth_block_precision_and_labels():
    # a bar from 2.5 to 12.25 cells, then another from 12.25 on: partial cells at both edges
    segs = lane_segments([(2.5, 12.25, FWD_A, "fc1"), (12.25, 20.0, COMM_A, "")], 24, 1.0)
    text = "".join(s.text for s in segs)
    assert len(text) == 24
    assert text[:2] == "  " and text[2] == "▌"  # half a cell of track, then the bar
    assert "fc1" in text[3:12]
    assert text[12] == "▎"  # a quarter of bar 1, then bar 2
    assert text[13:20] == "█" * 7 and text[20:] == "    "


def test_every_bar_stays_visible_however_short():
    segs = lane_segments([(5.0, 5.001, COMM_A, "")], 10, 1.0)
    assert "".join(s.text for s in segs).strip() == "▏"


def test_a_ranks_lane_is_drawn_from_its_columns_the_last_arriver_and_the_others_waiting():
    """A Store view gives each rank a Lane (its spans as columns, no Span made): the slow
    rank's AllReduces are the last arriver's (drawn in their colour, no waiting), the other
    ranks' wait for it (a waiting stretch, then the transfer); the Spans a Lane makes when
    indexed carry the same and draw the same bars."""
    src = SyntheticSource(steps=0, world=4, model="small")
    src.run.slow = (2, 1, 30.0)  # rank 2's backward of fc2 30 ms late: every naive AllReduce waits for it
    src.add_steps(3)
    view = src.store.view("naive", src.store.latest_complete("naive"))
    names = src.store.meta.layers
    for r in range(4):
        lane = view.spans[r]
        assert isinstance(lane, Lane) and lane._spans is None
        colours = {c for _, _, c, _ in comm_bars(lane, str)}
        if r == 2:
            assert all(lane.last) and colours == {COMM_LAST}
        else:
            assert not any(lane.last) and {WAIT, COMM_A, COMM_B} <= colours and COMM_LAST not in colours
            assert all(o - i > 25.0 for i, o in zip(lane.issued, lane.others))  # waited ~30 ms
        spans = list(lane)
        comms = [s for s in spans if s.kind == COMM]
        assert [s.last for s in comms] == lane.last and [s.others_ms for s in comms] == lane.others
        assert comm_bars(spans, str) == comm_bars(lane, str)
        assert compute_bars(spans, names) == compute_bars(lane, names)
        assert [b[3] for b in compute_bars(lane, names)] == names + names[::-1] + ["opt"]


# -- the main screen --------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_panes_draw_bars_for_every_rank_on_one_scale():
    src = SyntheticSource()
    app = DdpApp(src)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        naive, ddp = app.query_one("#pane-naive", TimelinePane), app.query_one("#pane-ddp", TimelinePane)
        assert naive.region.y == ddp.region.y  # side by side when wide
        assert naive.state.ms_per_cell == ddp.state.ms_per_cell
        for pane in (naive, ddp):
            header = drawn(pane)[0]
            assert pane.strategy.upper() in header and "step 5" in header
            for r in (0, 1):
                compute, comm = lanes(pane, r)
                assert "█" in compute and "█" in comm
            compute, comm = lanes(pane, 0)
            assert "fc2" in compute  # layer labels where they fit
            # bars end where the step ends, on the shared scale
            view = pane.state.view
            assert abs(last_filled(compute) - view.duration_ms / pane.state.ms_per_cell) <= 2
        assert "b1" in lanes(ddp, 0)[1]  # DDP: one bar per bucket
        assert "2 buckets" in drawn(ddp)[0] and "cap 25 MB" in drawn(ddp)[0]


@pytest.mark.asyncio
async def test_panes_stack_when_narrow_and_hide_ranks_that_do_not_fit():
    app = DdpApp(SyntheticSource(world=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        naive, ddp = app.query_one("#pane-naive", TimelinePane), app.query_one("#pane-ddp", TimelinePane)
        assert ddp.region.y > naive.region.y
        text = "\n".join(drawn(naive))
        assert "r0  comp" in text
        assert re.search(r"ranks? \d(–\d)? hidden — enlarge the terminal", text)


@pytest.mark.asyncio
async def test_figures_and_speedup():
    src = SyntheticSource(steps=8)
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        text = "\n".join(drawn(app.query_one(FiguresPanel)))
        want = src.store.step_figs["ddp"][7].step_ms
        assert re.search(rf"ddp\s+{want:.1f}\s", text)
        for column in ("median", "exposed", "overlap", "AR/step", "samples/s", "comm %", "exp %", "busy %", "GPU %"):
            assert column in text
        rows = {r["strategy"]: r for r in figures_panel.compare_rows(src.store, app.shown_steps())}
        ddp = rows["ddp"]
        assert re.search(rf"ddp .*\s{ddp['busy_pct']:.0f}%\s", text)  # busy: compute share of the step
        assert ddp["busy_pct"] == pytest.approx(100 * ddp["compute_ms"] / ddp["step_ms_median"])
        head = drawn(app.query_one("#headline"))[0]
        sp = rows["naive"]["step_ms_median"] / ddp["step_ms_median"]
        assert f"DDP {sp:.2f}× faster than naive" in head and f"{ddp['overlap_pct']:.0f} % of" in head


@pytest.mark.asyncio
async def test_redraws_only_when_the_store_changes():
    src = SyntheticSource()
    app = DdpApp(src, fps=30)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        drawn_at = app._drawn
        polls = src.polls
        await pilot.pause(0.3)
        assert src.polls > polls  # the timer polls the source
        assert app._drawn == drawn_at  # but nothing changed: no redraw
        src.add_steps(1)
        pane = app.query_one("#pane-naive", TimelinePane)
        for _ in range(40):  # the new step is taken up within FOLLOW_EVERY_S (and a tick)
            await pilot.pause(0.05)
            if "step 6" in drawn(pane)[0]:
                break
        assert app._drawn != drawn_at
        assert "step 6" in drawn(pane)[0]


# -- keys ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_b_and_shift_b_walk_the_bucket_ladder():
    src = SyntheticSource()
    app = NotingApp(src)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        await settle(pilot)
        await pilot.press("b")
        assert src.calls[-1] == ("set_bucket_cap", 5.0)
        assert any("5 MB" in n for n in app.notes)
        await settle(pilot)
        assert "5 MB asked" in drawn(app.query_one("#pane-ddp", TimelinePane))[0]
        await pilot.press("b")
        assert src.calls[-1] == ("set_bucket_cap", 1.0)
        await pilot.press("b")  # bottom of the ladder: nothing sent
        assert src.calls[-1] == ("set_bucket_cap", 1.0)
        await pilot.press("B", "B")
        assert src.calls[-2:] == [("set_bucket_cap", 5.0), ("set_bucket_cap", 25.0)]


@pytest.mark.asyncio
async def test_an_applied_bucket_change_is_marked_and_notified():
    src = SyntheticSource(steps=3)
    app = NotingApp(src)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        await settle(pilot)
        st, run = src.store, src.run
        st.ingest({"t": "event", "r": 0, "k": 3, "what": "bucket_cap_mb", "value": 1.0})
        run.buckets = ddp_buckets(run.model, 1.0)
        for r in range(2):
            st.ingest({"t": "buckets", "r": r, "s": "ddp", "k": 3, "cap_mb": 1.0, "buckets": run.buckets})
        src.add_steps(1)
        await settle(pilot)
        header = drawn(app.query_one("#pane-ddp", TimelinePane))[0]
        assert f"{len(run.buckets)} buckets" in header and len(run.buckets) != 2
        assert "cap 1 MB" in header and "⚑" in header
        assert any("applied" in n or "re-wrapped" in n for n in app.notes)
        src.add_steps(1)
        await settle(pilot)
        header = drawn(app.query_one("#pane-ddp", TimelinePane))[0]
        assert "⚑" not in header and "since step 3" in header


@pytest.mark.asyncio
async def test_pause_and_arrows_move_through_steps_while_data_keeps_coming():
    src = SyntheticSource(steps=6)
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one("#pane-naive", TimelinePane)
        await pilot.press("space")
        assert app.paused and app.pinned == 5
        src.add_steps(2)  # training goes on
        await pilot.press("left", "left")
        await settle(pilot)
        assert "step 3" in drawn(pane)[0]
        assert "PAUSED" in drawn(app.query_one("#status"))[0]
        await pilot.press("right")
        await settle(pilot)
        assert "step 4" in drawn(pane)[0]
        await pilot.press("space")
        await settle(pilot)
        assert not app.paused and "step 7" in drawn(pane)[0]
        await pilot.press("left")  # ← while following pauses first
        assert app.paused and app.pinned == 6


@pytest.mark.asyncio
async def test_zoom_changes_the_scale_of_every_pane():
    app = DdpApp(SyntheticSource())
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        panes = list(app.query(TimelinePane))
        before = panes[0].state.ms_per_cell
        before_bar = last_filled(lanes(panes[0], 0)[0])
        before_axis = drawn(panes[0])[1]
        await pilot.press("plus")
        await settle(pilot)
        assert all(p.state.ms_per_cell == pytest.approx(before / 2) for p in panes)
        assert last_filled(lanes(panes[0], 0)[0]) > before_bar
        assert drawn(panes[0])[1] != before_axis  # the axis is kept only while the scale is the same
        await pilot.press("minus", "minus")
        await settle(pilot)
        assert panes[0].state.ms_per_cell == pytest.approx(before)  # 1× is the widest
        assert drawn(panes[0])[1] == before_axis


@pytest.mark.asyncio
async def test_s_saves_an_svg_screenshot(tmp_path):
    app = NotingApp(SyntheticSource(), screenshot_dir=str(tmp_path))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await settle(pilot)
        await pilot.press("s")
    files = list(tmp_path.glob("*.svg"))
    assert len(files) == 1 and "<svg" in files[0].read_text()[:2000]
    assert any(str(files[0]) in n for n in app.notes)


@pytest.mark.asyncio
@pytest.mark.parametrize("key", ["q", "ctrl+c"])
async def test_q_stops_the_source_and_exits(key):
    src = SyntheticSource()
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(key)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    assert src.calls[-1] == ("stop", "stopped by user")
    assert app.return_value == 0


@pytest.mark.asyncio
async def test_help_screen_and_footer_keys():
    app = DdpApp(SyntheticSource())
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        footer = {k.action for k in app.screen.query(FooterKey)}
        assert {"quit", "help", "pause", "bucket(-1)", "screenshot"} <= footer
        assert "speed(1)" not in footer and "goto" not in footer  # replay only
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.query_one("Static").render()
        assert "bucket_cap_mb" in str(text) and "zoom" in str(text)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


# -- start-up and failures ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_startup_screen_shows_progress_then_gives_way():
    src = SyntheticSource(steps=0)
    src.store.set_meta({"model": "medium", "world": 2, "strategies": ["naive", "ddp"]})
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, StartupScreen)
        body = app.screen.query_one("#startup-body")
        assert "rank 0: waiting to connect" in "\n".join(drawn(body))
        for f in src.run.header_frames()[:1]:
            src.store.ingest(f)
        src.store.ingest({"t": "phase", "r": 0, "ph": "rendezvous"})
        await pilot.pause(0.2)
        text = "\n".join(drawn(body))
        assert "rank 0 connected — cpu · gloo" in text and "rank 1: waiting" in text
        footer = {k.action for k in app.screen.query(FooterKey)}
        assert footer == {"quit", "help", "screenshot", "output"}  # (output: a script's prints before its first step)
        src.add_steps(1)
        await pilot.pause(0.3)
        assert not isinstance(app.screen, StartupScreen)


@pytest.mark.asyncio
async def test_startup_of_1024_ranks_is_counted_not_listed():
    """Past RANKS_LISTED ranks the start-up screen counts: connected (on what), who still
    waits, each failure, the phases; a few lines, drawn at the frame rate without effort."""
    from ddptui.recording.synthetic import hello
    from ddptui.ui.widgets import screens

    src = SyntheticSource(steps=0, world=1024)
    st = src.store
    st.set_meta({"model": "medium", "world": 1024, "strategies": ["naive", "ddp"]})
    for r in range(1000):
        st.ingest(hello(r, 1024, "medium", ["naive", "ddp"]))
        st.ingest({"t": "phase", "r": r, "ph": "training" if r < 990 else "rendezvous"})
    st.ingest({"t": "error", "r": 7, "msg": "RuntimeError: out of memory"})
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, StartupScreen)
        lines = drawn(app.screen.query_one("#startup-body"))
    text = "\n".join(lines)
    assert "1000/1024 ranks connected — 1000 cpu · gloo" in text
    assert "waiting to connect: r1000, r1001, r1002, r1003, r1004, r1005, r1006, r1007, +16 more" in text
    assert "rank 7 " in text and "out of memory" in text
    assert "phases: training 989 · rendezvous 10 · failed 1" in text
    assert "rank 8 " not in text and "rank 1000" not in text  # counted, not listed
    assert len(screens.startup_lines(st, "running", "", None, 1.0, 0, 120)) < 20


@pytest.mark.asyncio
async def test_startup_failure_names_the_rank_and_lets_the_user_quit():
    src = SyntheticSource(steps=0)
    src.store.set_meta({"model": "medium", "world": 2, "strategies": ["naive", "ddp"]})
    for f in src.run.header_frames():
        src.store.ingest(f)
    src.store.ingest({"t": "error", "r": 1, "msg": "RuntimeError: Gloo connectFullMesh failed"})
    src.state, src.message = "failed", "rank 1: RuntimeError: Gloo connectFullMesh failed"
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        text = "\n".join(drawn(app.screen.query_one("#startup-body")))
        assert "start-up failed" in text and "rank 1" in text and "connectFullMesh" in text
        await pilot.press("q")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    assert app.return_value == 1


@pytest.mark.asyncio
async def test_failure_after_start_is_shown_and_the_app_stays_open():
    src = SyntheticSource()
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        # backend errors carry brackets that must not be read as markup
        src.state, src.message = "failed", ("rank 0 killed by SIGKILL; rank 1: RuntimeError: "
                                            "[/pytorch/third_party/gloo/pair.cc:553] Connection closed")
        src.store.ranks[0].dropped_spans = 12
        src.store.rejected = 3
        await pilot.pause(0.3)
        banner = app.query_one("#banner")
        assert banner.display and "rank 0 killed by SIGKILL" in str(banner.render())
        assert "[/pytorch/third_party/gloo/pair.cc:553]" in str(banner.render())
        status = drawn(app.query_one("#status"))[0]
        assert "RUN FAILED" in status and "dropped spans: r0 12" in status
        assert "rejected frames or connections: 3" in status
        assert app.is_running


# -- GPU panel ----------------------------------------------------------------------------------
class FakeNvml(StubNvml):
    """Two GPUs; memory info raises NVMLError, PCIe is unsupported."""

    count = 2
    name = b"Fake GPU"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=40 + h)

    def nvmlDeviceGetMemoryInfo(self, h):
        raise self.NVMLError("unknown error")

    def nvmlDeviceGetPowerUsage(self, h):
        return 123000

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1410

    def nvmlDeviceGetPcieThroughput(self, h, which):
        raise self.NVMLError_NotSupported()


@pytest.mark.asyncio
async def test_gpu_panel_shows_na_for_a_metric_that_raises():
    src = SyntheticSource()
    sampler = nvml.GpuSampler(lib=FakeNvml())
    assert sampler.has_gpus
    for _ in range(3):
        src.store.ingest(sampler.sample())
    app = DdpApp(src)
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        text = "\n".join(drawn(app.query_one(GpuPanel)))
        assert "Fake GPU" in text and "GPU0" in text and "GPU1" in text
        assert "util  40%" in text and "util  41%" in text
        assert "N/A/N/A GB" in text  # memory raised: N/A, nothing else broke
        assert "123 W" in text and "1410 MHz" in text and "PCIe ↑N/A" in text


@pytest.mark.asyncio
async def test_without_nvml_the_panel_says_so_and_shows_cpu_per_rank():
    class NoNvml(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError("driver not loaded")

    assert not nvml.GpuSampler(lib=NoNvml()).has_gpus
    src = SyntheticSource()
    for pct in (None, 87.0, 93.0):
        src.store.ingest({"t": "cpu", "ts": 1, "ranks": {"0": pct, "1": 55.0}})
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        text = "\n".join(drawn(app.query_one(GpuPanel)))
        assert "no NVML" in text and "CPU" in text
        assert re.search(r"rank 0\s+CPU\s+93%", text) and re.search(r"rank 1\s+CPU\s+55%", text)


# -- replay ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_replay_keys_drive_the_replay_source():
    src = ReplaySource(DEMO, speed=1.0)
    app = DdpApp(src, title="Talk demo")
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        assert not isinstance(app.screen, StartupScreen)
        assert "Talk demo" in drawn(app.query_one("#title"))[0]
        footer = {k.action for k in app.screen.query(FooterKey)}
        assert {"speed(1)", "speed(-1)", "goto"} <= footer and "bucket(-1)" not in footer
        await pilot.press("space")
        await settle(pilot)
        assert src.state == "paused"
        await pilot.press("right_square_bracket", "right_square_bracket")
        await settle(pilot)
        assert src.speed == 4.0
        await pilot.press(*"]]]]")
        await settle(pilot)
        assert src.speed == 8.0
        await pilot.press("g")
        await pilot.press(*"12", "enter")
        await settle(pilot)
        assert src.position_step == 12
        assert "step 12" in drawn(app.query_one("#pane-ddp", TimelinePane))[0]
        await pilot.press("left", "left")
        await settle(pilot)
        assert src.position_step == 10
        assert "step 10" in drawn(app.query_one("#pane-naive", TimelinePane))[0]
        assert "step 10/29" in drawn(app.query_one("#status"))[0]
        await pilot.press("q")
        await pilot.app.workers.wait_for_complete()
    assert src.state == "stopped"


@pytest.mark.asyncio
async def test_four_panes_at_80x24_fall_back_to_compact_lanes_for_rank_0():
    strategies = ("naive", "interleaved", "ddp", "single")
    app = DdpApp(SyntheticSource(strategies=strategies))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for s in strategies:
            pane = app.query_one(f"#pane-{s}", TimelinePane)
            lines = drawn(pane)
            assert pane.compact and f" {s.upper()} " in lines[0]
            compute, comm = lanes(pane, 0)
            assert "█" in compute  # rank 0's bars are drawn in every pane
            if s != "single":
                assert "█" in comm
                assert "rank 1 hidden" in lines[0]  # and the header says what is left out
            assert not any("enlarge the terminal" in ln for ln in lines)


@pytest.mark.asyncio
async def test_full_pane_keeps_its_axis_when_there_is_room():
    app = DdpApp(SyntheticSource(strategies=("naive", "interleaved", "ddp", "single")))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        for pane in app.panes.values():
            assert not pane.compact
            assert drawn(pane)[1].startswith("      ms 0")


class ScaledApp(DdpApp):
    """The real app, with the step lengths it sees scaled by `factor` and a clock tests drive."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.factor = 1.0
        self.now = 0.0
        self.vm.clock = lambda: self.now

    def _view(self, store, strategy, step):
        import dataclasses
        v = super()._view(store, strategy, step)
        return v and dataclasses.replace(v, duration_ms=v.duration_ms * self.factor)


@pytest.mark.asyncio
async def test_time_scale_holds_through_jitter_and_shrinks_after_steps_get_shorter():
    src = SyntheticSource(steps=2)
    app = ScaledApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one("#pane-naive", TimelinePane)

        async def new_step(factor: float) -> tuple[float, str]:
            app.factor = factor
            app.now += 0.5
            src.add_steps(1)
            app.redraw()
            await pilot.pause()
            return pane.state.ms_per_cell, drawn(pane)[1]

        first = await new_step(1.0)
        for f in (1.1, 0.9, 1.05, 0.92, 1.08, 0.95, 1.1, 0.9, 1.0, 0.93, 1.07, 0.9):
            assert await new_step(f) == first  # ±10 %: same scale, same axis drawn
        assert "cell = " in drawn(app.legend)[0]
        # much shorter steps: the axis stays a few seconds, then shrinks to fit them
        seen = [await new_step(0.3) for _ in range(12)]
        assert seen[0] == first and seen[-1][0] < first[0] * 0.6
        longest = max(p.state.view.duration_ms for p in app.panes.values())
        span = seen[-1][0] * pane.lane_width
        assert longest <= span <= 1.5 * longest  # a round length close above the longest step
        # zoom still divides the (steady) scale
        await pilot.press("plus")
        assert pane.state.ms_per_cell == pytest.approx(seen[-1][0] / 2)
        # longer steps again: the axis grows at once
        mpc, _ = await new_step(1.0)
        assert mpc * 2 * pane.lane_width >= pane.state.view.duration_ms


@pytest.mark.asyncio
async def test_paused_scale_does_not_shrink_while_new_steps_arrive():
    src = SyntheticSource(steps=2)
    app = ScaledApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        pane = app.query_one("#pane-naive", TimelinePane)
        await pilot.press("space")
        before = pane.state.ms_per_cell
        app.factor = 0.3  # (a paused pane keeps its step; shorter steps arrive meanwhile)
        for _ in range(12):
            app.now += 1.0
            src.add_steps(1)
            app.redraw()
            await pilot.pause()
        assert pane.state.ms_per_cell == before and "PAUSED" in drawn(app.status_line)[0]


@pytest.mark.asyncio
async def test_layer_names_that_arrive_late_label_the_lanes():
    """ddptui run: the user's module names are known only once a rank says hello; the panes
    label their layers with them from then on."""
    src = SyntheticSource()
    app = DdpApp(src)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        n = len(src.store.meta.layers)
        src.store.meta.layers = [f"blk{i}" for i in range(n)]
        app.redraw()
        await pilot.pause()
        pane = app.query_one("#pane-naive", TimelinePane)
        assert pane.layer_names[0] == "blk0"
        assert any("blk" in line for line in drawn(pane))


@pytest.mark.asyncio
async def test_two_hosts_lanes_grouped_and_labelled_and_a_row_per_host():
    """Multi-node: ranks 1 and 3 on node 1 (with its clock estimate), 0 and 2 on node 0:
    lanes are grouped by host and their comm rows name it; the hosts panel has a row per host
    with its ranks, clock offset and figures."""
    src = SyntheticSource(world=4)
    st = src.store
    for r, node in ((0, 0), (1, 1), (2, 0), (3, 1)):
        st.ingest({"t": "node", "r": r, "node": node, "host": f"host{node}"})
    st.ingest({"t": "clock", "node": 1, "host": "host1", "off": 250_013_000, "unc": 66_000})
    app = DdpApp(src)
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(pilot)
        pane = app.query_one("#pane-naive", TimelinePane)
        assert pane.ranks() == [0, 2, 1, 3]
        lines = drawn(pane)
        comm = [ln[:9] for ln in lines if "comm" in ln[:9]]
        assert comm == ["n0  comm ", "n0  comm ", "n1  comm ", "n1  comm "]
        text = "\n".join(drawn(app.panels["hosts"]))
        assert re.search(r"node 0\s+\S+\s+ranks 0,2\s+clock reference\s+last \d+ % · waits? \d", text), text
        assert re.search(r"node 1\s+host1\s+ranks 1,3\s+clock \+250\.013 ms ± 66 µs\s+last \d+ % · waits? \d+\.\d · step \d", text), text
        rows = [ln.rstrip() for ln in drawn(app.panels["hosts"]) if ln.lstrip().startswith("node ")]
        assert len(rows) == 2 and all(re.search(r"(exposed \d+\.\d ms|exp \d+\.\d)$", ln) for ln in rows), rows
    # each row fits its panel: columns as wide as their entries, then shorter figure labels
    from ddptui.ui.widgets.hosts import build
    for width, tail in ((160, r"exposed \d+\.\d ms"), (100, r"exp \d+\.\d")):
        rows = ["".join(t for t, _ in parts) for parts in build(st, {}, width, 5)[1:]]
        assert len(rows) == 2 and all(len(ln) <= width and re.search(tail + "$", ln) for ln in rows), (width, rows)
