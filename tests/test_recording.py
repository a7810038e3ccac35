"""Recordings: the file format, flushing, truncation at any byte, compactness, fuzzing.

These tests write real files with RecordWriter (frames from ddptui.recording.synthetic, the same
frames ranks send) and read them back with Reader / recording.load.
"""
from __future__ import annotations

import os
import shutil
import struct
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ddptui.recording import loader, rankset
from ranks import recfile
from ranks import wire
from ranks.frames import Hb, Spans

from .helpers import DEMO, examples, store_of, synthetic_frames, synthetic_meta, write_recording


def span_count(frames) -> int:
    return sum(len(f.kind) for f in frames if type(f) is Spans)


# -- round trip ------------------------------------------------------------------------------
def test_round_trip_frames_and_header(tmp_path):
    frames = synthetic_frames(steps=5, cap_change_at=2)
    meta = synthetic_meta()
    p = tmp_path / "a.ddptui"
    w = write_recording(p, frames, meta)
    r = rankset.open_reader(str(p))
    assert r.meta == meta
    got = [f for _, f in r]
    assert r.damage is None
    assert got == frames
    assert w.frames == len(frames) and w.spans == span_count(frames)
    with open(p, "rb") as f:
        head = f.read(len(recfile.MAGIC) + 2)
    assert head[:len(recfile.MAGIC)] == recfile.MAGIC
    assert struct.unpack(">H", head[len(recfile.MAGIC):])[0] == recfile.FORMAT_VERSION


def test_load_gives_the_same_figures_as_feeding_the_store(tmp_path):
    frames = synthetic_frames(steps=8, strategies=("naive", "interleaved", "ddp", "single"))
    meta = synthetic_meta(strategies=("naive", "interleaved", "ddp", "single"))
    p = tmp_path / "a.ddptui"
    write_recording(p, frames, meta)
    got = loader.load(str(p))
    assert got.damage is None
    assert got.frames == len(frames)
    assert got.spans == span_count(frames)
    assert got.store.summaries() == store_of(frames, meta).summaries()
    assert got.steps_read() == {s: list(range(8)) for s in ("naive", "interleaved", "ddp", "single")}


def test_long_recording_keeps_every_step_figure(tmp_path):
    """More steps than the store keeps raw: load must compute figures as it goes."""
    n = 600
    frames = synthetic_frames(steps=n)
    p = tmp_path / "long.ddptui"
    write_recording(p, frames)
    got = loader.load(str(p))
    assert n > got.store.keep_steps + 100  # (400: the evicted steps' figures must stay)
    assert {s["strategy"]: s["steps"] for s in got.store.summaries()} == {"naive": n, "ddp": n}


# -- flushing and truncation -----------------------------------------------------------------
def test_unclosed_writer_is_readable_up_to_its_last_flush(tmp_path):
    """A run killed at any instant: what was flushed replays; no close() needed."""
    frames = synthetic_frames(steps=6)
    p = tmp_path / "live.ddptui"
    w = recfile.RecordWriter(str(p), synthetic_meta())
    flushed_at = 0
    for i, f in enumerate(frames):
        w.write(f)
        if type(f) is Hb:  # once per step
            w.flush()
            flushed_at = i + 1
    w.write({"t": "status", "text": "after the last flush", "level": "info", "ts": 1.0})
    snap = tmp_path / "snap.ddptui"
    shutil.copyfile(p, snap)  # the file as a SIGKILL would leave it
    r = rankset.open_reader(str(snap))
    got = [f for _, f in r]
    assert got == frames[:len(got)] and len(got) >= flushed_at
    assert r.damage and "ends" in r.damage
    w.close()


def test_writer_sync_flushes_on_its_own(tmp_path, monkeypatch):
    """Without explicit flush() calls, frames reach the file within FLUSH_EVERY_S."""
    monkeypatch.setattr(recfile, "FLUSH_EVERY_S", 0.0)
    p = tmp_path / "a.ddptui"
    w = recfile.RecordWriter(str(p), synthetic_meta())
    frames = synthetic_frames(steps=2)
    for f in frames:
        w.write(f)
    got = [f for _, f in rankset.open_reader(str(p))]
    assert got == frames  # everything written is readable before close
    w.close()


