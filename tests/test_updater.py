"""The Updater (ddptui/model/updater.py): a live run's figures made on a thread of their own,
and the app's frames prepared there, so the drawing thread only draws (Textual, run_test)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ddptui.model import columnwise, stragglers
from ddptui.model.store import Store
from ddptui.model.updater import Updater
from ddptui.recording.synthetic import SyntheticRun, SyntheticSource
from ddptui.ui.app import DdpApp
from ddptui.ui.widgets import aggregate


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_figures_come_from_the_updaters_thread_while_frames_arrive_on_another():
    run = SyntheticRun("small", 4, ("naive", "ddp"), seed=1)
    st = Store()
    for f in run.header_frames():
        st.ingest(f)
    up = Updater(st, period=0.01).start()
    made_on: set[str] = set()
    # who waited for whom: rank by rank, or for all ranks at once (ddptui/model/columnwise.py)
    real, real_cw = stragglers.step_waits, columnwise.step_waits

    def spy(real):
        def run(*a, **kw):  # the real function, noting which thread ran it
            made_on.add(threading.current_thread().name)
            return real(*a, **kw)
        return run

    stragglers.step_waits, columnwise.step_waits = spy(real), spy(real_cw)
    try:
        def feed():
            for k in range(30):
                for f in run.step_frames(k):
                    st.ingest(f)
                time.sleep(0.002)

        t = threading.Thread(target=feed, name="collector")
        t.start()
        t.join()
        assert wait_until(lambda: st.latest_complete("ddp") == 29 and st.latest_complete("naive") == 29)
    finally:
        stragglers.step_waits, columnwise.step_waits = real, real_cw
        up.stop()
    assert made_on == {"ddptui-updater"}  # not the thread that fed, not this (the reader's)
    assert st.complete_steps("naive") == list(range(30))
    assert not up.running
    # a step that arrives after stop() waits for the next update (a run's end: flush)
    for f in run.step_frames(30):
        st.ingest(f)
    assert st.latest_complete("ddp") == 29
    up.flush()
    assert st.latest_complete("ddp") == 30


def test_a_failing_hook_is_logged_once_and_the_figures_go_on():
    run = SyntheticRun("small", 2, ("naive", "ddp"), seed=2)
    st = Store()
    for f in run.header_frames():
        st.ingest(f)
    up = Updater(st, period=0.01)
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("boom")

    up.after = broken
    up.start()
    try:
        for k in range(5):
            for f in run.step_frames(k):
                st.ingest(f)
            assert wait_until(lambda: st.latest_complete("ddp") == k)
    finally:
        up.stop()
    assert calls == [1] and up.after is None and up.error is None
    lines = [t for _, level, t in st.log_lines() if "preparing frames stopped" in t]
    assert lines == ["preparing frames stopped: ValueError: boom"]


@pytest.mark.asyncio
async def test_live_frames_are_prepared_off_the_drawing_thread_for_256_ranks():
    """A live feed of 256 ranks with a slow rank: the evidence, the waits and the bands are
    made on the Updater's thread, never on the drawing thread, and the culprit is drawn."""
    src = SyntheticSource(steps=1, world=256, model="medium", ahead=30, per_s=20, slow=(200, 1, 40.0))
    threads: dict[str, set[str]] = {"summarize": set(), "aggregate": set()}
    real_sum, real_agg = stragglers.summarize, aggregate.aggregate

    def spy_sum(*a, **kw):
        threads["summarize"].add(threading.current_thread().name)
        return real_sum(*a, **kw)

    def spy_agg(*a, **kw):
        threads["aggregate"].add(threading.current_thread().name)
        return real_agg(*a, **kw)

    stragglers.summarize, aggregate.aggregate = spy_sum, spy_agg
    try:
        app = DdpApp(src)
        async with app.run_test(size=(160, 50)) as pilot:
            drawing = threading.current_thread().name
            deadline = time.monotonic() + 30
            while app._prepared == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for made in threads.values():  # (the first frame, before the feed: made here)
                made.clear()
            # (every step of the feed: no verdict before a full window of 20 steps is on screen)
            while (src.store.latest_complete("ddp") or 0) < 30 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert src.updater.running and src.updater.after is not None
            pane = app.panes["ddp"]
            while time.monotonic() < deadline:  # (the view takes up a newer step every FOLLOW_EVERY_S)
                await pilot.pause(0.1)
                rows = [pane.render_line(y).text for y in range(pane.size.height)]
                if any("culprit" in r for r in rows):
                    break
            # what the live run made (once the source stops, so does its Updater: a last frame
            # of steps it had not prepared yet is made by the drawing thread, as in a replay)
            live = {k: set(v) for k, v in threads.items()}
            await pilot.press("q")  # the user quits: the source and its threads stop
            await pilot.pause(0.2)
            assert wait_until(lambda: not src.updater.running, 5)
    finally:
        stragglers.summarize, aggregate.aggregate = real_sum, real_agg
    assert live["summarize"] and live["aggregate"]
    assert drawing not in live["summarize"] | live["aggregate"], live
    assert live["summarize"] == {"ddptui-updater"} and live["aggregate"] == {"ddptui-updater"}
    assert any("culprit" in r for r in rows), rows
    assert any("r200" in r for r in rows), rows


