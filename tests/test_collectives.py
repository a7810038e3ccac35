"""Every collective of a step, and FSDP2, under `ddptui run --auto` (2 CPU ranks on gloo).

The scripts in tests/scripts/ know nothing of ddptui: a DLRM-like recommender (two DDP
modules, all_to_all of sharded embedding lookups between them in the forward and the
backward, an async all_reduce of the loss waited on after the optimizer step), and an
FSDP2 transformer (fully_shard per block and the root) with and without explicit
prefetching, with bf16 mixed precision, with gradient accumulation. What is checked: each
collective is a COLL span of its step with a table row saying what it was (op, bytes,
group, issuing layer and pass); DDP's buckets stay COMM spans and are not counted twice;
a step is a gradient synchronisation (DDP's buckets, FSDP2's reduce-scatters); FSDP2's
all-gathers and reduce-scatters are per unit and attributed to the unit they gather.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers import ROOT, SCRIPT_ITERS, run_cli, run_main, run_script, sound_script_run, step_batches

pytestmark = pytest.mark.slow
# the tests of one run on one worker (each run once, ~20 s); the runs on several workers
DLRM, FSDP = pytest.mark.xdist_group("collectives-dlrm"), pytest.mark.xdist_group("collectives-fsdp")

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
FWD, BWD, COMM, STEP, COLL = 0, 1, 2, 4, 6  # (ranks.wire's span kinds)
ITERS = 8
DLRM_ITERS = SCRIPT_ITERS  # (more than the evidence window: no culprit may be named)
DLRM_BATCH = 2048
BLOCKS = 3


_run = run_script  # (JSON, loaded recording, stdout) of a script under run --auto


def _colls(got, strategy: str, rank: int, step: int):
    """The COLL spans of a rank's step as (row, t0, t1) in issue order, rows from the table."""
    table = got.store.collectives[(strategy, rank)]
    b = got.store.span_batches()[strategy][step][rank]
    return [(table[b.idx[i]], b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == COLL]


def _spans(b, kind: int):
    return [(b.idx[i], b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == kind]


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    """a2a_ddp.py with small buckets (several a module), a sound run (helpers.sound_script_run:
    its steps the iterations on both ranks, no median wait over 3/4 of a step, no culprit)."""
    # (batch 2048: a ~50 ms step; with 512 (15 ms) two ranks on two shared cores often waited
    # over half a step for each other's turn on a core, and the run was judged again)
    return sound_script_run(tmp_path_factory.mktemp("dlrm"), "a2a_ddp.py",
                            ("--bucket-cap-mb", "0.05", "--batch", str(DLRM_BATCH)), iters=DLRM_ITERS)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    # (rank 1 stops 4 s between its forward and its backward at iteration 5: a stalled step)
    return _run(tmp_path_factory.mktemp("fsdp"), "fsdp2.py", "--iters", str(ITERS), "--blocks", str(BLOCKS),
                "--stall-at", "5", "--sleep", "4")


@pytest.fixture(scope="module")
def fsdp_prefetch_mixed(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("fsdp-pm"), "fsdp2.py", "--iters", str(ITERS), "--blocks",
                str(BLOCKS), "--prefetch", "--mixed", "--accum", "2", "--clip", "1.0")


@DLRM
def test_all_to_all_between_two_ddp_modules_is_drawn(dlrm):
    """The all_to_all of the forward (between bot_l and top_l) and of the backward, and the
    async all_reduce of the loss, are COLL spans of every step on both ranks, with their
    bytes; the buckets are COMM spans as before, none of them also a COLL all_reduce."""
    doc, got, _ = dlrm
    row = doc["strategies"][0]
    assert row["steps"] == DLRM_ITERS
    a2a_bytes = 2 * DLRM_BATCH * 64 * 4  # (world, batch, D) float32: the whole buffer exchanged
    for k in range(DLRM_ITERS):
        for r in (0, 1):
            seen = [(c[1], c[2], c[5], c[6]) for c, _, _ in _colls(got, "ddp", r, k)]
            assert ("all_to_all", a2a_bytes, -1, "forward") in seen, (k, r, seen)
            assert any(s[0] == "all_to_all" and s[3] == "backward" for s in seen), (k, r, seen)
            assert ("all_reduce", 4, -1, "step") in seen, (k, r, seen)
            assert len(seen) == 3, (k, r, seen)
            b = got.store.span_batches()["ddp"][k][r]
            comm = {i for i, _, _ in _spans(b, COMM)}
            # (step 0 runs on DDP's first bucketing, a module's parameters in one bucket up to
            # 1 MB; the buckets are rebuilt after it)
            assert comm == {x["index"] for x in row["buckets"]} if k else comm, (k, r, comm)
            for (c, t0, t1) in _colls(got, "ddp", r, k):
                assert t0 <= t1, c
    # the forward all_to_all ran between the two modules' forwards
    layers = doc["layers"]
    b = got.store.span_batches()["ddp"][3][0]
    fwd = {i: (t0, t1) for i, t0, t1 in _spans(b, FWD)}
    a2a = [(t0, t1) for c, t0, t1 in _colls(got, "ddp", 0, 3) if c[6] == "forward"][0]
    assert fwd[layers.index("bot_l.3")][1] <= a2a[0] and a2a[1] <= fwd[layers.index("top_l.0")][0]


@DLRM
def test_two_ddp_modules_in_one_picture(dlrm):
    """net.bot_l and net.top_l, each a DDP, and an all_to_all of the script's own between
    them: both modules' layers and buckets, labelled by their attribute paths; one step
    spans both modules' AllReduces."""
    doc, got, _ = dlrm
    assert doc["layers"] == [f"bot_l.{i}" for i in range(4)] + [f"top_l.{i}" for i in range(5)]
    row = doc["strategies"][0]
    names = sorted(p for b in row["buckets"] for p in b["params"])
    assert names == sorted([f"bot_l.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")]
                           + [f"top_l.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")])
    by_module = {}
    for b in row["buckets"]:
        mods = {p.split(".")[0] for p in b["params"]}
        assert len(mods) == 1, b  # a bucket holds one module's parameters
        by_module.setdefault(mods.pop(), []).append(b["index"])
    assert set(by_module) == {"bot_l", "top_l"}
    assert row["allreduce_calls_per_step"] == len(row["buckets"])
    assert [b["bytes"] for b in row["buckets"]] == row["ddp_reported"]
    for k in range(1, DLRM_ITERS):
        for r, b in step_batches(got)[k].items():
            idx = {i for i, _, _ in _spans(b, COMM)}
            assert idx == {x["index"] for x in row["buckets"]}, (k, r, idx)


