"""Frames of every type with wrong values: refused at the door before any state changes,
the same way by every reader; and an unexpected exception never stops ingestion.

The live run with real ranks receiving generated frames is in test_faults.py
(test_generated_bad_frames_during_a_real_run); that a refused frame leaves the Store as it
was, in test_store.py."""
from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ddptui.ingest.collector import Collector
from ddptui.ingest.feed import Feed
from ddptui.recording.loader import load
from ranks.recfile import RecordWriter
from ddptui.recording.replay import ReplaySource
from ddptui.model.store import Store
from ddptui.recording.synthetic import SyntheticRun
from ranks import frames, wire
from ranks.core.emitter import Emitter

from .bad_frames import MODEL, STRATEGIES, TYPES, WORLD, bad_frame, valid
from .helpers import examples

RUN = SyntheticRun(MODEL, WORLD, STRATEGIES, seed=3)
META = {"model": MODEL, "world": WORLD, "strategies": list(STRATEGIES), "batch": 256,
        "layers": RUN.layers, "params": [list(p) for p in RUN.table]}
LIMITS = frames.Limits.of_meta(META)
CONTROL = tuple(frames.CONTROL_FRAMES)


def check(f: dict, limits=LIMITS):
    """A map checked as a rank's frame is: decoded and validated, then against the run."""
    return frames.check(frames.validate(f), limits)


def good_frames(steps: int = 6) -> list[dict]:
    run = SyntheticRun(MODEL, WORLD, STRATEGIES, seed=3)
    out = list(run.header_frames())
    for k in range(steps):
        out += run.step_frames(k)
        out.append(run.gpu_frame(k))
    return out


# -- the schema ------------------------------------------------------------------------------
@pytest.mark.parametrize("t", TYPES, ids=[f"{t}-frame" for t in TYPES])
def test_every_type_has_a_valid_example_and_unknown_optional_keys_pass(t):
    f = valid(t)
    check(f)
    # a newer peer's optional fields (e.g. hb's clock residual, hello's uuid) pass
    check(dict(f, res=12345, uuid="run-1", some_future_key=[1, {"x": b"y"}]))


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad_frame())
def test_every_generated_bad_frame_is_refused(f):
    with pytest.raises(frames.FrameError):
        check(f)


def test_protocol_version_mismatch_is_one_clear_rejection():
    st = Store()
    col = Collector(st, "tok")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(col.path)
        s.sendall(wire.pack({"t": "auth", "token": "tok", "r": 0, "v": wire.PROTOCOL_VERSION + 1}))
        _wait(lambda: st.rejected == 1)
        assert s.recv(10) == b""  # dropped
        lines = [t for _, _, t in st.log]
        assert lines == [f"rejected unauthenticated client: protocol version {wire.PROTOCOL_VERSION + 1}, "
                         f"but this ddptui speaks version {wire.PROTOCOL_VERSION} (ranks and app are "
                         f"from different versions)"]
        s.close()
    finally:
        col.close()


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- the same frames in a recording: every reader agrees -------------------------------------
def _record(path, frames: list, bad: list[tuple[int, dict]]) -> None:
    w = RecordWriter(str(path), META)
    at = dict(bad)
    for i, f in enumerate(frames):
        if i in at:
            w.write_body(msgpack.packb(at[i], use_bin_type=True))
        w.write(f)
    w.close()


def _figures(st: Store):
    st.update()
    return st.summaries(), {s: st.complete_steps(s) for s in st.strategies()}


_CLEAN: dict = {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hs.lists(hs.tuples(hs.integers(0, len(good_frames()) - 1), bad_frame(types=tuple(t for t in TYPES if t not in CONTROL))),
                min_size=1, max_size=8, unique_by=lambda x: x[0]))
def test_bad_frames_in_a_recording_replay_ui_and_headless_agree(tmp_path_factory, bad):
    good = good_frames()
    d = tmp_path_factory.mktemp("rec")
    if not _CLEAN:
        _record(d / "clean.ddptui", good, [])
        _CLEAN["figures"] = _figures(load(str(d / "clean.ddptui")).store)
    path = d / "bad.ddptui"
    _record(path, good, bad)
    headless = load(str(path))  # summary, export, replay --headless
    src = ReplaySource(str(path), clock=itertools.count(0, 10**12).__next__)  # the replay UI's source
    src.start()
    while not src.poll():  # a clock racing ahead: the whole file, as the UI plays it
        pass
    assert headless.frames == len(src.bodies) == len(good) + len(bad)
    assert len(headless.rejected) == src.skipped == len(bad)
    assert _figures(headless.store) == _figures(src.store) == _CLEAN["figures"]
    rejected = [t for _, lv, t in headless.store.log if t.startswith("rejected")]
    assert rejected == [t for _, lv, t in src.store.log if t.startswith("rejected")]
    assert len(rejected) == len(bad)
    assert sorted(headless.store.ranks) == sorted(src.store.ranks) == [0, 1]


