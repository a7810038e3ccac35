"""ReplaySource on the real demo recording, driven by a hand-moved clock."""
from __future__ import annotations

import msgspec
import pytest

from ddptui.recording.reader import Reader
from ranks.recfile import RecordingError, RecordWriter
from ddptui.recording.replay import ReplaySource
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun

DEMO = "demo/cpu-medium-2ranks.ddptui"
STRATEGIES = ("naive", "interleaved", "ddp", "single")


class Clock:
    def __init__(self):
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def straight_read(path: str = DEMO) -> Store:
    st = Store()
    r = Reader(path)
    st.set_meta(r.meta)
    for _, f in r:
        st.ingest(f)
    st.update()
    return st


def figs(store: Store, upto: int) -> dict:
    return {s: {k: v for k, v in store.step_figs.get(s, {}).items() if k <= upto} for s in STRATEGIES}


@pytest.fixture
def clock():
    return Clock()


def test_start_takes_in_the_start_up_then_plays_on_the_clock(clock):
    src = ReplaySource(DEMO, clock=clock)
    assert src.steps_total == 30 and src.damage is None and src.state == "ready"
    src.start()
    assert src.state == "playing" and src.playing
    assert sorted(src.store.ranks) == [0, 1]  # hellos and phases are in
    assert src.position_step == -1
    assert not src.poll()
    clock.advance(6.0)  # start-up, then CPU steps of ~0.4 s per strategy
    assert not src.poll()
    reached = src.position_step
    assert 0 <= reached < 29
    clock.advance(1.0)
    src.poll()
    assert src.position_step > reached
    clock.advance(3600)
    assert src.poll() is True  # the end
    assert src.state == "finished" and src.position_step == 29
    assert src.store.summaries() == straight_read().summaries()


def test_pause_holds_the_position_and_speed_scales_the_clock(clock):
    src = ReplaySource(DEMO, clock=clock)
    src.start()
    clock.advance(2.0)
    src.poll()
    src.toggle_play()
    assert src.state == "paused" and not src.playing
    at = src.pos
    clock.advance(60)
    assert not src.poll() and src.pos == at
    src.toggle_play()
    slow = ReplaySource(DEMO, clock=clock)
    slow.start()
    fast = ReplaySource(DEMO, speed=4.0, clock=clock)
    fast.start()
    clock.advance(2.0)
    slow.poll()
    fast.poll()
    assert fast.position_step > slow.position_step


def test_speed_is_clamped(clock):
    src = ReplaySource(DEMO, speed=50, clock=clock)
    assert src.speed == 8.0
    assert src.set_speed(0.01) == 0.25 and src.speed == 0.25
    assert src.set_speed(2) == 2.0


def test_seek_forward_and_back_gives_the_figures_of_a_straight_read(clock):
    full = straight_read()
    src = ReplaySource(DEMO, clock=clock)
    src.start()
    assert src.seek(10) == 10 and src.position_step == 10
    for s in STRATEGIES:
        assert set(range(11)) <= set(src.store.step_figs[s])
    assert figs(src.store, 10) == figs(full, 10)
    src.seek(25)
    assert figs(src.store, 25) == figs(full, 25)
    old_store = src.store
    src.seek(5)  # backwards: a rebuilt store
    assert src.store is not old_store
    assert src.position_step == 5
    assert figs(src.store, 5) == figs(full, 5)
    assert all(max(src.store.step_figs[s]) <= 6 for s in STRATEGIES)
    src.seek(999)  # clamped to the last step
    assert src.position_step == 29
    assert src.store.summaries() == full.summaries()


def test_step_by_pauses_and_moves_one_step(clock):
    src = ReplaySource(DEMO, clock=clock)
    src.start()
    src.seek(7)
    assert src.playing
    assert src.step_by(1) == 8 and src.state == "paused"
    assert src.step_by(-3) == 5 and src.position_step == 5


def test_loop_starts_over_and_play_after_the_end_rewinds(clock):
    src = ReplaySource(DEMO, loop=True, clock=clock)
    src.start()
    clock.advance(3600)
    assert src.poll() is False  # looping: never ends
    assert src.position_step < 29 and src.state == "playing"
    once = ReplaySource(DEMO, clock=clock)
    once.start()
    clock.advance(3600)
    assert once.poll() is True
    once.toggle_play()
    assert once.state == "playing" and once.position_step == -1


