"""Pipelines under `ddptui run --auto` (real torchrun, 2 gloo CPU ranks, nothing of ddptui in
the script: tests/scripts/pipeline.py, torch.distributed.pipelining's PipelineStage and a
schedule). A step is the optimizer's (one schedule step() of M microbatches); each microbatch's
forward and backward on a stage is an MB span (its stage, number and part: F, B, or a
zero-bubble schedule's I and W halves); the schedule's step() a PIPE span; the P2P sends and
receives COLL spans by direction and peer; the bubble each rank's share of its PIPE span with
no microbatch running, beside the schedule's plan; a stage slower than the others named.
"""
from __future__ import annotations

import json
import re

import pytest

from ranks import wire
from tests.helpers import SPAN_COLL, run_main, run_script, spans_of, step_batches

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pipelining")]

ITERS = 10
M = 4  # microbatches a step
MB_ROWS = 16  # samples a microbatch (the script's)


@pytest.fixture(scope="module")
def one_f1b_hung(tmp_path_factory):
    """1F1B, 2 stages, stage 1's blocks running twice (the slow stage), recorded: ITERS
    iterations, then stage 0's forward of the third microbatch of the next one never ends (a
    hung stage, its neighbour waiting in a send); Ctrl-C once the run has named the hang (or
    after 120 s). The steps before it are the 1F1B tests' (the first not drawn: ITERS - 1),
    the hang the hung-stage test's (one launch for both): {"doc", "got", "out", "rec", "lines",
    "hang"} (the JSON, the recording loaded, stdout, its path, the stderr lines, the line naming
    the hang)."""
    import os
    import signal
    import subprocess
    import threading
    import time

    from ddptui.recording.loader import load
    from tests.helpers import ROOT, assert_no_leftovers, start_cli
    d = tmp_path_factory.mktemp("1f1b")
    rec, js = d / "run.ddptui", d / "run.json"
    p = start_cli("run", "--auto", "--headless", "--nproc-per-node", "2", "--record", str(rec), "--json", str(js),
                  "--", os.path.join(ROOT, "tests", "scripts", "pipeline.py"), "--schedule", "1f1b",
                  "--microbatches", str(M), "--iters", str(ITERS + 1), "--slow-stage", "1",
                  "--hang-stage", "0", "--hang-at", str(ITERS),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(ln.rstrip("\n") for ln in p.stderr), daemon=True),
               threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)]
    for t in readers:
        t.start()
    try:  # (the hang's line: one of a stall the machine's load made before it would not name
        # rank 1 inside a send; the run goes on after such a stall, and so does the wait here)
        deadline, hang = time.monotonic() + 120, None
        while time.monotonic() < deadline and hang is None and p.poll() is None:
            hang = next((ln for ln in list(lines) if "no progress for" in ln and "rank 1 inside send" in ln), None)
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait(10)
    for t in readers:
        t.join(5)
    assert_no_leftovers()
    assert hang is not None, "no line named the hung stage (rank 1 inside a send):\n" + "\n".join(lines[-30:])
    assert rc == 130, f"exit {rc} after Ctrl-C, not 130:\n" + "\n".join(lines[-30:])
    return {"doc": json.loads(js.read_text()), "got": load(str(rec)), "out": "".join(out), "rec": rec,
            "lines": lines, "hang": hang}


@pytest.fixture(scope="module")
def one_f1b(one_f1b_hung):
    """The 1F1B run's steps before its hang: (the JSON, the recording loaded, stdout, its path)."""
    r = one_f1b_hung
    return r["doc"], r["got"], r["out"], r["rec"]


@pytest.fixture(scope="module")
def zbv_run(tmp_path_factory):
    """ZBV zero bubble: 4 stages in a V (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2),
    each backward split into its input-grad and weight-grad halves."""
    d = tmp_path_factory.mktemp("zbv")
    return run_script(d, "pipeline.py", "--schedule", "zbv", "--microbatches",
                      str(M), "--iters", "8", "--blocks", "8") + (d / "run.ddptui",)


@pytest.fixture(scope="module")
def zbv(zbv_run):
    return zbv_run[:3]


@pytest.fixture(scope="module")
def zbv_rec(zbv_run):
    return zbv_run[3]