def test_every_complete_step_is_flushed_without_waiting(tmp_path, monkeypatch):
    """Killed at any instant (a copy of the unclosed file): every step whose spans from all
    ranks were written is on disk, even with no time-based flush at all."""
    monkeypatch.setattr(recfile, "FLUSH_EVERY_S", 1e9)
    strategies = ("naive", "ddp", "single")
    frames = synthetic_frames(steps=5, world=3, strategies=strategies)
    meta = synthetic_meta(world=3, strategies=strategies)
    p = tmp_path / "live.ddptui"
    w = recfile.RecordWriter(str(p), meta)
    snap = tmp_path / "snap.ddptui"
    done: dict[str, int] = {}
    for f in frames:
        w.write(f)
        if type(f) is not Spans:
            continue
        want = 1 if f.strategy == "single" else 3
        if f.rank == want - 1:  # synthetic ranks send in order: this one completes the step
            done[f.strategy] = f.step
            shutil.copyfile(p, snap)
            got = loader.load(str(snap))
            assert got.damage and "ends" in got.damage
            assert {s: ks[-1] for s, ks in got.steps_read().items()} == done
    w.close()


def test_truncated_at_every_byte_replays_a_prefix(tmp_path):
    frames = synthetic_frames(steps=3)
    p = tmp_path / "a.ddptui"
    write_recording(p, frames, flush_each="spans")
    data = p.read_bytes()
    head_len = len(recfile.MAGIC) + 6 + len(msgpack.packb(synthetic_meta(), use_bin_type=True))
    cut = tmp_path / "cut.ddptui"
    last = 0
    for n in range(0, len(data)):
        cut.write_bytes(data[:n])
        if n < head_len:
            with pytest.raises(recfile.RecordingError) as e:
                rankset.open_reader(str(cut))
            assert str(cut) in str(e.value)
            continue
        r = rankset.open_reader(str(cut))
        got = [f for _, f in r]
        assert got == frames[:len(got)], n
        assert len(got) >= last  # more bytes never read fewer frames
        last = len(got)
        assert r.damage is not None  # the stream is never finished before the end
    assert last > len(frames) // 2


# -- compactness -----------------------------------------------------------------------------
def bytes_per_span(path) -> float:
    spans = sum(len(f.kind) for _, f in rankset.open_reader(str(path)) if type(f) is Spans)
    return os.path.getsize(path) / spans


@pytest.mark.skipif(not os.path.exists(DEMO), reason="demo recording not present")
def test_demo_recording_is_compact():
    """The real 2-rank CPU recording shipped in demo/ (header and every frame included)."""
    assert bytes_per_span(DEMO) <= 12.0


def test_large_synthetic_recording_is_compact(tmp_path):
    """A larger run (4 ranks, 4 strategies, 200 steps), sync-flushed every step (worst case)."""
    strategies = ("naive", "interleaved", "ddp", "single")
    frames = synthetic_frames(steps=200, model="medium", world=4, strategies=strategies, seed=3)
    p = tmp_path / "big.ddptui"
    w = write_recording(p, frames, synthetic_meta("medium", 4, strategies), flush_each="hb")
    assert w.spans > 40000
    assert bytes_per_span(p) <= 12.0


# -- the header ------------------------------------------------------------------------------
def _file(tmp_path, raw: bytes, name="x.ddptui") -> str:
    p = tmp_path / name
    p.write_bytes(raw)
    return str(p)


def _header(meta, version=recfile.FORMAT_VERSION) -> bytes:
    head = msgpack.packb(meta, use_bin_type=True)
    return recfile.MAGIC + struct.pack(">HI", version, len(head)) + head


