"""The UI's view model without Textual: shown steps, pause and stepping, zoom, scale, layout."""
from __future__ import annotations

import pytest

from ddptui.replay import ReplaySource
from ddptui.session import LiveRun
from ddptui.source import BucketControl, Source, Transport
from ddptui.store import Store
from ddptui.synthetic import SyntheticRun, fill_store
from ddptui.viewmodel import ViewModel, plan_layout


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
    assert vm.shown_steps(st) == {"naive": 5, "ddp": 5}  # taken up at most every 0.2 s
    now[0] += 0.25
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


@pytest.mark.parametrize("w,h,cols", [(80, 24, 1), (120, 40, 1), (200, 50, 2)])
def test_layout_fills_the_height(w, h, cols):
    plan = plan_layout(w, h, [2, 2], fig_rows=4, gpu_rows=3)
    assert plan.cols == cols
    assert sum(plan.pane_rows) + plan.bottom_rows + 4 <= h
    assert all(r >= 4 for r in plan.pane_rows)


def test_sources_declare_what_they_can_do():
    rec = ReplaySource("demo/cpu-small-2ranks.ddptui")
    assert isinstance(rec, Source) and isinstance(rec, Transport) and not isinstance(rec, BucketControl)
    live = LiveRun.__new__(LiveRun)
    live.store, live.state, live.message = Store(), "created", ""
    assert isinstance(live, BucketControl) and not isinstance(live, Transport)