def test_a_truncated_file_replays_what_is_before_the_damage(tmp_path, clock):
    data = open(DEMO, "rb").read()
    cut = tmp_path / "cut.ddptui"
    cut.write_bytes(data[: len(data) * 2 // 3])
    src = ReplaySource(str(cut), clock=clock)
    assert src.damage and "truncated" in src.damage
    assert "damaged" in src.message
    assert 0 < src.steps_total < 30
    src.start()
    clock.advance(3600)
    assert src.poll() is True
    assert src.position_step == src.steps_total - 1
    assert figs(src.store, src.position_step - 1) == figs(straight_read(), src.position_step - 1)


def test_an_invalid_frame_is_skipped_and_the_rest_replays(tmp_path, clock):
    run = SyntheticRun("small", 2, ("naive", "ddp"), seed=1)
    path = str(tmp_path / "odd.ddptui")
    w = RecordWriter(path, {"model": "small", "world": 2, "strategies": ["naive", "ddp"], "batch": 64})
    for f in run.header_frames():
        w.write(f)
    for k in range(4):
        frames = run.step_frames(k)
        if k == 1:
            frames[0] = msgspec.structs.replace(frames[0], kind=b"\x00")  # columns that disagree in length
        for f in frames:
            w.write(f)
    w.close()
    src = ReplaySource(path, clock=clock)
    src.start()
    src.seek(3)
    assert src.skipped == 1
    assert src.store.latest_complete("ddp") == 3 and 1 not in src.store.step_figs["naive"]
    src.seek(0)  # a rebuilt store counts its own skips
    assert src.skipped == 0


@pytest.mark.parametrize("content, why", [(b"", "empty"), (b"hello world, not a recording", "magic")])
def test_a_file_that_is_not_a_recording_raises(tmp_path, content, why):
    bad = tmp_path / "bad.ddptui"
    bad.write_bytes(content)
    with pytest.raises(RecordingError, match=why):
        ReplaySource(str(bad))



H100 = "demo/gpu-h100-xlarge-2ranks-gloo.ddptui"  # the ranks' start-up: ~11 s, a first step of 7 s


def test_the_start_up_before_the_first_complete_step_is_cut(clock):
    """The H100 recording's ranks took ~11 s to rendezvous, build and finish a first step: the
    replay played it in real time (7 s of panes saying 'waiting'), at the start and on every
    loop. The clock now starts just before the first complete step, and says what it cut."""
    from ddptui.recording.replay import LEAD_NS
    from ddptui.ui.widgets import statuslines

    src = ReplaySource(H100, loop=True, clock=clock)
    assert src.skipped_start_ns > 5e9
    src.start()
    assert src.position_step == -1
    clock.advance(LEAD_NS / 1e9 + 0.05)
    src.poll()
    assert src.position_step == 0
    assert f"start-up skipped ({src.skipped_start_ns / 1e9:.1f} s)" in text(statuslines.replay_state(src))
    clock.advance(60)  # past the end: the loop starts over, the start-up cut again
    src.poll()
    assert src.state == "playing" and src.position_step == -1
    clock.advance(LEAD_NS / 1e9 + 0.05)
    src.poll()
    assert src.position_step == 0
    src.seek(30)  # g N: the figures of a straight read, whatever the clock's cut
    assert src.position_step == 30 and figs(src.store, 30) == figs(straight_read(H100), 30)
    assert "start-up skipped" not in text(statuslines.replay_state(src))  # (said over the first steps)


def test_replay_finished_goes_once_the_position_moves_back(clock):
    src = ReplaySource(DEMO, clock=clock)
    src.start()
    clock.advance(3600)
    assert src.poll() and src.message == "replay finished"
    src.step_by(-1)  # ←
    assert src.position_step == 28 and src.message == ""
    src.toggle_play()
    clock.advance(3600)
    src.poll()
    assert src.message == "replay finished"
    src.seek(12)  # g 12
    assert src.message == "" and src.state == "paused"
    src.seek(29)
    src.toggle_play()
    clock.advance(3600)
    src.poll()
    assert src.state == "finished"
    src.toggle_play()  # space at the end: from the start
    assert src.message == "" and src.playing


def text(parts) -> str:
    return "".join(t for t, _ in parts)