# -- no silent death -------------------------------------------------------------------------
def test_an_unexpected_exception_drops_that_connection_and_the_rest_goes_on():
    st = Store()
    st.set_meta(META)
    recorded = []
    col = Collector(st, "tok", feed=Feed(st, sink=lambda body, f: recorded.append(f)))

    def boom(f):
        raise RuntimeError("a bug in a handler")

    # the next phase frame makes ingestion raise something unexpected
    st._handlers = dict(Store._handlers)
    st._handlers[frames.Phase] = lambda self, f: boom(f)
    try:
        socks = {}
        for r in (0, 1):
            s = socks[r] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(col.path)
            s.sendall(wire.pack({"t": "auth", "token": "tok", "r": r, "v": wire.PROTOCOL_VERSION})
                      + wire.pack(valid("hello", r)))
        _wait(lambda: len(st.ranks) == 2)
        socks[0].sendall(wire.pack({"t": "phase", "r": 0, "ph": "training"}))
        _wait(lambda: st.rejected == 1)
        assert socks[0].recv(10) == b""  # that connection was dropped
        line = [t for _, lv, t in st.log if lv == "warn"][-1]
        assert "rank 0" in line and "phase" in line and "RuntimeError" in line and "a bug" in line
        assert not st.ranks[0].connected  # the UI shows the rank as gone
        for k in range(3):  # everything else goes on
            for f in RUN.step_frames(k):
                if getattr(f, "rank", None) == 1:
                    socks[1].sendall(wire.pack(f))
        _wait(lambda: st.ranks[1].step == 2)
        kinds = [f.type for f in recorded]
        assert "reject" in kinds and "drop" in kinds  # the recording keeps both
        assert [f for f in recorded if f.type == "drop"][0].rank == 0
    finally:
        col.close()


def test_the_collector_thread_survives_a_failing_sink():
    """The sink (the recorder) failing is not the frame's fault: the frame stands, nothing is
    rejected, the connection stays, the sink gets no more frames, one warning says why."""
    st = Store()
    st.set_meta(META)
    fail = threading.Event()
    sunk = []

    def sink(body, f):
        if fail.is_set():
            raise OSError(28, "No space left on device")
        sunk.append(f.type)

    feed = Feed(st, sink=sink)
    col = Collector(st, "tok", feed=feed)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(col.path)
        s.sendall(wire.pack({"t": "auth", "token": "tok", "r": 0, "v": wire.PROTOCOL_VERSION})
                  + wire.pack(valid("hello", 0)))
        _wait(lambda: 0 in st.ranks)
        fail.set()
        s.sendall(wire.pack(dict(valid("hb", 0), k=7)))
        _wait(lambda: st.ranks[0].step == 7)  # taken by the store
        fail.clear()  # (a sink switched off stays off)
        s.sendall(wire.pack(dict(valid("hb", 0), k=8)))
        _wait(lambda: st.ranks[0].step == 8)  # the same connection: not dropped
        assert st.rejected == 0 and feed.sink is None and st.ranks[0].connected
        assert sunk == ["hello"]
        warned = [t for _, lvl, t in st.log if "No space left on device" in t]
        assert warned == ["recording stopped: OSError: [Errno 28] No space left on device"], st.log
        s2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the loop still serves
        s2.connect(col.path)
        s2.sendall(wire.pack({"t": "auth", "token": "tok", "r": 1, "v": wire.PROTOCOL_VERSION})
                   + wire.pack(valid("hello", 1)))
        _wait(lambda: 1 in st.ranks)
    finally:
        col.close()


# -- control frames to ranks -----------------------------------------------------------------
@settings(max_examples=1, deadline=None, database=None)
@given(hs.lists(bad_frame(types=CONTROL), min_size=30, max_size=30))
def test_a_rank_acts_only_on_control_frames_that_follow_the_schema(tmp_path_factory, bad):
    d = tmp_path_factory.mktemp("ctl")
    path = os.path.join(str(d), "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    got = []
    em = Emitter(path, "tok", 0, on_control=got.append, exit_grace_s=60)
    conn, _ = srv.accept()
    try:
        good = [valid("set"), valid("stop")]
        conn.sendall(b"".join(wire.pack(f) for f in bad) + b"".join(wire.pack(f) for f in good))
        _wait(lambda: len(got) >= 2)
        time.sleep(0.2)
        assert got == [frames.validate(f) for f in good]  # every bad one ignored, the good ones after them taken
        assert not em.app_gone.is_set()
    finally:
        em.closed.set()
        conn.close()
        em.close(timeout=1)
        srv.close()


def test_the_app_never_sends_a_control_frame_that_breaks_the_schema():
    st = Store()
    col = Collector(st, "tok")
    try:
        for f in ({"t": "set", "key": "bucket_cap_mb", "value": float("nan"), "seq": 1},
                  {"t": "hello", "r": 0, "world": 1}):
            with pytest.raises(frames.FrameError):
                col.send(f)
        assert col.send(valid("stop")) == 0
    finally:
        col.close()


@pytest.mark.asyncio
async def test_the_replay_ui_shows_the_skipped_frames_and_agrees_with_headless(tmp_path, capsys):
    from ddptui.cli import summary as cmd_summary
    from ddptui.ui.app import DdpApp

    from .test_app import drawn, settle

    good = good_frames()
    bad = [(5, dict(valid("hb", 1), k="three")), (12, dict(valid("buckets", 0), buckets=[[0]])),
           (20, {"t": "nope", "r": 0})]
    path = tmp_path / "bad.ddptui"
    _record(path, good, bad)
    src = ReplaySource(str(path), speed=8.0)
    app = DdpApp(src)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.press("g", *str(src.steps_total - 1), "enter")
        await settle(pilot)
        status = drawn(app.query_one("#status"))[0]
        assert f"{len(bad)} invalid frames skipped" in status, status
        await pilot.press("q")
        await pilot.app.workers.wait_for_complete()
    assert cmd_summary.report(load(str(path)), str(tmp_path / "s.json")) == 0
    err = capsys.readouterr().err
    assert f"{len(bad)} invalid frames skipped (first: invalid hb frame: k: expected int, got str" in err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["skipped_frames"] == len(bad)
    src.store.update()
    assert doc["strategies"] == src.store.summaries()