@DLRM
def test_whatif_says_it_predicts_one_ddp_module(dlrm):
    """Two DDP modules (buckets 0-1 and 4-5): what-if re-buckets one module's gradients, so it
    says it predicts none here (it read one bucket at every cap, across both modules), in one
    line, exit 2."""
    from tests.helpers import run_main
    _, got, _ = dlrm
    p = run_main("whatif", str(got.path))
    assert p.returncode == 2 and "wraps 2 modules in DDP" in p.stderr, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@FSDP
def test_fsdp2_steps_are_optimizer_steps_with_per_unit_gathers_and_scatters(fsdp):
    """fully_shard per block and the root: drawn as strategy fsdp, a step per optimizer step
    on both ranks; in each step every block is all-gathered for its forward and again for
    its backward, and its gradients reduce-scattered once, each attributed to the block;
    the root's unit (embedding, norm, output) to no layer. Bytes: the unsharded unit."""
    doc, got, _ = fsdp
    row = doc["strategies"][0]
    assert row["strategy"] == "fsdp" and row["steps"] == ITERS, row
    assert got.store.meta.model == "Transformer"
    layers = doc["layers"]
    blocks = [layers.index(f"layers.{i}") for i in range(BLOCKS)]
    d = 128
    block_bytes = 4 * (2 * 2 * d + 4 * d * d + 4 * d + (4 * d * d + 4 * d) + (4 * d * d + d))
    for k in range(ITERS):
        for r in (0, 1):
            cs = _colls(got, "fsdp", r, k)
            got_ops = {}
            for c, _, _ in cs:
                got_ops.setdefault((c[1], c[5], c[6]), []).append(c[2])
            for i in blocks:
                assert got_ops.get(("all_gather", i, "forward")) == [block_bytes], (k, r, i, got_ops)
                assert got_ops.get(("reduce_scatter", i, "backward")) == [block_bytes], (k, r, i, got_ops)
            # the last block is still gathered after its forward (reshard after forward: the
            # blocks before it are gathered again for their backward)
            for i in blocks[:-1]:
                assert got_ops.get(("all_gather", i, "backward")) == [block_bytes], (k, r, i, got_ops)
            assert ("all_gather", -1, "forward") in got_ops and ("reduce_scatter", -1, "backward") in got_ops
            b = got.store.span_batches()["fsdp"][k][r]
            assert not _spans(b, COMM)  # no DDP bucket
            fwd = {i: (t0, t1) for i, t0, t1 in _spans(b, FWD)}
            for c, t0, t1 in cs:  # a block's forward gather before its forward compute
                if c[1] == "all_gather" and c[6] == "forward" and c[5] >= 0:
                    assert t0 <= fwd[c[5]][0], (k, r, c, fwd[c[5]])


