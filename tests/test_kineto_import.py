"""`ddptui summary|replay|export DIR` where DIR holds torch.profiler (Kineto) traces, one per
rank: traces recorded here by torch.profiler (2 CPU ranks, gloo, real torchrun) and the real
A100 NCCL trace of tests/data with a rank 1 made from it (every time shifted by 250 µs)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess

import pytest

from ddptui.recording.kineto import KinetoReader
from ddptui.recording.loader import load
from ddptui.recording.rankset import open_reader as Reader
from ranks import frames, wire
from ranks.frames import Spans
from tests.helpers import ROOT, run_main
from tests.kineto_traces import a100_doc, a100_pair

# the model of tests/kineto_record.py: 4 blocks Linear(256, 256)+ReLU, then Linear(256, 10)
BLOCK, HEAD = 256 * 256 + 256, 256 * 10 + 10
LAYERS = ["Sequential_1", "Sequential_2", "Sequential_3", "Sequential_4", "Linear_4"]


@pytest.fixture(scope="module")
def kineto_runs(kineto_traces):
    """One real run (conftest's kineto_traces), profiled twice: with module records (as users
    record theirs), then without them: (its folder of traces, the plain folder)."""
    return kineto_traces["ddp"], kineto_traces["plain"]


@pytest.fixture
def cpu_traces(kineto_runs):
    return kineto_runs[0]


@pytest.fixture
def cpu_traces_plain(kineto_runs):
    return kineto_runs[1]


def _summary(d: str, tmp_path, name="s.json") -> dict:
    out = tmp_path / name
    p = run_main("summary", d, "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return json.loads(out.read_text())


def _spans_by_step(d: str) -> dict:
    """(rank, step) -> list of (kind, idx, t0 µs, t1 µs) from the frames the reader yields."""
    out = {}
    for _body, f in Reader(d):
        if type(f) is Spans:
            b = wire.decode_spans(f)
            out[(f.rank, f.step)] = list(zip(b.kind, b.idx, b.t0, b.t1))
    return out


@pytest.mark.slow
def test_cpu_gloo_traces_layers_steps_and_collectives(cpu_traces, tmp_path):
    assert len([n for n in os.listdir(cpu_traces) if n.endswith(".pt.trace.json")]) == 2
    doc = _summary(cpu_traces, tmp_path)
    assert doc["layers"] == LAYERS  # module records, forward order, the blocks' level
    assert doc["world_size"] == 2 and doc["backend"] == "gloo"
    assert doc["steps_read"] == {"ddp": 4}
    (s,) = doc["strategies"]
    assert s["allreduce_calls_per_step"] == 4  # DDP's buckets, gloo:all_reduce records
    assert s["bytes_per_step"] == 4 * (4 * BLOCK + HEAD)
    # issue order: the first bucket holds the head and the last block
    assert [b["bytes"] for b in s["buckets"]] == [4 * (BLOCK + HEAD), 4 * BLOCK, 4 * BLOCK, 4 * BLOCK]
    assert s["comm_ms"] > 0 and s["compute_ms"] > 0 and 0 <= s["overlap_pct"] <= 100
    assert s["stragglers"]["steps"] == 4
    spans = _spans_by_step(cpu_traces)
    assert sorted(spans) == [(r, k) for r in (0, 1) for k in (1, 2, 3, 4)]
    for sp in spans.values():
        fwd = sorted((t0, idx) for kind, idx, t0, _ in sp if kind == wire.FWD)
        assert [i for _, i in fwd] == [0, 1, 2, 3, 4]  # every layer, in forward order
        bwd = {idx for kind, idx, *_ in sp if kind == wire.BWD}
        assert bwd == {0, 1, 2, 3, 4}  # backward nodes given to their layers
        assert sum(1 for kind, *_ in sp if kind == wire.OPT) == 1
        (step,) = [x for x in sp if x[0] == wire.STEP]
        assert all(step[2] <= x[2] and x[3] <= step[3] for x in sp if x[0] in (wire.FWD, wire.BWD))


@pytest.mark.slow
def test_a_collective_still_open_when_the_profiler_stopped_keeps_its_bytes(cpu_traces, tmp_path):
    """torch 2.11 sometimes writes the last gloo:all_reduce of the last profiled step
    unfinished, without its input dims: its bytes come from the c10d op that issued it."""
    import shutil
    d = tmp_path / "open"
    shutil.copytree(cpu_traces, d)
    for name in [n for n in os.listdir(d) if n.endswith(".pt.trace.json")]:
        doc = json.loads((d / name).read_text())
        last = max((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("gloo:")),
                   key=lambda e: e["ts"])
        for k in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            last.get("args", {}).pop(k, None)
        last.setdefault("args", {})["finished"] = False
        (d / name).write_text(json.dumps(doc))
    def sizes(path):  # the collectives' sizes of each step where they change
        return {(f.rank, f.step): [n for _, _, n in f.buckets]
                for _, f in Reader(path) if type(f) is frames.Buckets}
    assert sizes(str(d)) == sizes(cpu_traces)  # the last step's last collective included


@pytest.mark.slow
def test_cpu_traces_without_module_records_one_layer(cpu_traces_plain, tmp_path):
    doc = _summary(cpu_traces_plain, tmp_path)
    assert doc["layers"] == ["model"]
    assert doc["strategies"][0]["allreduce_calls_per_step"] == 4
    assert doc["steps_read"] == {"ddp": 4}


@pytest.mark.slow
def test_cpu_traces_replay_headless_and_export(cpu_traces, tmp_path):
    p = run_main("replay", cpu_traces, "--headless")
    assert p.returncode == 0 and "ddp" in p.stdout, p.stderr
    out = tmp_path / "t.json"
    p = run_main("export", cpu_traces, "-o", str(out))
    assert p.returncode == 0, p.stderr
    evs = json.loads(out.read_text())["traceEvents"]
    assert {e.get("pid") for e in evs if e.get("ph") == "X"} >= {0, 1} or len(evs) > 50


def _nccl_per_step(doc: dict) -> list[float]:
    """Rank 0's NCCL kernel time (ms) per ProfilerStep, straight from the JSON."""
    evs = doc["traceEvents"]
    ext_ts = {e["args"]["External id"]: e["ts"] for e in evs
              if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("name", "").startswith("ProfilerStep#"))
    out = [0.0] * len(steps)
    for e in evs:
        if e.get("cat") == "kernel" and e["name"].startswith(("ncclKernel_", "ncclDevKernel_")):
            t = ext_ts[e["args"]["External id"]]
            i = next(i for i, (a, b) in enumerate(steps) if a <= t <= b)
            out[i] += e["dur"] / 1000
    return out