def test_results_are_kept_by_the_identity_of_their_sources():
    from ddptui.model.kept import Kept

    kept, made = Kept(2), []

    def make(v):
        made.append(v)
        return [v]

    a, b = object(), object()
    first = kept.get("k", (a, b), lambda: make(1))
    assert kept.get("k", (a, b), lambda: make(2)) is first and made == [1]  # the same objects: kept
    assert kept.get("k", (a, object()), lambda: make(3)) == [3]  # an equal key, other objects: made again
    kept.get("x", (a,), lambda: make(4))
    kept.get("y", (a,), lambda: make(5))  # room for 2: the oldest ("k") goes
    assert kept.get("k", (a, b), lambda: make(6)) == [6] and made == [1, 3, 4, 5, 6]


@pytest.mark.asyncio
async def test_the_last_step_of_a_live_feed_is_shown_though_nothing_comes_after_it():
    """Following shows a new step at most every FOLLOW_EVERY_S: the run's last step, with no
    frame after it, is still taken up (the app asks the Updater for a frame)."""
    from ddptui.ui.viewmodel import FOLLOW_EVERY_S

    src = SyntheticSource(steps=1, world=2, model="small", ahead=6, per_s=40)
    app = DdpApp(src)
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 20
        while (src.store.latest_complete("ddp") or 0) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        last = src.store.latest_complete("ddp")
        assert last == 6 and app._prepares()
        pane = app.panes["ddp"]
        deadline = time.monotonic() + 2 * FOLLOW_EVERY_S + 1.0
        while f"step {last} " not in pane.render_line(0).text and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert f"step {last} " in pane.render_line(0).text, pane.render_line(0).text
        await pilot.press("q")


@pytest.mark.asyncio
async def test_live_frames_with_no_newer_step_are_drawn_at_most_every_minor_interval():
    """Live, the store changes many times a second without a newer step (here GPU samples,
    40 a second): the Updater prepares a frame for each change, but such frames are drawn at
    most every MINOR_EVERY_S; they are still drawn (the GPU panel moves on)."""
    from ddptui.ui.app import MINOR_EVERY_S
    from ddptui.ui.viewmodel import FOLLOW_EVERY_S

    src = SyntheticSource(steps=2, world=2, model="small", ahead=1, per_s=50)
    app = DdpApp(src)
    drawn: list[float] = []
    real = app._redraw

    def counted():
        drawn.append(time.monotonic())
        real()

    app._redraw = counted
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 20
        while src.store.latest_complete("ddp") != 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await pilot.pause(2 * FOLLOW_EVERY_S + 0.3)  # following has taken up the last step
        assert app._prepares() and app.shown_steps() == {"naive": 2, "ddp": 2}
        stop = threading.Event()

        last_in = [0.0]

        def samples():  # as the GPU sampler's frames come in
            while not stop.wait(0.025):
                src.run.t += 25_000_000
                src.store.ingest(src.run.gpu_frame(2))
                last_in[0] = time.monotonic()

        feeder = threading.Thread(target=samples, daemon=True)
        feeder.start()
        try:
            await pilot.pause(0.3)
            first, prepared = len(drawn), app._prepared
            await pilot.pause(1.0)
            at, prepared = drawn[first:], app._prepared - prepared
        finally:
            stop.set()
            feeder.join(2)
        # nothing comes after the last sample ...
        await pilot.pause(2 * MINOR_EVERY_S + 0.2)
        # ... and it is prepared all the same (a change inside MINOR_EVERY_S of the last
        # prepared frame is asked for again at the Updater's next beat), then drawn
        assert app._prepared_at >= last_in[0] and drawn[-1] >= app._prepared_at, \
            (app._prepared_at - last_in[0], drawn[-1] - last_in[0])
        await pilot.press("q")
    # the store changed and the Updater prepared frames (without a newer step, at most one
    # every MINOR_EVERY_S: one made sooner would not be drawn) ...
    assert 2 <= prepared <= 1.0 / MINOR_EVERY_S + 2, prepared
    # ... drawn, but never two within MINOR_EVERY_S (each tick, 15 a second, would draw one)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert len(at) >= 2 and min(gaps) >= 0.9 * MINOR_EVERY_S, (prepared, gaps)