@FSDP
def test_fsdp2_a_stalled_step_is_listed_with_who_waited_in_what(fsdp):
    """Rank 1 stops 4 s between its forward and its backward at iteration 5: the report and
    its JSON list that step, rank 0 waiting ~4 s for rank 1 in FSDP2's first collective of
    the backward (the last block's all-gather: it was resharded after its forward), and no
    other step."""
    import re
    doc, _, out = fsdp
    stalls = doc["strategies"][0]["stalls"]
    assert [x["step"] for x in stalls] == [5], stalls
    x = stalls[0]
    assert x["waited_for"] == 1 and list(x["waited_ms"]) == ["0"] and 3500 <= x["waited_ms"]["0"] <= 6000, x
    assert re.fullmatch(r"(all_gather|reduce_scatter) \(layers\.\d, backward; [\d.]+ MB\)", x["collective"]), x
    assert re.search(r"fsdp step 5: [45]\.\d s · rank 0 waited [3-5]\.\d s for rank 1 in " + re.escape(x["collective"]),
                     out), out


@FSDP
def test_fsdp2_prefetch_mixed_precision_and_accumulation(fsdp, fsdp_prefetch_mixed):
    """Explicit prefetching: block i+1 is all-gathered while block i computes (issued before
    block i's forward ends), attributed to block i+1; bf16 parameters halve the all-gather
    bytes, fp32 reduction keeps the reduce-scatter's; accumulation over 2 micro-steps with
    set_requires_gradient_sync: one step per optimizer step, its forwards twice, its
    reduce-scatters once (the last micro-step)."""
    doc0, plain, _ = fsdp
    doc, got, _ = fsdp_prefetch_mixed
    assert doc["strategies"][0]["steps"] == ITERS
    layers = doc["layers"]
    blocks = [layers.index(f"layers.{i}") for i in range(BLOCKS)]
    base = {(c[1], c[5], c[6]): c[2] for c, _, _ in _colls(plain, "fsdp", 0, 2)}
    prefetched = 0
    for k in range(1, ITERS):
        for r in (0, 1):
            b = got.store.span_batches()["fsdp"][k][r]
            fwd = {}
            for i, t0, t1 in _spans(b, FWD):
                fwd.setdefault(i, []).append((t0, t1))
            assert all(len(fwd[i]) == 2 for i in blocks), (k, r, fwd)  # two micro-steps
            cs = _colls(got, "fsdp", r, k)
            rs = [c for c, _, _ in cs if c[1] == "reduce_scatter"]
            assert sorted(c[5] for c in rs if c[5] >= 0) == sorted(blocks), (k, r, rs)
            last_micro = fwd[blocks[0]][1][0]
            assert all(t0 >= last_micro for c, t0, _ in cs if c[1] == "reduce_scatter"), (k, r)
            for c, t0, _ in cs:
                if c[1] == "all_gather" and c[5] in blocks:
                    assert c[2] * 2 == base[("all_gather", c[5], "forward")], (c, base)
                if c[1] == "reduce_scatter" and c[5] in blocks:
                    assert c[2] == base[("reduce_scatter", c[5], "backward")], (c, base)
                # prefetched: block j gathered before block j-1's forward ended
                if c[1] == "all_gather" and c[6] == "forward" and c[5] in blocks[1:]:
                    prev = blocks[blocks.index(c[5]) - 1]
                    if any(t0 < e for _, e in fwd[prev]):
                        prefetched += 1
    assert prefetched >= (ITERS - 1) * 2 * (BLOCKS - 1), prefetched