def test_a100_nccl_traces(tmp_path):
    d = a100_pair(str(tmp_path / "gpu"), shift_us=250.0)
    doc = _summary(d, tmp_path)
    assert doc["steps_read"] == {"ddp": 3} and doc["backend"] == "nccl"
    (s,) = doc["strategies"]
    # 5 DDP buckets; DDP's 2 buffer broadcasts in its forward are other collectives (COLL)
    assert s["allreduce_calls_per_step"] == 5 and s["collective_calls_per_step"] == 2
    assert {(c["op"], c["phase"], c["calls_per_step"]) for c in s["collectives"]} == {
        ("broadcast", "forward", 2), ("all_reduce", "backward", 5)}
    per_step = _nccl_per_step(a100_doc())
    expect = (per_step[1] + per_step[2]) / 2  # the median of the steps after the first
    assert s["comm_ms"] == pytest.approx(expect, rel=0.05)
    assert 0 < s["compute_ms"] < s["step_ms_median"]
    # rank 1 is rank 0 250 µs later: it is the last to arrive at every collective
    assert s["stragglers"]["last_arriver_rank"] == 1
    assert s["stragglers"]["last_arriver_pct"] == 100.0
    spans = _spans_by_step(d)
    for (r, k), sp in spans.items():
        kinds = {x[0] for x in sp}
        assert {wire.FWD, wire.BWD, wire.COMM, wire.COLL, wire.OPT, wire.STEP} <= kinds, (r, k)
    r0 = {k: sp for (r, k), sp in spans.items() if r == 0}
    r1 = {k: sp for (r, k), sp in spans.items() if r == 1}
    for k in r0:  # same work, 250 µs later
        a = sorted(x[2] for x in r0[k] if x[0] in wire.COMM_KINDS)
        b = sorted(x[2] for x in r1[k] if x[0] in wire.COMM_KINDS)
        assert a == b  # relative to each frame's own base


def test_any_json_formatting_reads_the_same(tmp_path):
    """A trace written on one line (not torch's formatting) goes through ijson: same figures."""
    d1 = a100_pair(str(tmp_path / "a"), gz=False)
    d2 = tmp_path / "b"
    d2.mkdir()
    for n in os.listdir(d1):
        doc = json.load(open(os.path.join(d1, n)))
        (d2 / n).write_text(json.dumps(doc))
    assert _summary(d1, tmp_path, "1.json")["strategies"] == _summary(str(d2), tmp_path, "2.json")["strategies"]


def _bad(tmp_path, files: dict) -> subprocess.CompletedProcess:
    d = tmp_path / "bad"
    d.mkdir(parents=True)
    for n, data in files.items():
        (d / n).write_bytes(data)
    p = run_main("summary", str(d))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error:"), p.stderr
    return p


def _gz(doc: dict) -> bytes:
    return gzip.compress(json.dumps(doc).encode(), compresslevel=1)  # (fast; read the same)


def test_bad_traces_one_line(tmp_path):
    # the A100 trace's first step only (and its metadata): each fault below is found by reading
    # a whole trace (its 40,000 events read again each time took most of this test's time)
    full = a100_doc()
    step = min((e for e in full["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
               key=lambda e: e["ts"])
    doc = dict(full, traceEvents=[e for e in full["traceEvents"] if e.get("ph") == "M"
                                  or step["ts"] <= e.get("ts", -1) <= step["ts"] + step["dur"]])
    no_dist = {k: v for k, v in doc.items() if k != "distributedInfo"}
    assert "no distributedInfo" in _bad(tmp_path / "1", {"r0.json.gz": _gz(no_dist)}).stderr
    assert "no trace of rank 1" in _bad(tmp_path / "2", {"r0.json.gz": _gz(doc)}).stderr
    assert "not a readable" in _bad(tmp_path / "3", {"r0.json": b"{not json at all"}).stderr
    _bad(tmp_path / "4", {"r0.json": b'{"hello": 1}'})
    raw = gzip.decompress(open(os.path.join(ROOT, "tests/data/hta_nccl_a100.json.gz"), "rb").read())
    raw = raw[:len(raw) // 40]  # (torch's formatting, cut inside its events)
    assert "ends inside" in _bad(tmp_path / "5", {"r0.json": raw}).stderr
    two = {"r0.json.gz": _gz(doc), "r1.json.gz": _gz(doc)}
    assert "two traces of rank 0" in _bad(tmp_path / "6", two).stderr


def test_loaded_store_is_a_run(tmp_path):
    """The traces enter through the one door: load() gives a Store like a recording's."""
    got = load(a100_pair(str(tmp_path / "g")))
    assert got.store.complete_steps("ddp") == [4, 5, 6]
    assert isinstance(Reader(str(tmp_path / "g")), KinetoReader)
