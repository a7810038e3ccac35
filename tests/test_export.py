"""`ddptui export`: Chrome trace event format, checked against the documented format.

PyPI `perfetto`'s TraceProcessor cannot run here: it downloads its trace_processor_shell
binary at first use, and this machine has no network beyond package registries. So the
export is validated against the Trace Event Format document instead (JSON object form):
a `traceEvents` list; every event has `ph`, `pid`/`tid` ints; complete events ("X") have
`name`, `ts` and `dur` >= 0 (µs, numbers); instant events ("i") have `s` in g/p/t;
metadata events ("M") name processes and threads; slices on one thread nest properly.
"""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from ddptui.recording import rankset
from ranks import spec, wire
from ranks.frames import Spans, spans_frame

from .helpers import DEMO, ROOT, run_cli, run_main, synthetic_frames, synthetic_meta, write_recording

LANE_OF_KIND = {wire.STEP: "step", wire.FWD: "compute", wire.BWD: "compute",
                wire.COMM: "communication", wire.OPT: "optimizer"}


def validate_trace(doc) -> dict:
    """Check a trace against the Trace Event Format; returns {(pid, tid): thread name} and
    {pid: process name}. Raises AssertionError with the offending event."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    procs, threads = {}, {}
    last_ts: dict[tuple[int, int], float] = {}
    open_ends: dict[tuple[int, int], list[float]] = {}
    for ev in doc["traceEvents"]:
        assert isinstance(ev, dict), ev
        ph = ev.get("ph")
        assert isinstance(ph, str) and len(ph) == 1, ev
        for k in ("pid", "tid"):
            assert isinstance(ev.get(k), int) and not isinstance(ev[k], bool) and ev[k] >= 0, ev
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        if "args" in ev:
            assert isinstance(ev["args"], dict), ev
        if ph == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name",
                                  "thread_sort_index", "process_labels"), ev
            if ev["name"] == "process_name":
                assert isinstance(ev["args"]["name"], str)
                procs[ev["pid"]] = ev["args"]["name"]
            elif ev["name"] == "thread_name":
                assert isinstance(ev["args"]["name"], str)
                threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
            elif ev["name"].endswith("sort_index"):
                assert isinstance(ev["args"]["sort_index"], int)
            continue
        assert ph in ("X", "i"), ev  # all this exporter writes besides metadata
        ts = ev.get("ts")
        assert isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts >= 0, ev
        key = (ev["pid"], ev["tid"])
        assert ts >= last_ts.get(key, 0.0), f"ts goes back on thread {key}: {ev}"
        last_ts[key] = ts
        if ph == "X":
            dur = ev.get("dur")
            assert isinstance(dur, (int, float)) and not isinstance(dur, bool) and dur >= 0, ev
            stack = open_ends.setdefault(key, [])
            while stack and stack[-1] <= ts + 1e-6:
                stack.pop()
            assert not stack or ts + dur <= stack[-1] + 1e-6, f"slice overlaps its parent: {ev}"
            stack.append(ts + dur)
        else:
            assert ev.get("s", "t") in ("g", "p", "t"), ev
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(threads), f"threads without a name: {used - set(threads)}"
    assert {p for p, _ in used} <= set(procs)
    json.dumps(doc)  # plain JSON types only
    return {"procs": procs, "threads": threads}


def recording_counts(path) -> Counter:
    """(rank, lane) -> spans, straight from the recording."""
    c = Counter()
    for _, f in rankset.open_reader(str(path)):
        if type(f) is Spans:
            b = wire.decode_spans(f)
            for k in b.kind:
                c[(b.rank, LANE_OF_KIND[k])] += 1
    return c


def trace_counts(doc, names) -> Counter:
    c = Counter()
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            proc = names["procs"][e["pid"]]
            rank = int(proc.split()[1])
            lane = names["threads"][(e["pid"], e["tid"])].split(" ")[0]
            c[(rank, lane)] += 1
    return c


@pytest.fixture
def synthetic(tmp_path):
    strategies = ("naive", "interleaved", "ddp", "single")
    frames = synthetic_frames(steps=5, world=3, strategies=strategies, cap_change_at=3)
    p = tmp_path / "syn.ddptui"
    write_recording(p, frames, synthetic_meta(world=3, strategies=strategies))
    return p, frames


def test_export_validates_and_counts_match(tmp_path, synthetic):
    p, frames = synthetic
    out = tmp_path / "trace.json"
    res = run_main("export", str(p), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stderr == "" and "wrote" in res.stdout
    doc = json.loads(out.read_text())
    names = validate_trace(doc)
    assert trace_counts(doc, names) == recording_counts(p)
    assert sorted(names["procs"].values()) == ["rank 0 (cpu)", "rank 1 (cpu)", "rank 2 (cpu)"]
    lanes = {n for n in names["threads"].values()}
    assert {"compute", "communication", "optimizer", "step"} <= lanes


def test_args_and_one_time_axis(tmp_path, synthetic):
    p, frames = synthetic
    out = tmp_path / "trace.json"
    assert run_main("export", str(p), "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    params = spec.param_table("small")
    span_frames = [f for f in frames if type(f) is Spans]
    origin = min(f.base_ns for f in span_frames)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # every step slice starts at its frame's base on the shared clock
    steps = {(e["args"]["rank"], e["args"]["strategy"], e["args"]["step"]): e
             for e in xs if e["cat"] == "step"}
    for f in span_frames:
        b = wire.decode_spans(f)
        e = steps[(b.rank, b.strategy, b.step)]
        i = list(b.kind).index(wire.STEP)
        assert e["ts"] == pytest.approx((f.base_ns - origin) / 1000 + b.t0[i], abs=1e-3)
        assert e["dur"] == pytest.approx(b.t1[i] - b.t0[i], abs=1e-3)
    for e in xs:
        a = e["args"]
        assert a["strategy"] in ("naive", "interleaved", "ddp", "single") and isinstance(a["step"], int)
        if e["cat"] == "compute":
            assert a["layer"] in spec.layer_names("small") and a["layer"] in e["name"]
        if e["cat"] == "communication":
            if a["strategy"] == "ddp":
                assert isinstance(a["bucket"], int) and a["params"]
                assert a["bytes"] == sum(params[[n for n, _, _ in params].index(pn)][1] * 4
                                         for pn in a["params"])
            else:
                name, numel, layer = next(q for q in params if q[0] == a["param"])
                assert a["bytes"] == numel * 4 and a["layer"] == f"fc{layer + 1}"
            assert a["queued_us"] >= 0
    # the bucket-cap change at step 3: an instant on each rank at the start of DDP step 3
    inst = [e for e in doc["traceEvents"] if e["ph"] == "i" and "bucket_cap_mb" in e["name"]]
    assert len(inst) == 3
    for e in inst:
        assert e["args"]["bucket_cap_mb"] == 1.0 and e["args"]["step"] == 3
        step = steps[(e["args"]["rank"], "ddp", 3)]
        assert e["ts"] == step["ts"] and e["pid"] == step["pid"]
    # after it, DDP AllReduces carry the new (smaller) buckets
    before = {e["args"]["bucket"] for e in xs if e["cat"] == "communication"
              and e["args"]["strategy"] == "ddp" and e["args"]["step"] == 2}
    after = {e["args"]["bucket"] for e in xs if e["cat"] == "communication"
             and e["args"]["strategy"] == "ddp" and e["args"]["step"] == 4}
    assert len(after) > len(before)
    assert doc["otherData"]["model"] == "small" and doc["otherData"]["world"] == 3


@pytest.mark.skipif(not os.path.exists(DEMO), reason="demo recording not present")
def test_export_of_a_real_recording(tmp_path):
    out = tmp_path / "demo.json"
    res = run_cli("export", DEMO, "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    names = validate_trace(doc)
    assert trace_counts(doc, names) == recording_counts(DEMO)


def test_partly_overlapping_slices_go_to_an_extra_lane(tmp_path):
    """Two AllReduces that partly overlap cannot nest on one thread: the second one moves."""
    meta = synthetic_meta()
    base = 10_000_000
    f = spans_frame(0, "naive", 0, base, [wire.STEP, wire.COMM, wire.COMM], [0, 0, 1],
                    [base, base + 1000_000, base + 2000_000],
                    [base + 9000_000, base + 3000_000, base + 4000_000],
                    [base + 1000_000, base + 2000_000])
    hello = synthetic_frames(steps=0)[1]
    p = tmp_path / "ov.ddptui"
    write_recording(p, [hello, f], meta)
    out = tmp_path / "t.json"
    assert run_main("export", str(p), "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    names = validate_trace(doc)
    comm = [names["threads"][(e["pid"], e["tid"])] for e in doc["traceEvents"]
            if e["ph"] == "X" and e["cat"] == "communication"]
    assert comm == ["communication", "communication 2"]


def test_export_to_stdout_and_default_name(tmp_path, synthetic):
    p, _ = synthetic
    res = run_main("export", str(p), "-o", "-")
    assert res.returncode == 0
    validate_trace(json.loads(res.stdout))
    res = run_main("export", str(p), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    validate_trace(json.loads((tmp_path / "syn.trace.json").read_text()))


def test_a_directory_given_with_a_trailing_slash_is_named_by_its_name(tmp_path):
    """`ddptui export DIR/` (a shell completes a directory so) wrote `.trace.json`, a hidden file."""
    res = run_main("export", os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo") + "/", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert os.listdir(tmp_path) == ["fr-hang-2ranks-gloo.trace.json"]
    validate_trace(json.loads((tmp_path / "fr-hang-2ranks-gloo.trace.json").read_text()))
    res = run_main("export", os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo") + "/", "--format", "kineto", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "fr-hang-2ranks-gloo.kineto")) == ["rank0.json", "rank1.json"]


def test_unwritable_output_is_one_error_line(tmp_path, synthetic):
    p, _ = synthetic
    res = run_main("export", str(p), "-o", str(tmp_path / "no" / "such" / "dir" / "t.json"))
    assert res.returncode == 2
    assert res.stderr.startswith("ddptui: error: -o ") and len(res.stderr.splitlines()) == 1


def test_exported_file_has_ordinary_permissions(tmp_path, synthetic):
    out = tmp_path / "perm.json"
    res = run_main("export", str(synthetic[0]), "-o", str(out))
    assert res.returncode == 0, res.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_exports_name_a_user_models_layers_from_its_hello(tmp_path):
    """A user's script under `ddptui run` writes a header without layer or parameter names;
    rank 0's hello has them. The Chrome trace, the Kineto traces and the summary name the
    layers by module ('forward blocks.0'), as the JSON and the UI do, never 'layer 3'."""
    import msgspec

    from ranks.frames import Hello

    names = ["embed", "blocks.0", "blocks.1", "head"]
    params = [(f"{names[li]}.{name.rsplit('.', 1)[1]}", e, li) for name, e, li in spec.param_table("small")]
    frames = []
    for f in synthetic_frames(steps=4, model="small", strategies=("ddp",)):
        if type(f) is Hello:  # small has 4 layers: the user model's names in their place
            f = msgspec.structs.replace(f, model="train.py", layers=names, params=params)
        frames.append(f)
    meta = {k: v for k, v in synthetic_meta(strategies=("ddp",)).items() if k not in ("layers", "params")}
    meta["model"] = "train.py"
    rec = tmp_path / "user.ddptui"
    write_recording(rec, frames, meta=meta)
    out = tmp_path / "t.json"
    assert run_main("export", str(rec), "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    compute = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "compute"}
    assert compute == {f"{p} {n}" for p in ("forward", "backward") for n in names}, compute
    assert doc["otherData"]["layers"] == names
    comm = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "communication"]
    assert comm and all(set(e["args"]["layer"]) <= set(names) for e in comm)
    assert all(p.startswith(tuple(names)) for e in comm for p in e["args"]["params"])
    kdir = tmp_path / "kineto"
    r = run_main("export", str(rec), "--format", "kineto", "-o", str(kdir))
    assert r.returncode == 0, r.stderr
    kernels = {e["name"] for e in json.loads((kdir / "rank0.json").read_text())["traceEvents"]
               if e.get("cat") == "kernel" and not e["name"].startswith(("nccl", "optimizer"))}
    assert kernels == {f"{p} {n}" for p in ("forward", "backward") for n in names}, kernels
    r = run_main("summary", str(rec), "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0 and "layer 1" not in r.stdout
    assert json.loads((tmp_path / "s.json").read_text())["layers"] == names