@FSDP
def test_clip_grad_norm_on_fsdp2_is_a_functional_all_reduce(fsdp_prefetch_mixed):
    """clip_grad_norm_ on FSDP2's sharded (DTensor) gradients all_reduces the norms through a
    functional collective, not a process-group call: one asynchronous all_reduce in every
    step, after the step's last reduce-scatter was issued, ending by the step's end."""
    doc, got, _ = fsdp_prefetch_mixed
    for k in range(ITERS):
        for r in (0, 1):
            cs = _colls(got, "fsdp", r, k)
            ar = [(c, t0, t1) for c, t0, t1 in cs if c[1] == "all_reduce"]
            assert len(ar) == 1, (k, r, ar)
            (c, t0, t1), = ar
            assert c[6] == "step" and c[7] is True and c[2] > 0, c
            last_rs = max(u0 for d, u0, _ in cs if d[1] == "reduce_scatter")
            b = got.store.span_batches()["fsdp"][k][r]
            (_, s0, s1), = _spans(b, STEP)
            assert last_rs <= t0 <= t1 <= s1, (k, r, last_rs, t0, t1, s1)
    assert "all_reduce" in {c["op"] for c in doc["strategies"][0]["collectives"]}


@DLRM
def test_the_json_and_chrome_export_name_every_collective(dlrm, tmp_path):
    """The summary's JSON counts the collectives, and the Chrome trace names each on the
    communication track."""
    doc, got, _ = dlrm
    out = tmp_path / "t.json"
    r = run_cli("export", str(got.path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    names = " ".join(e.get("name", "") for e in json.loads(out.read_text())["traceEvents"])
    assert "all_to_all" in names and "all_reduce" in names
    assert "all_to_all" in json.dumps(doc)


def test_a_rank_that_never_arrives_is_named_with_the_collective(tmp_path):
    """A plain DDP script under `ddptui run --auto --headless`: rank 1 sleeps 5 s between its
    forward and its backward at iteration 3 (rank 0 waits inside DDP's bucket AllReduce), and
    5 s before the script's own all_reduce at iteration 7 (rank 0 waits inside that). Within
    5 s of each, the headless output says which collective rank 0 is inside (the bucket, its
    layers and bytes; the op, sequence number and bytes) and that rank 1 never entered it;
    the run goes on to its end, and the final report, its JSON and the recording's summary
    list both stalled steps: how long, who waited for whom, in what."""
    import re
    import time
    t0 = time.monotonic()
    rec, js = tmp_path / "stall.ddptui", tmp_path / "run.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "2", "--record", rec, "--json", js, "--",
                os.path.join(SCRIPTS, "stall.py"), "--iters", "10", "--bucket-at", "3", "--at", "7",
                "--sleep", "5", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "never entered" in ln]
    assert len(lines) == 2, r.stderr[-3000:]
    # DDP's bucket: the model's last Linear ("2") and its first ("0") share bucket 0
    m = re.search(r"no progress for (\d+) s: rank 0 inside DDP bucket 0 AllReduce #\d+ \(44,072 B, "
                  r"layers 2, 0\) for \d+ s; rank 1 never entered it", lines[0])
    assert m and int(m.group(1)) <= 5, lines
    m = re.search(r"no progress for (\d+) s: rank 0 inside all_reduce #(\d+) \(4 B\).*rank 1 never entered it",
                  lines[1])
    assert m and int(m.group(1)) <= 5, lines
    assert "steps again after" in r.stderr
    assert "Traceback" not in r.stderr
    # each stall: every rank's Flight Recorder written beside the recording and read (PyTorch's
    # own record: DDP's bucket AllReduces, which C++ issues, counted in its sequence too)
    fr = [ln for ln in r.stderr.splitlines() if "Flight Recorder (" in ln]
    assert fr and all("rank 1 never issued it" in ln for ln in fr), r.stderr[-3000:]
    assert sorted(os.listdir(f"{rec}.fr")) == ["fr_rank0", "fr_rank1"]
    summ_fr = run_main("summary", f"{rec}.fr")
    assert summ_fr.returncode == 0 and "rank 1 never issued it" in summ_fr.stdout, summ_fr.stdout[-2000:]
    # the final report and its JSON, then the recording's summary: both stalled steps
    want = [(3, "DDP bucket 0 AllReduce (layers 2, 0; 44,072 B)"), (7, "all_reduce (step; 4 B)")]
    summ = run_main("summary", rec, "--json", tmp_path / "summary.json")
    assert summ.returncode == 0, summ.stderr
    for out, doc in ((r.stdout, js), (summ.stdout, tmp_path / "summary.json")):
        stalls = json.loads(doc.read_text())["strategies"][0]["stalls"]
        assert [(x["step"], x["collective"]) for x in stalls] == want, stalls
        for x in stalls:
            assert x["waited_for"] == 1 and list(x["waited_ms"]) == ["0"], x
            assert 4000 <= x["waited_ms"]["0"] <= x["step_ms"] < 8000, x
        assert "stalled steps (a rank waited 3 s or more inside one collective):" in out
        for k, what in want:
            assert re.search(rf"ddp step {k}: [567]\.\d s · rank 0 waited [4-7]\.\d s for rank 1 in "
                             + re.escape(what), out), out
    assert time.monotonic() - t0 < 200


@FSDP
def test_memory_each_rank_holds_sharded_and_replicated(fsdp):
    """FSDP2 on 2 ranks: each rank holds half the parameters and gradients and AdamW's two
    moments of its half; the summary says it and what a full replica would hold."""
    doc, got, out = fsdp
    for r in ("0", "1"):
        m = doc["memory"][r]
        assert m["params_bytes"] * 2 == m["model_params_bytes"], m
        assert m["grads_bytes"] == m["params_bytes"] and m["optimizer_bytes"] == 2 * m["params_bytes"], m
        assert m["replicated_bytes"] == 4 * m["model_params_bytes"], m
    assert "memory per rank" in out and "a full replica" in out


@DLRM
def test_memory_of_ddp_is_every_parameter(dlrm):
    """DDP holds everything (SGD: no state); no replica to compare with."""
    ddoc, _, dout = dlrm
    m = ddoc["memory"]["0"]
    assert m["params_bytes"] == m["model_params_bytes"] == m["grads_bytes"] and m["optimizer_bytes"] == 0, m


def test_every_public_entry_point_is_seen(tmp_path):
    """all_reduce (sync and async), all_gather, all_gather_into_tensor, reduce_scatter_tensor,
    all_to_all_single, broadcast, reduce, gather, scatter, barrier, send/recv, issued by a
    script inside a step under plain torchrun (per-rank recordings): each is a COLL span of
    every step, with its op and bytes; the DDP buckets are not among them."""
    import subprocess
    import sys

    from ddptui.recording.loader import load
    from tests.helpers import cli_env
    rec = tmp_path / "rec"
    env = cli_env({"DDPTUI_RECORD": str(rec)})
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        os.path.join(SCRIPTS, "every_api.py")], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = load(str(rec))
    want = {("all_reduce", 32), ("all_gather", 64), ("reduce_scatter", 64), ("all_to_all", 32),
            ("broadcast", 32), ("reduce", 32), ("barrier", 0)}
    for rank in (0, 1):
        for k in range(3):
            seen = [(c[1], c[2]) for c, _, _ in _colls(got, "ddp", rank, k)]
            assert want <= set(seen), (rank, k, seen)
            # (the functional collectives too: an all_reduce, an all_gather, an all_to_all and
            # a broadcast like the others, and a reduce_scatter of 128 B over a list of ranks)
            assert seen.count(("all_reduce", 32)) == 3 and seen.count(("all_gather", 64)) == 3, seen
            assert seen.count(("all_to_all", 32)) == 2 and seen.count(("broadcast", 32)) == 2, seen
            assert seen.count(("reduce_scatter", 128)) == 1, seen
            assert {op for op, _ in seen} >= {"gather", "scatter"}, seen
            assert ("send" if rank == 0 else "recv") in {op for op, _ in seen}, seen
            assert all(n == 32 for op, n in seen if op == "all_reduce"), seen  # (no bucket)
            # every one of them waited on where the script issued it (a blocking call, an
            # asynchronous call's work.wait(), a functional collective's wait or first use):
            # a WAIT each, within its collective, not compute; gloo's send and recv too, whose
            # Work has no future: their span ends where the wait returns
            b = got.store.span_batches()["ddp"][k][rank]
            spans = sorted((b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == COLL)
            waits = list(zip(b.waits[0::3], b.waits[1::3]))
            tab = got.store.collective_tables("ddp")[rank]
            bare = [tab[b.idx[i]][1] for i in range(len(b.kind)) if b.kind[i] == COLL
                    and not any(b.t0[i] <= w0 and w1 <= b.t1[i] for w0, w1 in waits)]
            assert bare == [], (rank, k, bare)
            assert len(waits) == len(spans), (rank, k, len(waits), len(spans))
            assert all(any(a <= w0 and w1 <= z for a, z in spans) for w0, w1 in waits), (waits, spans)
            # each names the collective it waited for (its table row, as the COLL span's idx)
            rows = {b.idx[i] for i in range(len(b.kind)) if b.kind[i] == COLL}
            assert set(b.waits[2::3]) <= rows and len(set(b.waits[2::3])) > 5, (b.waits[2::3], rows)


def test_a_functional_collective_ends_where_its_result_is_waited_on(tmp_path):
    """The tap ends a functional collective's span at the wait_tensor that first needs its
    result: one the script drops unwaited stays open (torch's own work registry holds it; its
    step resolves it at its issue) without the rank counting as inside it (no false hang), one
    used ends there, also when what is used is a view of it (DTensor's to_local); compiled (traced) calls pass through untimed."""
    import subprocess
    import sys
    script = tmp_path / "fc.py"
    script.write_text('''
import gc, os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
from ranks.core import colltap
import torch.distributed._functional_collectives as funcol
class Rec:
    cur = None
    def comm_issue(self, *a): return 0
tap = colltap.CollTap(Rec()); tap.activate()
pg = dist.group.WORLD
from ranks.core.colltap import _fc_waits
r = funcol.all_reduce(torch.ones(1 << 20), "sum", pg)   # dropped unwaited: no hang to report
del r; gc.collect()
assert not tap.inflight and len(_fc_waits) == 1, (tap.inflight, _fc_waits)
s = funcol.all_reduce(torch.ones(4), "sum", pg)
assert len(_fc_waits) == 2 and not tap.inflight
(s + 1).sum()                                          # waited where it is used: its span ends
assert len(_fc_waits) == 1 and not tap.inflight
u = funcol.all_reduce(torch.ones(8), "sum", pg)
v = u.view_as(u)                                       # (DTensor's to_local: another tensor on its storage)
assert len(_fc_waits) == 2
(v + 1).sum()                                          # waited on through the view: ends there too
assert len(_fc_waits) == 1 and not tap.inflight
f = torch.compile(lambda x: funcol.all_reduce(x, "sum", pg) * 2, backend="eager", fullgraph=True)
before = tap.entered
assert f(torch.ones(2)).tolist() == [2.0, 2.0] and tap.entered == before
dist.destroy_process_group()
print("ok")
''')
    import socket

    from tests.helpers import cli_env
    with socket.socket() as sk:  # (a free port for the one-rank group)
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    env = cli_env({"PORT": str(port)})
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