def microbatches(b) -> list[tuple[int, int, str, int, int]]:
    """(stage, microbatch, part letter, start ns, end ns) of a batch's MB spans, in time order
    (absolute ns: the ranks share the host's clock)."""
    out = []
    for i in range(len(b.kind)):
        if b.kind[i] == wire.MB:
            s, mb, p = wire.mb_of(b.idx[i])
            out.append((s, mb, wire.MB_PARTS[p], b.base_ns + 1000 * b.t0[i], b.base_ns + 1000 * b.t1[i]))
    return sorted(out, key=lambda x: x[3])


def test_1f1b_microbatches_are_on_their_stage_in_the_schedules_order(one_f1b):
    """Each step, on each rank: its own stage's M forwards and M backwards, once each, in
    1F1B's order (stage 0: two forwards of warm-up, then one backward one forward; stage 1
    alternates); a microbatch's forward on stage 1 starts after it ended on stage 0, and its
    backward on stage 0 after it ended on stage 1. A step is an optimizer step, not a
    microbatch; the global batch is the first stage's samples, counted once."""
    doc, got, _, _ = one_f1b
    (row,) = doc["strategies"]
    assert row["strategy"] == "1f1b", row
    assert row["steps"] == ITERS - 1, row
    assert doc["batch"] == M * MB_ROWS, doc["batch"]
    want = {0: ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
            1: ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]}
    batches = step_batches(got, "1f1b")
    assert sorted(batches) == list(range(ITERS - 1)), sorted(batches)
    for k, ranks in batches.items():
        assert sorted(ranks) == [0, 1], (k, sorted(ranks))
        mbs = {r: microbatches(b) for r, b in ranks.items()}
        for r, got_r in mbs.items():
            assert {s for s, *_ in got_r} == {r}, (k, r, got_r)
            assert [f"{p}{mb}" for _, mb, p, _, _ in got_r] == want[r], (k, r, got_r)
        at = {(r, p, mb): (a, z) for r, ms in mbs.items() for _, mb, p, a, z in ms}
        for mb in range(M):
            assert at[(1, "F", mb)][0] >= at[(0, "F", mb)][1], (k, mb, "forward on stage 1 before stage 0's")
            assert at[(0, "B", mb)][0] >= at[(1, "B", mb)][1], (k, mb, "backward on stage 0 before stage 1's")


