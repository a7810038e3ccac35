"""The UI's view model without Textual: shown steps, pause and stepping, zoom, scale, screen plan."""
from __future__ import annotations

import pytest

from ddptui.recording.replay import ReplaySource
from ddptui.live.session import LiveRun
from ddptui.ui.source import BucketControl, Source, Transport
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun, fill_store
from ddptui.ui.viewmodel import FOLLOW_EVERY_S, PanelSpec, ViewModel, plan_screen


def filled(steps: int = 6) -> Store:
    st = Store()
    fill_store(st, SyntheticRun("medium", 2, ("naive", "ddp"), seed=1), steps)
    return st


def test_following_pausing_and_stepping():
    st = filled()
    now = [0.0]
    vm = ViewModel(follow_clock=lambda: now[0])
    assert vm.shown_steps(st) == {"naive": 5, "ddp": 5}
    fill_store_more(st, 1)
    assert vm.shown_steps(st) == {"naive": 5, "ddp": 5}  # taken up at most every FOLLOW_EVERY_S
    now[0] += FOLLOW_EVERY_S * 0.9
    assert vm.shown_steps(st) == {"naive": 5, "ddp": 5}
    now[0] += FOLLOW_EVERY_S * 0.2
    assert vm.shown_steps(st) == {"naive": 6, "ddp": 6}
    vm.toggle_pause(st)
    assert vm.paused and vm.pinned == 6
    assert vm.step(st, -2) and vm.shown_steps(st) == {"naive": 4, "ddp": 4}
    assert vm.step(st, +10) and vm.pinned == 6  # never past the newest complete step
    assert vm.step(st, -100) and vm.pinned == 0


def fill_store_more(st: Store, n: int) -> None:
    run = SyntheticRun("medium", 2, ("naive", "ddp"), seed=1)
    k0 = max(st.complete_steps("naive")) + 1
    for k in range(k0 + n):
        frames = run.step_frames(k)
        if k >= k0:
            for f in frames:
                st.ingest(f)
    st.update()


def test_replay_shows_the_steps_where_it_stands():
    st = filled()
    vm = ViewModel()
    assert vm.shown_steps(st, 3, replay=True) == {"naive": 3, "ddp": 3}
    assert vm.shown_steps(st, -1, replay=True) == {"naive": None, "ddp": None}


def test_zoom_divides_one_steady_scale():
    st = filled()
    vm = ViewModel(clock=lambda: 0.0)
    views = {s: st.view(s, 5) for s in st.strategies()}
    mpc = vm.ms_per_cell(views, 100)
    longest = max(v.duration_ms for v in views.values())
    assert longest <= mpc * 100 <= 1.5 * longest
    vm.zoom_by(1)
    assert vm.ms_per_cell(views, 100) == pytest.approx(mpc / 2)
    vm.zoom_by(-5)
    assert vm.zoom == 1


def test_a_warm_up_step_sets_the_scale_only_until_a_steady_one_comes():
    """A replay's loop (and a live run) starts with each strategy's first step, a warm-up many
    times a steady one (514 ms against ~110 on the first H100's gloo run): the axis fits it,
    and the first steady step sets the axis anew at once, not after the patience a jittering
    step gets (before: ~550 ms wide for 8 steps and 3 s, the bars a fifth of the lane)."""
    from ddptui.ui.viewmodel import SpanScale
    sc = SpanScale()
    wide = sc.update(514.0, ("a", 0), 0.0, warm=True)
    assert wide >= 514.0
    steady = sc.update(110.0, ("a", 1), 0.2)
    assert 110.0 <= steady <= 1.5 * 110.0
    # a steady scale keeps its patience: a shorter step does not shrink it at once
    assert sc.update(60.0, ("a", 2), 0.3) == steady
    # and a longer steady step grows it at once, as always
    assert sc.update(300.0, ("a", 3), 0.4) >= 300.0


PANELS = [PanelSpec("figures", 4, 4, 60), PanelSpec("gpu", 2, 5, 60), PanelSpec("history", 3, 9, 87, grow=True),
          PanelSpec("buckets", 4, 8, 52)]


@pytest.mark.parametrize("w,h,cols,shown", [
    (80, 24, 1, {"figures", "gpu"}), (120, 40, 1, {"figures", "gpu"}),
    (200, 50, 2, {"figures", "gpu", "history", "buckets"}), (300, 80, 2, {"figures", "gpu", "history", "buckets"})])
def test_screen_plan_places_panels_by_priority_and_fills_the_height(w, h, cols, shown):
    plan = plan_screen(w, h, [2, 2], PANELS)
    assert plan.cols == cols and plan.shown == shown
    assert sum(plan.pane_rows) + sum(plan.shelf_rows) + 5 == h  # every row used
    assert all(r >= 5 for r in plan.pane_rows)
    for shelf, rows in zip(plan.shelves, plan.shelf_rows):
        assert rows >= max(p.rows_min for p in PANELS if p.name in shelf)


def test_a_new_panel_takes_its_place_with_no_change_to_the_plan():
    more = PANELS + [PanelSpec("waits", 3, 6, 60)]
    assert "waits" in plan_screen(300, 80, [2, 2], more).shown
    assert "waits" not in plan_screen(80, 24, [2, 2], more).shown  # lowest priority: no room


def test_sources_declare_what_they_can_do():
    rec = ReplaySource("demo/cpu-small-2ranks.ddptui")
    assert isinstance(rec, Source) and isinstance(rec, Transport) and not isinstance(rec, BucketControl)
    live = LiveRun.__new__(LiveRun)
    live.store, live.state, live.message = Store(), "created", ""
    assert isinstance(live, BucketControl) and not isinstance(live, Transport)


def test_the_controls_walk_the_ladder_and_size_the_straggler_from_the_steps():
    from ranks import spec
    from ddptui.recording.synthetic import SyntheticSource
    from ddptui.ui.viewmodel import next_bucket_cap, straggler_ask, straggler_where

    src = SyntheticSource(steps=6, world=4, model="medium")
    st = src.store
    ladder = spec.BUCKET_LADDER_MB
    default = float(st.meta.bucket_cap_mb or spec.DEFAULT_BUCKET_CAP_MB)
    up, down = next_bucket_cap(st, None, 1), next_bucket_cap(st, None, -1)
    assert up == min(x for x in ladder if x > default) and down == max(x for x in ladder if x < default)
    assert next_bucket_cap(st, max(ladder), 1) is None and next_bucket_cap(st, min(ladder), -1) is None
    assert next_bucket_cap(st, down, 1) == default  # from what was asked last, not what is in force
    steps = sorted(f.step_ms for s in st.strategies() for f in st.recent_figures(s, n=10))
    assert straggler_ask(st, 0.0) == float(max(2, round(steps[len(steps) // 2] / 2)))
    assert straggler_ask(st, 12.0) == 0.0  # on: d switches it off
    assert straggler_ask(SyntheticSource(steps=0).store, 0.0) == 40.0  # no step yet
    assert straggler_where(st) == "rank 3 · fc3"