@pytest.mark.parametrize("meta,what", [
    ({"world": "two"}, "world"), ({"world": 0}, "world"), ({"params": [["w", -1, 0]]}, "params"),
    ({"params": "x"}, "params"), ({"strategies": [1]}, "strategies"), ({"batch": True}, "batch"),
])
def test_header_fields_with_wrong_types_are_rejected(tmp_path, meta, what):
    p = _file(tmp_path, _header(meta) + zlib.compress(b""))
    with pytest.raises(recfile.RecordingError, match=what):
        rankset.open_reader(p)


def test_header_not_a_map_is_rejected(tmp_path):
    p = _file(tmp_path, _header([1, 2, 3]))
    with pytest.raises(recfile.RecordingError, match="not a map"):
        rankset.open_reader(p)


# -- fuzzing ---------------------------------------------------------------------------------
_SMALL = synthetic_frames(steps=2)


def _valid_bytes() -> bytes:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "f.ddptui")
        write_recording(p, _SMALL, flush_each="spans")
        with open(p, "rb") as f:
            return f.read()


VALID = _valid_bytes()
FUZZ = settings(max_examples=examples(300), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _read_all(path: str):
    """What every verb does first: load into a store. Only RecordingError may escape."""
    try:
        got = loader.load(path)
    except recfile.RecordingError as e:
        assert str(e).startswith(path) and "\n" not in str(e)
        return None
    got.store.summaries()
    assert got.damage is None or "\n" not in got.damage
    return got


@FUZZ
@given(hs.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(tmp_path, data):
    _read_all(_file(tmp_path, data))


@FUZZ
@given(hs.binary(max_size=4096))
def test_fuzz_arbitrary_body_after_a_valid_header(tmp_path, data):
    _read_all(_file(tmp_path, _header(synthetic_meta()) + data))


@FUZZ
@given(hs.binary(max_size=4096))
def test_fuzz_arbitrary_frames_in_a_valid_stream(tmp_path, body):
    """Valid zlib, valid length prefix, arbitrary frame bytes (msgpack of any shape)."""
    raw = _header(synthetic_meta()) + zlib.compress(wire.LEN.pack(len(body)) + body)
    _read_all(_file(tmp_path, raw))


@FUZZ
@given(hs.lists(hs.tuples(hs.integers(0, len(VALID) - 1), hs.integers(0, 255)), min_size=1, max_size=8),
       hs.integers(0, len(VALID)))
def test_fuzz_corrupted_and_cut_recordings(tmp_path, flips, cut):
    data = bytearray(VALID)
    for pos, val in flips:
        data[pos] = val
    got = _read_all(_file(tmp_path, bytes(data[:cut])))
    if got is not None and all(pos >= cut for pos, _ in flips) and cut < len(VALID):
        assert got.damage is not None  # a cut file is never taken as complete


@FUZZ
@given(hs.recursive(hs.none() | hs.booleans() | hs.integers(-2**63, 2**64 - 1) | hs.floats()
                    | hs.text(max_size=20) | hs.binary(max_size=40),
                    lambda c: hs.lists(c, max_size=6) | hs.dictionaries(hs.text(max_size=8), c, max_size=6),
                    max_leaves=30),
       hs.sampled_from(["spans", "hello", "buckets", "event", "hb", "bye", "error", "gpu", "cpu",
                        "status", "exit", "phase", "nope"]))
def test_fuzz_well_formed_msgpack_frames_of_any_shape(tmp_path, value, t):
    """Frames that decode but carry any fields: the store rejects them as damage, never a crash."""
    frame = value if isinstance(value, dict) else {"v": value}
    frame = dict(frame, t=t)
    if t == "spans":
        frame.setdefault("r", 0)
    body = msgpack.packb(frame, use_bin_type=True)
    good = b"".join(wire.pack(f) for f in _SMALL[:3])
    raw = _header(synthetic_meta()) + zlib.compress(good + wire.LEN.pack(len(body)) + body)
    _read_all(_file(tmp_path, raw))
