"""Bad recordings through the real CLI: summary, export, replay --headless and replay (UI,
which checks the file before starting); the verbs' `main` runs in one child process per
group of files (`run_main_batch`), each call as a command line would make it.

A file with nothing readable is an error: exit status non-zero, stderr exactly one line
`ddptui: error: FILE: problem`, no traceback, nothing on stdout, no export written. The
child processes run under a 512 MiB address-space limit, so a reader that tried to allocate
what a length prefix claims (gigabytes) would fail.

A file damaged after some frames (cut mid-frame, corrupted bytes, a bad length prefix,
trailing garbage) shows the figures of the steps before the damage with one warning line,
exit status 0 (documented in ddptui/cli/summary.py).
"""
from __future__ import annotations

import json
import os
import struct
import zlib

import msgpack
import msgspec
import pytest

from ddptui.recording import loader, rankset
from ranks import recfile
from ranks import wire
from ranks.frames import Spans

from .helpers import run_main, run_main_batch, store_of, synthetic_frames, synthetic_meta, write_recording

AS_LIMIT = 512 << 20


def ddptui_many(arglists, timeout=120):
    """The CLI's `main` once per argument list, in one child process under a 512 MiB
    address-space limit."""
    return run_main_batch(arglists, max_memory=AS_LIMIT, timeout=timeout)


def header(meta=None, version=recfile.FORMAT_VERSION, length=None) -> bytes:
    head = msgpack.packb(synthetic_meta() if meta is None else meta, use_bin_type=True)
    return recfile.MAGIC + struct.pack(">HI", version, len(head) if length is None else length) + head


def frames_bytes(frames) -> bytes:
    return b"".join(wire.pack(f) for f in frames)


def nested(depth: int) -> bytes:
    return b"\x82\xa1t\xa6status\xa4text" + b"\x91" * depth + b"\xc0"


GOOD = synthetic_frames(steps=6)
SPANS_START = next(i for i, f in enumerate(GOOD) if type(f) is Spans)
HEAD_ONLY = GOOD[:SPANS_START]  # status + hellos: frames, but no step


# name -> bytes of a file with nothing to show
BAD = {
    "empty": b"",
    "wrong-magic": b"PK\x03\x04 this is a zip file, not a recording" * 4,
    "text-file": b"hello, I am a text file\n" * 10,
    "newer-version": header(version=recfile.FORMAT_VERSION + 1) + zlib.compress(frames_bytes(GOOD)),
    "cut-in-magic": recfile.MAGIC[:5],
    "cut-in-header": header()[:-7],
    "header-claims-4GiB": header(length=0xFFFFFFFF) + b"\x00" * 64,
    "header-garbage": header()[:len(recfile.MAGIC) + 6] + b"\xc1" * (len(header()) - len(recfile.MAGIC) - 6),
    "header-wrong-types": header({"world": "two", "model": "small"}) + zlib.compress(b""),
    "no-frames-cut": header(),
    "corrupt-zlib-at-start": header() + b"\x00\xff" * 50,
    "cut-mid-first-frame": header() + zlib.compress(frames_bytes(GOOD))[:12],
    "length-prefix-4GiB": header() + zlib.compress(wire.LEN.pack(0xFFFFFFFF) + b"\x00" * 64),
    "length-prefix-just-over-limit": header() + zlib.compress(wire.LEN.pack(wire.MAX_FRAME + 1) + b"\x00" * 64),
    "msgpack-nested-100k": header() + zlib.compress(wire.LEN.pack(len(nested(100_000))) + nested(100_000)),
    "msgpack-array-claims-4G-items": header() + zlib.compress(
        wire.LEN.pack(8) + b"\x81\xa1t\xdd\xff\xff\xff\xff"),
    "msgpack-str-claims-4GiB": header() + zlib.compress(wire.LEN.pack(8) + b"\x81\xa1t\xdb\xff\xff\xff\xf0"),
    "msgpack-not-a-map": header() + zlib.compress(frames_bytes([]) + wire.LEN.pack(3) + b"\x93\x01\x02"),
    "frames-but-no-step-then-damage": header() + zlib.compress(frames_bytes(HEAD_ONLY))[:-3],
    "invalid-spans-frame": header() + zlib.compress(frames_bytes(
        [msgspec.structs.replace(GOOD[SPANS_START], t0=b"\x00")])),  # columns disagree in length
}

VERBS = {
    "summary": lambda p, tmp: ["summary", p, "--json", str(tmp / "out.json")],
    "export": lambda p, tmp: ["export", p, "-o", str(tmp / "out.json")],
    "replay-headless": lambda p, tmp: ["replay", p, "--headless", "--json", str(tmp / "out.json")],
    "replay-ui": lambda p, tmp: ["replay", p],
}


def assert_one_error_line(res, path):
    assert res.returncode != 0, res
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ddptui: error: "), lines[0]
    assert path in lines[0], lines[0]
    assert res.stdout == ""


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """Every bad file through every verb (and `summary FILE` alone), run once:
    (case, verb) -> (file, the run's own folder, result)."""
    d = tmp_path_factory.mktemp("bad")
    jobs = {}
    for case, raw in BAD.items():
        p = d / f"{case}.ddptui"
        p.write_bytes(raw)
        for verb, argv in [*VERBS.items(), ("summary-plain", lambda p, tmp: ["summary", p])]:
            tmp = d / f"{case}-{verb}"
            tmp.mkdir()
            jobs[(case, verb)] = (str(p), tmp, argv(str(p), tmp))
    results = ddptui_many([j[2] for j in jobs.values()])
    return {k: (j[0], j[1], r) for (k, j), r in zip(jobs.items(), results)}


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("case", list(BAD))
def test_bad_file_is_one_error_line(bad_runs, case, verb):
    p, tmp, res = bad_runs[(case, verb)]
    assert_one_error_line(res, p)
    assert res.returncode == 2
    assert not (tmp / "out.json").exists()  # no half-written export or figures
    assert [n for n in os.listdir(tmp) if n.startswith(".ddptui-export")] == []