def test_sends_and_receives_are_communication_by_direction_and_peer(one_f1b):
    """The P2P ops are COLL spans, never inside a microbatch (not compute): rank 0 sends
    activations forward to 1 and receives gradients back from it; rank 1 the reverse; M of
    each a step."""
    doc, got, _, _ = one_f1b
    tables = got.store.collective_tables("1f1b")
    named = {r: {(row[1], row[4].split("@")[-1] if "@" in row[4] else row[4], row[6]) for row in t.values()}
             for r, t in tables.items()}
    assert ("send", "world>1", "forward") in named[0] and ("recv", "world<1", "backward") in named[0], named[0]
    assert ("recv", "world<0", "forward") in named[1] and ("send", "world>0", "backward") in named[1], named[1]
    for k, ranks in step_batches(got, "1f1b").items():
        for r, b in ranks.items():
            colls = spans_of(b, SPAN_COLL)
            assert len(colls) == 2 * M, (k, r, len(colls))
            mbs = [(b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == wire.MB]
            for _, t0, _ in colls:
                assert not any(a < t0 < z for a, z in mbs), (k, r, t0, "a send or receive issued inside a microbatch")
    (row,) = doc["strategies"]
    ops = {(c["op"], c["phase"]) for c in row["collectives"]}
    assert {("send", "forward"), ("recv", "forward"), ("send", "backward"), ("recv", "backward")} <= ops, ops


def test_the_bubble_is_measured_beside_the_plan_and_waits_for_the_slow_stage(one_f1b):
    """Per rank, the bubble is the share of its schedule step with no microbatch running
    (recomputed here from the spans); the plan is 1F1B's (p - 1) / (m + p - 1) = 20 %; the
    fast stage waits for the slow one (its bubble the larger), and the summary names rank 1,
    stage 1, as the one the bubble waits for."""
    from ddptui.model.figures import union_length
    doc, got, out, _ = one_f1b
    (row,) = doc["strategies"]
    pp = row["pipeline"]
    assert pp["schedule"] == "1f1b" and pp["stages"] == 2 and pp["microbatches"] == M, pp
    assert pp["plan_pct"] == {"0": 20.0, "1": 20.0}, pp
    ks = sorted(step_batches(got, "1f1b"))[1:]
    for r in (0, 1):
        mine = []
        for k in ks:
            b = step_batches(got, "1f1b")[k][r]
            pipe = [(b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == wire.PIPE]
            assert len(pipe) == 1, (k, r, pipe)
            (pa, pz), = pipe
            busy = union_length([(max(a, pa), min(z, pz)) for (_, _, _, a, z) in
                                 [(0, 0, 0, b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == wire.MB]])
            mine.append(100.0 * (pz - pa - busy) / (pz - pa))
        import statistics
        assert pp["ranks"][str(r)]["bubble_pct"] == pytest.approx(statistics.median(mine), abs=0.2), (r, pp)
        assert pp["ranks"][str(r)]["microbatches"] == M, pp
    assert pp["ranks"]["0"]["bubble_pct"] > pp["ranks"]["1"]["bubble_pct"], pp
    slow = pp["slowest"]
    # (stage 1 runs its blocks twice: ~2x on a quiet machine; 1.26 seen with four test workers
    # on the two cores, each rank's busy time stretched by the others' processes)
    assert slow["rank"] == 1 and slow["stages"] == [1] and slow["ratio"] >= 1.15, slow
    assert all(name.startswith("s1.") for name, _ in slow["layers"]), slow
    assert "pipeline 1f1b: 2 stages × 4 microbatches · bubble r0 " in out, out[-3000:]
    assert "(plan 20 %) · the bubble waits for rank 1 (stage 1)" in out, out[-3000:]
    assert row["bubble_pct"] > 0, row
    # a pipeline's ranks hold other layers under one index: no layer compared across ranks
    st = row["stragglers"]
    assert st["evidence"] is None and st["culprit"] == "" and st["culprit_layer"] is None, st
    assert "1f1b: " in out and "· a pipeline: no layer compared across its stages" in out, out[-3000:]


def test_each_rank_names_its_own_layers_and_the_exports_show_each_microbatch(one_f1b, tmp_path):
    """The run's layers are positions ("block 0" is each rank's first block), each rank's own
    names stage-prefixed in the pipeline's description; the Chrome export has each
    microbatch as a slice named as pipeline diagrams write it (F0 ... B3), M forwards and M
    backwards a rank and step, on a track of their own."""
    _, got, _, rec = one_f1b
    layers = got.store.meta.layers
    assert layers and all(n.startswith("block ") for n in layers), layers
    own = got.store.meta.pipeline["rank_layers"]
    assert all(n.startswith("s0.") for n in own["0"]) and all(n.startswith("s1.") for n in own["1"]), own
    trace = tmp_path / "t.json"
    r = run_main("export", str(rec), "--format", "chrome", "-o", str(trace))
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    per = {}
    for e in events:
        if e.get("cat") == "microbatches" and e["name"] != "schedule step":
            a = e["args"]
            per.setdefault((a["rank"], a["step"]), []).append(e["name"])
    assert len(per) == 2 * ITERS - 2 or len(per) == 2 * ITERS, sorted(per)
    for key, names in per.items():
        assert sorted(names) == sorted([f"F{i}" for i in range(M)] + [f"B{i}" for i in range(M)]), (key, names)


def test_a_zero_bubble_v_schedule_splits_each_backward_on_two_stages_a_rank(zbv):
    """ZBV: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; every stage runs each
    microbatch's forward once and its backward as an input-grad and a weight-grad half (or
    whole, where the schedule does it whole); the plan is the schedule's own, by rank."""
    doc, got, out = zbv
    (row,) = doc["strategies"]
    assert row["strategy"] == "zbv" and row["steps"] == 7, row
    assert doc["batch"] == M * MB_ROWS, doc["batch"]
    pipe = got.store.meta.pipeline
    assert pipe["rank_stages"] == {"0": [0, 3], "1": [1, 2]}, pipe
    assert pipe["stages"] == 4 and pipe["microbatches"] == M and len(pipe["plan_idle"]) == 2, pipe
    split = 0
    for k, ranks in step_batches(got, "zbv").items():
        for r, b in ranks.items():
            ms = microbatches(b)
            for st in pipe["rank_stages"][str(r)]:
                for mb in range(M):
                    parts = sorted(p for s, m, p, _, _ in ms if s == st and m == mb)
                    assert parts in (["B", "F"], ["F", "I", "W"]), (k, r, st, mb, parts)
                    split += parts == ["F", "I", "W"]
    assert split, "no backward was split into its input-grad and weight-grad halves"
    assert "pipeline zbv: 4 stages × 4 microbatches · bubble r0 " in out, out[-3000:]


def test_whatif_predicts_other_microbatch_counts_and_schedules(one_f1b, tmp_path):
    """`ddptui whatif` on a 1F1B recording: the model at the recorded configuration beside the
    measured step, then GPipe and 1F1B at half, the same, twice and four times the
    microbatches (the same global batch), 1F1B never below the stages' count; its JSON the
    same; --world on a pipeline says what a pipeline's options are, exit 2."""
    rec = one_f1b[3]
    r = run_main("whatif", str(rec), "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["measured"]["schedule"] == "1f1b" and doc["measured"]["microbatches"] == M, doc["measured"]
    assert doc["at_recorded"]["microbatches"] == M and doc["at_recorded"]["step_ms"] > 0, doc["at_recorded"]
    got = [(p["schedule"], p["microbatches"]) for p in doc["predictions"]]
    assert got == [("gpipe", 2), ("gpipe", 4), ("gpipe", 8), ("gpipe", 16),
                   ("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("1f1b", 16),
                   ("interleaved1f1b", 2), ("interleaved1f1b", 4), ("interleaved1f1b", 8),
                   ("interleaved1f1b", 16)], got
    assert all(len(p["bubble_pct"]) == 2 for p in doc["predictions"]), doc["predictions"]
    inter = {p["microbatches"]: p for p in doc["predictions"] if p["schedule"] == "interleaved1f1b"}
    one = {p["microbatches"]: p for p in doc["predictions"] if p["schedule"] == "1f1b"}
    assert all(p["stages_a_rank"] == 2 for p in inter.values()), inter
    assert all(inter[m]["plan_pct"] < one[m]["plan_pct"] for m in inter), (inter, one)  # (a smaller bubble)
    r = run_main("whatif", str(rec), "--microbatches", "8", "--schedule", "gpipe")
    assert r.returncode == 0 and "the model at it" in r.stdout and "gpipe" in r.stdout, r.stdout
    r = run_main("whatif", str(rec), "--world", "4")
    assert r.returncode == 2 and "--microbatches, --schedule" in r.stderr, r.stderr
    # three stages a rank where a rank holds three blocks: the rows that cannot run are said
    r = run_main("whatif", str(rec), "--schedule", "loopedbfs,interleaved1f1b", "--virtual-stages", "3",
                 "--microbatches", "4,5")
    assert r.returncode == 0, r.stderr
    assert "loopedbfs ×3" in r.stdout and "not predicted: interleaved1f1b at 5 microbatches: torch's interleaved " \
        "1F1B runs its microbatches in rounds of about 2 (the ranks): 5 // 2 = 2 rounds, and 5 is not a multiple of 2 " \
        "(try 4 or 6)" in r.stdout, r.stdout
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"  (loopedbfs|interleaved1f1b) ", ln)]
    assert len(rows) == 3 and len({ln.index(" ms") if " ms" in ln else len(ln) for ln in rows}) == 1, rows  # (aligned)
    # nothing left to predict: one line, exit 2
    r = run_main("whatif", str(rec), "--virtual-stages", "4", "--schedule", "interleaved1f1b")
    assert r.returncode == 2 and "nothing to predict" in r.stderr and "holds 3 block(s): not 4 stages' worth" in r.stderr, \
        (r.stdout, r.stderr)


def test_whatif_on_a_v_schedule_says_what_it_predicts_in_one_line(zbv_rec):
    """A schedule of several stages a rank (ZBV): one line saying what whatif predicts, exit 2."""
    r = run_main("whatif", str(zbv_rec))
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "predicts from a recording of one stage a rank (GPipe or 1F1B, from which" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not r.stdout.strip(), r.stdout


def test_the_pipeline_model_meets_the_plan_where_the_plan_holds():
    """Equal stages, a forward as long as a backward, free transfers: GPipe's and 1F1B's step
    is 2(m + p - 1) actions and every stage's bubble (p - 1) / (m + p - 1), as the plan says;
    a hop adds to the step; a slower stage makes the others wait."""
    from ddptui.model import pipewhatif as pw
    for p in (2, 4):
        for m in (4, 8):
            meas = pw.PipeMeasured(p, m, [1.0] * p, [1.0] * p, 0.0, 0.0, 0.0, "1f1b")
            for sched in pw.SCHEDULES:
                got = pw.simulate(meas, sched, m)
                assert got.step_ms == pytest.approx(2 * (m + p - 1)), (p, m, sched, got)
                assert got.bubble_pct == [pytest.approx(100.0 * (p - 1) / (m + p - 1), abs=0.05)] * p, (p, m, sched, got)
    slow = pw.PipeMeasured(2, 4, [1.0, 2.0], [1.0, 2.0], 0.5, 3.0, 0.0, "1f1b")
    got = pw.simulate(slow, "1f1b", 4)
    assert got.step_ms > 2 * 4 * 2 + 3.0 and got.bubble_pct[0] > got.bubble_pct[1], got
    # v stages a rank (interleaved 1F1B), each 1/v of the rank's work: the bubble shrinks v-fold,
    # the step 2m + 2(p - 1)/v, as Megatron-LM's paper has it; looped BFS keeps GPipe's order of
    # a stage's microbatches, so its bubble is no smaller than interleaved's
    for p in (2, 4):
        for v in (2, 3):
            for m in (4, 8):
                meas = pw.PipeMeasured(p, m, [1.0] * p, [1.0] * p, 0.0, 0.0, 0.0, "1f1b")
                got = pw.simulate_multi(meas, "interleaved1f1b", m, v)
                assert got.step_ms == pytest.approx(2 * m + 2 * (p - 1) / v), (p, v, m, got)
                assert got.bubble_pct == [pytest.approx(100.0 * (p - 1) / (v * m + p - 1), abs=0.05)] * p, got
                looped = pw.simulate_multi(meas, "loopedbfs", m, v)
                assert looped.step_ms >= got.step_ms - 1e-9, (p, v, m, looped, got)
    # a hop between stages costs more the more stages there are
    hop = pw.PipeMeasured(2, 4, [1.0, 1.0], [1.0, 1.0], 0.5, 0.0, 0.0, "1f1b")
    assert pw.simulate_multi(hop, "interleaved1f1b", 4, 2).step_ms > 2 * 4 + 1.0


def test_the_multi_stage_order_is_torchs_own():
    """whatif's order of each rank's actions for interleaved 1F1B and looped BFS (pure Python,
    no torch) is the `pipeline_order` torch's own schedules compute (built here on a fake
    process group, each rank's stages real PipelineStages), idle slots aside."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B, ScheduleLoopedBFS
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ddptui.model import pipewhatif as pw
    kinds = {"interleaved1f1b": ScheduleInterleaved1F1B, "loopedbfs": ScheduleLoopedBFS}
    compared = 0
    for p, v, m in ((2, 2, 4), (4, 2, 8), (3, 3, 5)):
        for name, cls in kinds.items():
            if pw.valid(name, p, m, v):
                continue
            for r in range(p):
                dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=p)
                try:
                    stages = [PipelineStage(nn.Linear(2, 2), c * p + r, p * v, torch.device("cpu")) for c in range(v)]
                    order = cls(stages, m, loss_fn=lambda a, b: a.sum()).pipeline_order[r]
                finally:
                    dist.destroy_process_group()
                theirs = [("B" if "BACKWARD" in str(a.computation_type) or str(a.computation_type).endswith("B")
                           else "F", a.stage_index, a.microbatch_index) for a in order if a is not None]
                assert pw._order(name, r, p, v, m) == theirs, (name, p, v, m, r)
                compared += 1
    assert compared == 18, compared


def test_pp_by_dp_on_a_mesh_each_stage_ddp_replicated(tmp_path):
    """pp 2 × dp 2 on 4 ranks (a DeviceMesh ("pp", "dp"), each stage's module in DDP over
    "dp", as torchtitan composes them): it runs to its end (ddptui's comm hook reduces over
    DDP's own group, by its size: on the world it deadlocked), each rank's microbatches on its
    stage, activations sent to the same replica of the next stage, DDP's buckets reduced once
    a step (the last microbatch's backward), the global batch both replicas' samples."""
    import os

    from tests.helpers import ROOT, run_cli
    rec, js = tmp_path / "run.ddptui", tmp_path / "run.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "4", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "pipeline.py"), "--schedule", "1f1b", "--dp", "2",
                "--iters", "6", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning" not in r.stderr, r.stderr[-3000:]
    doc = json.loads(js.read_text())
    (row,) = doc["strategies"]
    assert row["strategy"] == "ddp" and row["steps"] == 6 and doc["batch"] == 2 * M * MB_ROWS, (row, doc["batch"])
    assert row["allreduce_calls_per_step"] >= 1, row
    pp = row["pipeline"]
    assert {r_: v["stages"] for r_, v in pp["ranks"].items()} == {"0": [0], "1": [0], "2": [1], "3": [1]}, pp
    assert all(v["microbatches"] == M for v in pp["ranks"].values()), pp
    sends = {(c["op"], c["phase"], c["group"].split(">")[-1] if ">" in c["group"] else c["group"].split("<")[-1])
             for c in row["collectives"] if c["op"] in ("send", "recv")}
    assert ("send", "forward", "2") in sends and ("send", "forward", "3") in sends, sends
    assert ("send", "backward", "0") in sends and ("send", "backward", "1") in sends, sends
    from ddptui.recording.loader import load
    own = load(str(rec)).store.meta.pipeline["rank_layers"]  # (each rank's own names, through DDP)
    assert all(n.startswith(f"s{int(r_) // 2}.") for r_, names in own.items() for n in names), own


def test_a_hung_stage_is_named_within_5_s_with_the_microbatch_its_neighbour_waits_on(one_f1b_hung):
    """Stage 0's forward of a microbatch never ends (a hung stage: asleep in its compute, after
    the 1F1B run's steps): within 5 s of the last step the run says which rank stands waiting in
    which send or receive, of which microbatch, to or from whom, and that stage 0's rank is
    inside no collective (its sends, long taken, are not what it waits on); Ctrl-C then ends
    it, every rank stopped, the steps before it kept (the 1F1B tests read them)."""
    line, lines = one_f1b_hung["hang"], one_f1b_hung["lines"]
    assert "rank 1 inside send" in line and "gradients to rank 0 (stage 1)" in line, line
    assert "of microbatch " in line, line
    assert "rank 0 never entered it (inside no collective" in line, line
    assert "no progress for 3 s" in line or "no progress for 4 s" in line or "no progress for 5 s" in line, line
    assert "Traceback" not in "\n".join(lines), "\n".join(lines)
    assert any("every rank has exited" in ln for ln in lines), "\n".join(lines[-20:])
    assert one_f1b_hung["doc"]["state"] == "stopped", one_f1b_hung["doc"]["state"]


def test_a_stage_lane_draws_each_microbatch_numbered_as_pipeline_diagrams_do(one_f1b):
    """On screen a stage's compute lane is its microbatches (F0 ... B3, forward and backward
    in their colours), not its layers; a microbatch too narrow for 'F3' still shows its number."""
    from ddptui.ui.widgets import lanes, theme
    _, got, _, _ = one_f1b
    store = got.store
    v = store.view("1f1b", 3)
    for r, spans in v.spans.items():
        bars = lanes.compute_bars(spans, list(store.meta.layers))
        labels = [t for _, _, _, t in bars if t not in ("wait", "opt", "other")]
        assert sorted(labels) == sorted([f"F{i}" for i in range(M)] + [f"B{i}" for i in range(M)]), (r, labels)
        colours = {t[0]: c for _, _, c, t in bars if t and t[0] in "FB"}
        assert colours["F"] in (theme.FWD_A, theme.FWD_A + 1) and colours["B"] in (theme.BWD_A, theme.BWD_A + 1), colours
    segs = lanes.lane_segments([(0.0, 2.0, theme.FWD_A + 1, "F7")], 4, 1.0)
    assert "7" in "".join(s.text for s in segs), segs


# (the built-in workers' gpipe and 1f1b: test_pipeline.py's run of every built-in strategy)


@pytest.mark.asyncio
async def test_the_live_screen_draws_a_stage_lane_per_rank_and_says_the_bubble_beside_the_plan(one_f1b):
    """The recorded 1F1B run in the real app (a replay, Textual's Pilot): the 1F1B pane's
    header says the step's bubble beside the plan (20 %), each rank's compute lane its
    microbatches (numbers drawn, zoomed in), and the headline the bubble."""
    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets.timeline import TimelinePane
    from tests.helpers import drawn

    src = ReplaySource(str(one_f1b[3]), clock=lambda: 0)
    src.seek(6)
    app = DdpApp(src)
    async with app.run_test(size=(160, 45)) as pilot:
        for _ in range(6):
            await pilot.pause(0.1)
        pane = app.query_one("#pane-1f1b", TimelinePane)
        header = drawn(pane)[0]
        assert "1F1B" in header and "bubble " in header and "(plan 20 %)" in header, header
        await pilot.press("plus", "plus")
        for _ in range(4):
            await pilot.pause(0.1)
        lines = drawn(pane)
        r0 = next(ln for ln in lines if ln.startswith("r0 "))
        assert any(f"F{i}" in r0 or f"B{i}" in r0 for i in range(M)), lines
        head = " ".join(ln for w in app.query("Headline") for ln in drawn(w))
        assert "bubble" in head, head