@pytest.mark.parametrize("case,expect", [
    ("empty", "empty file"), ("wrong-magic", "wrong magic bytes"), ("text-file", "wrong magic"),
    ("newer-version", f"format version {recfile.FORMAT_VERSION + 1} is newer"),
    ("cut-in-header", "truncated inside the header"), ("header-claims-4GiB", "header claims"),
    ("header-garbage", "corrupt header"), ("header-wrong-types", "'world'"),
    ("corrupt-zlib-at-start", "corrupted bytes"), ("length-prefix-4GiB", "4294967295"),
    ("msgpack-nested-100k", "nested too deeply"), ("msgpack-array-claims-4G-items", "4294967295"),
    ("invalid-spans-frame", "spans"), ("cut-mid-first-frame", "file ends"),
])
def test_error_line_says_what_is_wrong(bad_runs, case, expect):
    p, _, res = bad_runs[(case, "summary-plain")]
    assert_one_error_line(res, p)
    assert expect in res.stderr


@pytest.mark.parametrize("verb", ["summary", "export", "replay"])
def test_missing_file_and_directory(tmp_path, verb):
    for p in (str(tmp_path / "nope.ddptui"), str(tmp_path)):
        args = [verb, p] + (["--headless"] if verb == "replay" else [])
        if verb == "export":
            args += ["-o", str(tmp_path / "t.json")]
        res = run_main(*args)
        assert_one_error_line(res, p)


# -- damaged after some steps: a warning and the figures of what came before ----------------
def _good_bytes(tmp_path) -> bytes:
    p = tmp_path / "good.ddptui"
    write_recording(p, GOOD, flush_each="hb")  # sync-flushed once per step, as live runs do
    return p.read_bytes()


def _expected_rows(n_frames: int) -> list[dict]:
    return store_of(GOOD[:n_frames]).summaries()


def _damaged(tmp_path, kind: str) -> tuple[str, bytes]:
    data = _good_bytes(tmp_path)
    body_start = len(header())
    if kind == "cut-mid-frame":
        return kind, data[: body_start + (len(data) - body_start) * 2 // 3]
    if kind == "corrupted-bytes":
        pos = body_start + (len(data) - body_start) * 2 // 3
        return kind, data[:pos] + bytes(b ^ 0x5A for b in data[pos:pos + 40]) + data[pos + 40:]
    if kind == "length-prefix-4GiB-after-steps":
        z = zlib.compressobj()
        raw = z.compress(frames_bytes(GOOD[:len(GOOD) // 2])) + z.flush(zlib.Z_SYNC_FLUSH)
        raw += z.compress(wire.LEN.pack(0xFFFFFFFF) + b"\x00" * 100) + z.flush()
        return kind, header() + raw
    if kind == "nested-msgpack-after-steps":
        z = zlib.compressobj()
        raw = z.compress(frames_bytes(GOOD[:len(GOOD) // 2]))
        raw += z.compress(wire.LEN.pack(len(nested(50_000))) + nested(50_000)) + z.flush()
        return kind, header() + raw
    if kind == "trailing-garbage":
        return kind, data + b"\x00garbage" * 10
    raise AssertionError(kind)


DAMAGED = ["cut-mid-frame", "corrupted-bytes", "length-prefix-4GiB-after-steps",
           "nested-msgpack-after-steps", "trailing-garbage"]


@pytest.mark.parametrize("kind", DAMAGED)
def test_damaged_file_shows_what_came_before(tmp_path, kind):
    _, raw = _damaged(tmp_path, kind)
    p = tmp_path / f"{kind}.ddptui"
    p.write_bytes(raw)
    # what the reader itself says it could read, cross-checked against the original frames
    r = rankset.open_reader(str(p))
    read = [f for _, f in r]
    assert r.damage is not None
    assert read == GOOD[:len(read)]
    expected = _expected_rows(len(read))
    assert any(row["steps"] for row in expected)
    for v in ("summary", "replay-headless", "export"):
        (tmp_path / v).mkdir()
    runs = ddptui_many([VERBS[v](str(p), tmp_path / v) for v in ("summary", "replay-headless", "export")])
    for verb, res in zip(("summary", "replay-headless"), runs):
        out = tmp_path / verb / "out.json"
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("ddptui: warning: ") and str(p) in lines[0]
        assert "steps" in lines[0]
        doc = json.loads(out.read_text())
        assert doc["damage"] and doc["damage"] in lines[0]
        assert doc["strategies"] == expected
        assert doc["state"] == "incomplete"
        for row in expected:  # the table on stdout names each strategy with its step count
            assert row["strategy"] in res.stdout
    res = runs[2]
    assert res.returncode == 0 and "ddptui: warning: " in res.stderr
    trace = json.loads((tmp_path / "export" / "out.json").read_text())
    n_slices = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    assert n_slices == sum(len(f.kind) for f in read if type(f) is Spans)
    assert trace["otherData"]["damage"] == doc["damage"]


def test_cut_file_warning_names_the_steps_read(tmp_path):
    raw = _good_bytes(tmp_path)
    p = tmp_path / "cut.ddptui"
    p.write_bytes(raw[: len(raw) * 3 // 4])
    got = loader.load(str(p))
    res = run_main("summary", str(p))
    assert res.returncode == 0
    for s, ks in got.steps_read().items():
        assert f"{s} steps {ks[0]}–{ks[-1]}" in res.stderr
