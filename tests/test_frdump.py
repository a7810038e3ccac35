"""PyTorch Flight Recorder dumps read as a run (recording/frdump.py) and the verdict
(model/frverdict.py), on dumps of real gloo jobs made to hang (tests/scripts/fr_hang.py,
under torchrun, each rank dumping as NCCL's watchdog does on a timeout): a rank that never
arrives, a rank that issues an extra collective, a subgroup hang beside a healthy default
group with buffers that wrapped (3 ranks), the JSON form; other sizes, dtypes and states from
a real dump edited as NCCL records a collective (gloo aborts the process on a size or dtype
mismatch before anything is dumped); truncated, corrupt and hostile files. Pipelines (2 and 3
gloo ranks) that hang in send/recv: their sends and recvs, which gloo does not record, written
into the real dumps as NCCL records them (`as_nccl_p2p`), each send paired with its recv.

PyTorch's own analyzer (`python -m torch.distributed.flight_recorder.fr_trace DIR --prefix P`)
stops with KeyError on gloo's dumps as they are: gloo leaves `pg_config` (each group's ranks)
empty, and fr_trace looks every entry's group up in it. With pg_config filled in as NCCL writes
it (the only edit), fr_trace gives its verdict, and ddptui's is the same: the group, the
sequence number, the ranks missing, or the culprit and the kind of mismatch.
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from ddptui.model import frverdict
from ddptui.recording.frdump import FrDumpReader, read_dump

from .helpers import ROOT, assert_no_leftovers, cli_env, run_main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("frdump")]

SCRIPT = os.path.join(ROOT, "tests", "scripts", "fr_hang.py")
PREFIX = "nccl_trace_rank_"
TIMEOUT_S = 2.0
# each case's groups as NCCL's pg_config would say them (gloo's says nothing): name -> (desc, ranks)
GROUPS = {"never": {"0": ("default_pg", [0, 1]), "1": ("undefined", [0, 1])},
          "extra": {"0": ("default_pg", [0, 1]), "1": ("undefined", [0, 1])},
          "subgroup": {"0": ("default_pg", [0, 1, 2]), "1": ("undefined", [1, 2])}}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Both jobs at once (a 2-rank one, buffer 2,000; a 3-rank one, buffer 12: it wraps): the
    directory holding never/, never-json/, extra/, subgroup/."""
    return _run_jobs(tmp_path_factory.mktemp("fr-dumps"), (("pair", 2, 2000), ("trio", 3, 12)))


def _run_jobs(out, cases) -> object:
    """tests/scripts/fr_hang.py's cases ((case, ranks, Flight Recorder buffer)), each a real
    torchrun job, all at once, into `out`; each must end well (its log shown where not)."""
    procs = []
    for case, n, buf in cases:
        log = open(out / f"{case}.log", "w")
        procs.append((case, log, subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", SCRIPT,
             "--case", case, "--out", str(out), "--timeout", str(TIMEOUT_S)],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(out),
            env=cli_env({"TORCH_FR_BUFFER_SIZE": str(buf)}))))
    for case, log, p in procs:
        try:
            rc = p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
        assert rc == 0, (out / f"{case}.log").read_text()[-3000:]
    assert_no_leftovers()
    return out


def _verdict(d) -> dict:
    """The verdict's JSON, as `ddptui summary DIR --json` writes it (and the text it printed)."""
    p = run_main("summary", str(d), "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    return doc


def _group(doc: dict, name: str) -> dict:
    (g,) = [g for g in doc["flight_recorder"]["groups"] if g["group"] == name]
    return g


# -- fr_trace, PyTorch's analyzer --------------------------------------------------------------
def fr_trace(d) -> dict[str, tuple]:
    """fr_trace's verdict on a directory of dumps (its own reader and matcher, as its command
    line runs them): per group (its name), the first collective it reports, as (sequence
    number, "missing", ranks) or (sequence number, "mismatch", {culprit rank: kind})."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir
    args = JobConfig().parse_args([str(d), "--prefix", PREFIX])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    out: dict[str, tuple] = {}
    for c in db.collectives:
        g = c.pg_desc.split(":")[0]  # ('0:default_pg', '1')
        if g in out:
            continue
        if c.missing_ranks:
            out[g] = (c.collective_seq_id, "missing", sorted(c.missing_ranks))
        elif c.mismatch_collectives:
            out[g] = (c.collective_seq_id, "mismatch",
                      {r: m.type_of_mismatch.state.name for r, m in c.mismatch_collectives.items()})
    return out


KIND = {"COLLECTIVE_TYPE_MISMATCH": "other_op", "SIZE_OR_SYNTAX_MISMATCH": "other_sizes",
        "COLLECTIVE_DTYPE_MISMATCH": "other_dtypes", "COLLECTIVE_STATE_MISMATCH": "other_state"}


def ddptui_said(doc: dict) -> dict[str, tuple]:
    """ddptui's verdict in fr_trace's terms: per group, (sequence number, "missing", ranks), or
    (sequence number, "mismatch", {rank: fr_trace's kind} of the ranks that are not the
    reference, the group's ranks)."""
    out: dict[str, tuple] = {}
    for g in doc["flight_recorder"]["groups"]:
        d = g["first_disagreement"]
        if d is None:
            continue
        if d["never_issued"]:
            out[g["group"]] = (d["seq"], "missing", d["never_issued"])
        else:
            out[g["group"]] = (d["seq"], "mismatch", {int(r): k for k, v in KIND.items() for r in d[v]}, g["ranks"])
    return out


def same_verdict(fr: dict, ours: dict) -> None:
    """The same groups, sequence numbers, missing ranks; a mismatch of the same kind, on the
    same rank (of two ranks, fr_trace's reference is the first file it lists: either side)."""
    assert set(fr) == set(ours), (fr, ours)
    for g, got in fr.items():
        want = ours[g]
        assert got[:2] == want[:2], (g, got, want)
        if got[1] == "missing":
            assert got[2] == want[2], (g, got, want)
            continue
        assert set(got[2].values()) == set(want[2].values()), (g, got, want)
        assert got[2] == want[2] or len(want[3]) == 2, (g, got, want)


def with_pg_config(src, dst, groups: dict) -> None:
    """The dumps of src with pg_config as NCCL writes it (gloo writes none), to dst."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        d = pickle.loads((src / f).read_bytes())
        r = int(f[len(PREFIX):])
        d["pg_config"] = {k: {"name": k, "desc": desc, "ranks": str(rs)} for k, (desc, rs) in groups.items() if r in rs}
        (dst / f).write_bytes(pickle.dumps(d))


def as_nccl(src, dst, change) -> None:
    """The never/ dumps as NCCL would have recorded a mismatch there: entries named nccl:, the
    finished ones "completed" with the watchdog's times, rank 0's all_reduce #4 "started", and
    rank 1 issuing that all_reduce too, changed by `change` (other sizes, dtypes, state)."""
    os.makedirs(dst, exist_ok=True)
    dumps = {r: pickle.loads((src / f"{PREFIX}{r}").read_bytes()) for r in (0, 1)}
    for r, d in dumps.items():
        d["pg_config"] = {k: {"name": k, "desc": desc, "ranks": str(rs)} for k, (desc, rs) in GROUPS["never"].items()}
        for e in d["entries"]:
            e["profiling_name"] = "nccl:" + e["profiling_name"].split(":", 1)[1]
            e.update(state="completed", time_discovered_started_ns=e["time_created_ns"] + 20_000,
                     time_discovered_completed_ns=e["time_created_ns"] + 50_000, retired=True)
        d["pg_status"]["1"] = {"last_enqueued_collective": 4, "last_started_collective": 4,
                               "last_completed_collective": 3}
    hung = dumps[0]["entries"][-1]
    assert (hung["collective_seq_id"], hung["process_group"][0]) == (4, "1")
    hung.update(state="started", time_discovered_completed_ns=None, retired=False,
                frames=[{"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 3245},
                        {"name": "train_step", "filename": "/job/train.py", "line": 42}])
    other = copy.deepcopy(hung)
    other.update(record_id=dumps[1]["entries"][-1]["record_id"] + 1, time_created_ns=hung["time_created_ns"] + 300_000)
    change(other)
    dumps[1]["entries"].append(other)
    for r, d in dumps.items():
        (dst / f"{PREFIX}{r}").write_bytes(pickle.dumps(d))


# -- the cases ---------------------------------------------------------------------------------
def test_a_rank_that_never_arrives(jobs):
    """The subgroup's 4th all_reduce: rank 0 inside it, rank 1 never issued it; the default
    group agrees; the JSON form of the same moment says the same."""
    doc = _verdict(jobs / "never")
    fr = doc["flight_recorder"]
    assert doc["state"] == "desync" and doc["strategies"] == []
    assert fr["verdict"].startswith("group 1 [ranks 0, 1]: first disagreement at all_reduce #4")
    assert fr["verdict"].endswith("rank 1 never issued it")
    g = _group(doc, "1")
    d = g["first_disagreement"]
    assert (d["seq"], d["op"], d["never_issued"], d["agree"], d["kinds"]) == (4, "all_reduce", [1], [0], ["never"])
    assert d["expected"]["bytes"] == 64 * 4 and d["expected"]["input_sizes"] == [[64]]
    assert g["ranks"] == [0, 1] and g["ranks_from"] == "entries" and g["last_agreed"] == 3
    r0, r1 = g["ranks_at"]["0"], g["ranks_at"]["1"]
    # (dumped 0.2 s after it was issued: in flight, or, on a machine too busy to dump within its
    # 2 s, ended by its timeout)
    assert r0["last_completed"]["seq"] == 3 and [e["seq"] for e in r0["in_flight"] + r0["failed"]] == [4]
    assert r1["last_completed"]["seq"] == 3 and r1["in_flight"] == [] and r1["last_issued"] == 3
    default = _group(doc, "0")
    assert default["first_disagreement"] is None and default["ranks_from"] == "world" and default["last_agreed"] == 5
    assert all(a["last_completed"]["op"] == "all_gather" and not a["in_flight"] for a in default["ranks_at"].values())
    # the JSON form (_dump_fr_trace_json: numbers as text in pg_status) reads the same
    js = _verdict(jobs / "never-json")["flight_recorder"]
    assert js["groups"] == fr["groups"] and js["verdict"] == fr["verdict"]
    # the text: what was read, the verdict first, each rank's place
    p = run_main("summary", str(jobs / "never"))
    assert p.returncode == 0 and not p.stderr, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Flight Recorder dumps · 2 ranks (2 dumped) · gloo · 2 process group(s)")
    assert lines[1] == "verdict: " + fr["verdict"]
    assert any(x.startswith(("  rank 0: last completed all_reduce #3; all_reduce #4 in flight",
                             "  rank 0: last completed all_reduce #3; all_reduce #4 ended")) for x in lines)
    assert "  rank 1: last completed all_reduce #3; nothing in flight" in lines


def test_a_rank_that_issues_an_extra_collective(jobs):
    """Rank 1 broadcasts where rank 0 all_reduces (the default group's #6); the subgroup's
    all_reduce #4, which rank 1 never issued, ended on rank 0 by its timeout."""
    doc = _verdict(jobs / "extra")
    d = _group(doc, "0")["first_disagreement"]
    assert (d["seq"], d["op"], d["kinds"], d["agree"]) == (6, "all_reduce", ["op"], [0])
    assert d["other_op"]["1"]["op"] == "broadcast" and d["never_issued"] == []
    sub = _group(doc, "1")
    assert sub["first_disagreement"]["never_issued"] == [1]
    assert [e["seq"] for e in sub["ranks_at"]["0"]["failed"]] == [4], "ended without rank 1: by its timeout"
    # the first to go wrong leads: the subgroup's (issued before the broadcast)
    assert doc["flight_recorder"]["verdict"].startswith("group 1 [ranks 0, 1]")
    text = "\n".join(doc["flight_recorder"]["lines"])
    assert "default_pg [ranks 0, 1]: first disagreement at all_reduce #6: rank 0 issued all_reduce (28 B, Float[7]); " \
           "rank 1 issued broadcast instead" in text


def test_a_subgroup_hang_beside_a_healthy_default_group_with_wrapped_buffers(jobs):
    """3 ranks, buffers of 12: every rank's first entries gone. The default group agrees and
    completed its 20 all_reduces on every rank; the subgroup [1, 2] hangs at #3, rank 2 never
    issued it; rank 0 is in no subgroup."""
    doc = _verdict(jobs / "subgroup")
    fr = doc["flight_recorder"]
    assert fr["wrapped"] == [0, 1, 2] and all(x["first_record"] > 0 for x in fr["dumps"].values())
    default = _group(doc, "0")
    assert default["first_disagreement"] is None and default["ranks"] == [0, 1, 2]
    assert {a["last_completed"]["seq"] for a in default["ranks_at"].values()} == {20}
    assert all(a["known_from"] > 1 and not a["in_flight"] for a in default["ranks_at"].values())
    sub = _group(doc, "1")
    assert sub["ranks"] == [1, 2] and "0" not in sub["ranks_at"]
    d = sub["first_disagreement"]
    assert (d["seq"], d["never_issued"], d["agree"]) == (3, [2], [1])
    assert fr["verdict"] == ("group 1 [ranks 1, 2]: first disagreement at all_reduce #3: rank 1 issued all_reduce "
                             "(64 B, Float[16]); rank 2 never issued it")
    assert "ranks 0-2: the buffer wrapped" in "\n".join(fr["lines"])


def test_fr_trace_fails_on_gloo_dumps_and_agrees_once_it_can_read_them(jobs, tmp_path):
    """fr_trace as it is: KeyError on every gloo dump (its pg_config is empty). With pg_config
    filled in, fr_trace's verdict on never/, extra/, subgroup/ is ddptui's (ddptui's, on the
    dumps as gloo wrote them, already the same)."""
    from torch.distributed.flight_recorder.fr_trace import main
    with pytest.raises(KeyError):
        main([str(jobs / "never"), "--prefix", PREFIX])
    for case, groups in GROUPS.items():
        fixed = tmp_path / case
        with_pg_config(jobs / case, fixed, groups)
        ours = _verdict(fixed)
        assert ours["flight_recorder"]["groups"][0]["ranks_from"] == "pg_config"
        same_verdict(fr_trace(fixed), ddptui_said(ours))
        assert ddptui_said(ours) == ddptui_said(_verdict(jobs / case))


@pytest.mark.parametrize("kind,change", [
    ("other_sizes", lambda e: e.update(input_sizes=[[65]], output_sizes=[[65]])),
    ("other_dtypes", lambda e: e.update(input_dtypes=["Double"], output_dtypes=["Double"])),
    ("other_state", lambda e: e.update(state="scheduled", time_discovered_started_ns=None)),
])
def test_other_sizes_dtypes_or_state_as_nccl_records_them(jobs, tmp_path, kind, change):
    """A real dump edited as NCCL records a mismatch (both ranks inside all_reduce #4 of group
    1, rank 1's with other sizes, dtypes, or not started): named as fr_trace names it; rank 0
    is inside it, started, at the line of the job that issued it."""
    d = tmp_path / kind
    as_nccl(jobs / "never", d, change)
    doc = _verdict(d)
    first = _group(doc, "1")["first_disagreement"]
    assert (first["seq"], first["kinds"], list(first[kind])) == (4, [kind.split("_", 1)[1]], ["1"])
    same_verdict(fr_trace(d), ddptui_said(doc))
    assert doc["backend"] == "nccl" and doc["device"] == "cuda"
    lines = doc["flight_recorder"]["lines"]
    assert any(x.startswith(("  rank 0: ", "  ranks 0, 1: ")) and "last completed all_reduce #3; all_reduce #4 in flight" in x and
               x.endswith(", started, issued at train.py:42 (train_step)") for x in lines), lines


def test_the_lanes_every_collective_by_group_and_the_hang_last(jobs):
    """A lane per rank: every entry a collective of its group (the group as its 'layer'), one
    time axis; the last step holds the hang: rank 0's all_reduce #4 of the subgroup (in flight
    to its dump on never/; on extra/, it ended by its 2 s timeout), none on rank 1."""
    from ddptui.recording.loader import load
    from .helpers import SPAN_COLL
    for case in ("never", "extra"):
        got = load(str(jobs / case))
        st = got.store
        assert st.meta.layers == ["default_pg", "group 1"] and st.world == 2
        steps = got.steps_read()["ddp"]
        last = st.span_batches()["ddp"][steps[-1]]
        rows = {r: st.collectives[("ddp", r)] for r in (0, 1)}
        colls = {r: [(rows[r][b.idx[i]], b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == SPAN_COLL]
                 for r, b in last.items()}
        sub0 = [(t0, t1) for row, t0, t1 in colls[0] if row[4] == "group 1"]
        assert len(sub0) == 1, colls[0]
        assert not [row for row, *_ in colls[1] if row[4] == "group 1"], "rank 1 never issued it"
        if case == "extra":
            assert abs((sub0[0][1] - sub0[0][0]) / 1e6 - TIMEOUT_S) < 0.05, sub0
            assert {row[1] for row, *_ in colls[1]} == {"broadcast"}
        total = sum(len(b.kind) for k in steps for b in st.span_batches()["ddp"][k].values())
        entries = sum(x["entries"] for x in st.meta.extra["flight_recorder"]["dumps"].values())
        assert total == entries + len(steps) * 2  # (every entry, and a step span per rank and step)


@pytest.mark.asyncio
async def test_the_replay_screen_says_the_verdict(jobs):
    """The replay's headline is the verdict; the status line, where a hang is said, its gist."""
    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.app import DdpApp
    app = DdpApp(ReplaySource(str(jobs / "never"), speed=8.0))
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        for _ in range(30):
            await pilot.pause(0.1)
            if "never issued" in app.status_line.plain:
                break
        head, status = app.headline.plain, app.status_line.plain
    assert "Flight Recorder: group 1 [ranks 0, 1]: first disagreement at all_reduce #4" in head, head
    assert "rank 1 never issued it" in head
    assert "⚠ Flight Recorder: group 1 all_reduce #4: r1 never issued it" in status, status


def test_export_and_replay_headless(jobs, tmp_path):
    out = tmp_path / "t.json"
    p = run_main("export", str(jobs / "subgroup"), "-o", str(out))
    assert p.returncode == 0 and not p.stderr, p.stderr
    names = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "communication"}
    assert names == {"all_reduce default_pg", "all_reduce group 1"}
    p = run_main("replay", str(jobs / "subgroup"), "--headless")
    assert p.returncode == 0 and "verdict: group 1 [ranks 1, 2]" in p.stdout


# -- bad files ---------------------------------------------------------------------------------
class _Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_truncated_corrupt_and_hostile_files_a_line_each(jobs, tmp_path):
    """Beside a real dump: a hostile pickle (its reduce would run os.system), random bytes, a
    dump cut in half: a warning line each, the real one read, nothing run, no traceback. Only
    bad files, or none, or dumps without a collective: one line, exit status 2."""
    marker = tmp_path / "ran"
    hostile = pickle.dumps({"version": "2.10", "entries": [_Evil(str(marker))]})
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(jobs / "extra" / f"{PREFIX}0", mixed / f"{PREFIX}0")
    (mixed / f"{PREFIX}1").write_bytes(hostile)
    (mixed / f"{PREFIX}2").write_bytes(b"\x01 not a pickle " * 32)
    raw = (jobs / "extra" / f"{PREFIX}1").read_bytes()
    (mixed / f"{PREFIX}3").write_bytes(raw[: len(raw) // 2])
    p = run_main("summary", str(mixed))
    assert p.returncode == 0 and "Traceback" not in p.stderr + p.stdout
    warn = p.stderr.splitlines()
    assert len(warn) == 3 and all(x.startswith(f"ddptui: warning: {mixed}: {PREFIX}") for x in warn), warn
    assert "refused: the dump asks for posix.system" in warn[0]
    assert "not a readable Flight Recorder dump" in warn[1] and "truncated" in warn[2]
    assert "ranks 1-3: no dump" in p.stdout and "  rank 0: last completed" in p.stdout
    assert not marker.exists()
    bad = {"hostile": {f"{PREFIX}0": hostile}, "cut": {f"{PREFIX}0": raw[:64]},
           "empty": {f"{PREFIX}0": pickle.dumps({"version": "2.10", "entries": []})},
           "json": {f"{PREFIX}0.json": b'{"version": "2.10", "entries": [{"x": 1}]}'},
           "none": {"notes.txt": b"nothing"}}
    said = {"hostile": "no readable Flight Recorder dump (nccl_trace_rank_0: refused: the dump asks for posix.system",
            "cut": "no readable Flight Recorder dump (nccl_trace_rank_0: not a readable Flight Recorder dump",
            "empty": "the dumps hold no collective (was the Flight Recorder on? TORCH_FR_BUFFER_SIZE",
            "json": "none of its 1 entries has a Flight Recorder entry's shape",
            "none": "a directory without per-rank recordings (rank<N>.ddptui), PyTorch Flight Recorder dumps"}
    for name, files in bad.items():
        d = tmp_path / name
        d.mkdir()
        for f, b in files.items():
            (d / f).write_bytes(b)
        for verb in (("summary",), ("replay", "--headless"), ("export", "-o", str(tmp_path / "x.json"))):
            p = run_main(verb[0], str(d), *verb[1:])
            assert p.returncode == 2 and p.stdout == "", (name, verb, p)
            (line,) = p.stderr.splitlines()
            assert line.startswith(f"ddptui: error: {d}: ") and said[name] in line, (name, line)
    assert not marker.exists()


def test_a_rank_whose_dump_cannot_be_read_is_never_called_healthy(tmp_path):
    """A 2-rank job's dumps of a desync (demo/'s), rank 1's cut short: the verdict of the dump
    read is no more than that: it says rank 1's state is unknown and never "no hang in the
    dumps" (the complete dumps show a desync), in the text and the JSON."""
    d = tmp_path / "cut"
    shutil.copytree(os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo"), d)
    raw = (d / f"{PREFIX}1").read_bytes()
    (d / f"{PREFIX}1").write_bytes(raw[:300])
    p = run_main("summary", str(d))
    assert p.returncode == 0, p.stderr
    verdict = next(x for x in p.stdout.splitlines() if x.startswith("verdict: "))
    assert "no hang in the dumps" not in verdict
    assert "rank 1: no readable dump, its state unknown" in verdict and "(rank 0)" in verdict, verdict
    assert "(among the ranks with a dump; rank 1 unknown)" in p.stdout
    j = run_main("summary", "--json", "-", str(d))
    doc = json.loads(j.stdout)["flight_recorder"]
    assert "its state unknown" in doc["verdict"] and doc["no_dump"].keys() == {"1"}, doc["verdict"]


# -- the formats, without a job -----------------------------------------------------------------
def test_entries_of_other_format_versions_and_point_to_point(jobs):
    """Fields a format version lacks (is_p2p, timeout_ms, pg_status, dtypes), numbers as text
    (the JSON form), and entries of no shape: read, skipped and counted; send/recv drawn, never
    matched as collectives."""
    raw = read_dump(str(jobs / "never" / f"{PREFIX}0"))
    for e in raw["entries"]:
        for k in ("is_p2p", "timeout_ms", "input_dtypes", "output_dtypes", "thread_id"):
            e.pop(k, None)
        e["collective_seq_id"] = str(e["collective_seq_id"])
    raw.pop("pg_status")
    raw["entries"].append({"record_id": 99})  # no profiling_name: skipped
    p2p = dict(raw["entries"][0], profiling_name="gloo:send 0->1", p2p_seq_id=1, record_id=100, retired=False)
    raw["entries"].append(p2p)
    d = frverdict.rank_dump(raw, 0)
    assert d.skipped == 1 and len(d.entries) == len(raw["entries"]) - 1
    assert d.entries[-1].p2p and d.entries[-1].op == "send 0->1"
    v = frverdict.verdict({0: d}, world=2)
    assert v.no_dump == {1: "no file of this rank"}
    (default,) = [g for g in v.groups if g.name == "0"]
    assert default.first is None and default.no_dump == [1]
    assert [e.op for e in default.at[0].in_flight] == ["send 0->1"], "no state, no pg_status: in flight"
    assert v.doc()["groups"][0]["ranks_at"]["0"]["in_flight"][0]["op"] == "send 0->1"


# -- point-to-point: pipelines that hang in send/recv ---------------------------------------------
# gloo records no send or recv in its Flight Recorder (torch 2.13); the pipelines log theirs
# (tests/scripts/fr_hang.py) and `as_nccl_p2p` writes them into the real dumps as NCCL records
# them. gloo's dumps as they are show only the collectives.
@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    """Both pipelines at once (2 ranks: pipe-ok/, nosend/; 3 ranks: chain/), each with its
    <case>-p2p/ logs."""
    return _run_jobs(tmp_path_factory.mktemp("fr-p2p"), (("pipe", 2, 2000), ("chain", 3, 2000)))


def as_nccl_p2p(src, dst, edit=None) -> None:
    """The dumps of src as NCCL records a pipeline: each rank's sends and recvs (its log beside
    the dump) entered where it issued them (gloo's op_id counts them: checked), named as NCCL
    names them ('nccl:send 0->1', 'nccl:recv 1<-0'), numbered per group (collective_seq_id: the
    collectives before it; p2p_seq_id: the group's sends and recvs so far, every peer's), sizes
    in and out; what ended "completed", what did not "started"; pg_status as NCCL counts (the
    last op's number: a send's or recv's, its p2p_seq_id) and pg_config. `edit(rank, dump)`
    then changes it."""
    os.makedirs(dst, exist_ok=True)
    files = sorted(os.listdir(src))
    for f in files:
        r = int(f[len(PREFIX):])
        d = pickle.loads((src / f).read_bytes())
        log = json.loads((src.parent / f"{src.name}-p2p" / f"rank{r}.json").read_text())
        ops = [(e["time_created_ns"], e, None) for e in d["entries"]]
        for rec in log:
            e = copy.deepcopy(d["entries"][0])
            side = f"send {r}->{rec['peer']}" if rec["kind"] == "send" else f"recv {r}<-{rec['peer']}"
            e.update(profiling_name=f"gloo:{side}", is_p2p=True, input_sizes=[rec["shape"]],
                     output_sizes=[rec["shape"]], input_dtypes=[rec["dtype"]], output_dtypes=[rec["dtype"]],
                     time_created_ns=rec["created_ns"], frames=[])
            ops.append((rec["created_ns"], e, rec))
        ops.sort(key=lambda x: x[0])
        entries, coll, p2p, status = [], 0, 0, [0, 0]
        for i, (t, e, rec) in enumerate(ops):
            if rec is None:
                assert e["op_id"] == i + 1, "gloo's op_id counts every send and recv: the log has them all"
                coll, done, end = e["collective_seq_id"], e["retired"], t + 50_000
            else:
                p2p += 1
                done, end = rec["ended_ns"] is not None, rec["ended_ns"]
            e.update(record_id=i, op_id=i + 1, p2p_seq_id=p2p, profiling_name="nccl:" + e["profiling_name"][5:],
                     state="completed" if done else "started", retired=done, time_discovered_started_ns=t + 20_000,
                     time_discovered_completed_ns=end if done else None)
            if rec is not None:
                e["collective_seq_id"] = coll
            number = p2p if rec is not None else coll
            status = [number, number if done else status[1]]
            entries.append(e)
        d["entries"] = entries
        d["pg_status"] = {"0": {"last_enqueued_collective": status[0], "last_started_collective": status[0],
                                "last_completed_collective": status[1]}}
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(len(files))))}}
        if edit is not None:
            edit(r, d)
        (dst / f).write_bytes(pickle.dumps(d))


def _p2p(doc: dict, group: str = "0") -> dict:
    return _group(doc, group)["point_to_point"]


def test_a_healthy_pipeline_every_send_meets_its_recv(pipes, tmp_path):
    """3 micro-batches forward and back, the step's all_reduce: every send met its recv, no
    verdict of them; fr_trace says nothing wrong either. gloo's dumps as they are (no send or
    recv in them; pg_status counting them by op_id) read as the same collectives."""
    as_nccl_p2p(pipes / "pipe-ok", tmp_path / "ok")
    doc = _verdict(tmp_path / "ok")
    fr = doc["flight_recorder"]
    assert doc["state"] == "no hang" and fr["lead"] is None and fr["first_point_to_point"] is None
    assert _p2p(doc) == {"pairs": 2, "matched": 6, "issues": []}
    assert fr["verdict"] == "no hang in the dumps: every group's ranks agree and every collective completed"
    assert "  point-to-point: every send met its recv (6 in 2 pairs)" in fr["lines"]
    assert fr_trace(tmp_path / "ok") == {}
    # the header counts the sends and recvs apart from the collectives (6 each side of 2 ranks)
    head = run_main("summary", str(tmp_path / "ok")).stdout.splitlines()[0]
    assert " collectives + 12 sends and recvs · " in head, head
    raw = _verdict(pipes / "pipe-ok")["flight_recorder"]
    assert raw["verdict"] == fr["verdict"] and raw["lines"][1] == fr["lines"][1] == \
        "default_pg [ranks 0, 1]: no disagreement; every collective completed (last #3)"


def test_a_stage_that_never_sends(pipes, tmp_path):
    """Rank 0 stuck before its 4th send (nothing in flight), rank 1 inside its 4th recv from
    it: named as such, with what rank 0 is doing. gloo's own dumps cannot tell (they hold no
    recv): no hang in them."""
    as_nccl_p2p(pipes / "nosend", tmp_path / "nosend")
    doc = _verdict(tmp_path / "nosend")
    fr = doc["flight_recorder"]
    want = ("rank 1 waits in recv 0->1 (#7, 256 B, Float[4, 16]) that rank 0 never sent (the 4th; rank 0 sent 3); "
            "rank 0: last completed all_reduce #3 (default_pg), nothing in flight")
    assert fr["verdict"] == "default_pg [ranks 0, 1]: point-to-point: " + want
    assert fr["short"] == "Flight Recorder: default_pg recv 0->1 #7: r0 never sent it"
    assert doc["state"] == "desync" and fr["lead"] == "p2p"
    (i,) = _p2p(doc)["issues"]
    assert (i["kind"], i["src"], i["dst"], i["index"], i["sent"], i["posted"], i["waiting"], i["culprit"], i["root"]) == \
        ("no_send", 0, 1, 4, 3, 4, 1, 0, True)
    assert i["send"] is None and i["recv"]["seq"] == 7 and i["recv"]["input_sizes"] == [[4, 16]]
    assert fr["first_point_to_point"] == {"group": "0", **i}
    g = _group(doc, "0")
    assert g["first_disagreement"] is None and _p2p(doc)["matched"] == 6
    assert [e["op"] for e in g["ranks_at"]["1"]["in_flight"]] == ["recv 1<-0"] and not g["ranks_at"]["0"]["in_flight"]
    assert fr["lines"][1:3] == ["default_pg [ranks 0, 1]: no disagreement up to #3; rank 1 with a send or recv in flight",
                                "  point-to-point: " + want]
    assert frverdict.headlines(fr)[1]
    raw = _verdict(pipes / "nosend")
    assert raw["state"] == "no hang" and _p2p(raw) == {"pairs": 0, "matched": 0, "issues": []}
    # fr_trace pairs the recv as if a collective (its collective_seq_id, 3): rank 0 missing
    assert fr_trace(tmp_path / "nosend") == {"0": (3, "missing", [0])}


@pytest.mark.parametrize("kind,shape,dtype", [("sizes", [4, 17], "Float"), ("dtypes", [4, 16], "Double")])
def test_a_recv_of_other_sizes_or_dtypes_than_its_send(pipes, tmp_path, kind, shape, dtype):
    """The healthy pipeline with rank 1's 2nd recv from rank 0 edited as NCCL records a recv of
    another size or dtype (gloo itself returns from such a send and recv, and records neither):
    named, the pair and which transfer; fr_trace names the same send for its sizes, and nothing
    for its dtypes."""
    def edit(r, d):
        if r == 1:
            (e,) = [e for e in d["entries"] if e["profiling_name"] == "nccl:recv 1<-0"][1:2]
            e.update(input_sizes=[shape], output_sizes=[shape], input_dtypes=[dtype], output_dtypes=[dtype])
    as_nccl_p2p(pipes / "pipe-ok", tmp_path / kind, edit)
    doc = _verdict(tmp_path / kind)
    fr = doc["flight_recorder"]
    got = "272 B, Float[4, 17]" if kind == "sizes" else "512 B, Double[4, 16]"
    assert fr["verdict"] == (f"default_pg [ranks 0, 1]: point-to-point: send 0->1 (#3, 256 B, Float[4, 16]) on rank 0 "
                             f"and its recv (#3, {got}) on rank 1: other {kind} (the 2nd from rank 0 to rank 1)")
    (i,) = _p2p(doc)["issues"]
    assert (i["kind"], i["index"], i["culprit"], i["waiting"]) == (kind, 2, None, None)
    assert _p2p(doc)["matched"] == 1 + 3  # (0->1's first; 1->0's three: its pairing goes on)
    assert doc["state"] == "desync" and fr["short"] == f"Flight Recorder: default_pg send 0->1 #3: r0 r1 other {kind}"
    # fr_trace pairs the send with the recv as if a collective (by collective_seq_id: 2, the
    # collectives before it), culprit rank 1; it compares no dtypes of a send and its recv
    fr_said = fr_trace(tmp_path / kind)
    assert fr_said == ({"0": (2, "mismatch", {1: "SIZE_OR_SYNTAX_MISMATCH"})} if kind == "sizes" else {}), fr_said


def test_a_three_stage_chain_stuck_at_its_first_stage_beside_its_collective(pipes, tmp_path):
    """Stages 0 -> 1 -> 2: rank 0 skipped its send and waits in the step's all_reduce; rank 1
    waits in its recv from 0, rank 2 in its recv from 1. Both verdicts: the collective's (ranks
    1, 2 never issued the all_reduce) and the point-to-point one, which leads (the ranks missing
    from the all_reduce wait in recvs): rank 0 never sent, and rank 2's wait is behind rank 1's.
    gloo's own dumps: the collective's verdict alike (its pg_status counts sends and recvs)."""
    as_nccl_p2p(pipes / "chain", tmp_path / "chain")
    doc = _verdict(tmp_path / "chain")
    fr = doc["flight_recorder"]
    root = ("rank 1 waits in recv 0->1 (#5, 64 B, Float[2, 8]) that rank 0 never sent (the 3rd; rank 0 sent 2); "
            "rank 0: all_reduce #3 (default_pg) in flight")
    assert fr["verdict"].startswith("default_pg [ranks 0-2]: point-to-point: " + root), fr["verdict"]
    assert fr["lead"] == "p2p" and doc["state"] == "desync"
    g = _group(doc, "0")
    d = g["first_disagreement"]
    assert (d["seq"], d["never_issued"], d["agree"]) == (3, [1, 2], [0])
    issues = _p2p(doc)["issues"]
    assert [(i["src"], i["dst"], i["kind"], i["root"]) for i in issues] == [(0, 1, "no_send", True), (1, 2, "no_send", False)]
    assert issues[1]["culprit_at"].startswith("recv 1<-0 #5 (default_pg) in flight")
    lines = fr["lines"]
    at = lines.index("default_pg [ranks 0-2]: first disagreement at all_reduce #3: rank 0 issued all_reduce "
                     "(32 B, Float[8]); ranks 1, 2 never issued it")
    assert lines[at + 1].startswith("  point-to-point: " + root)
    assert lines[at + 2].startswith("  point-to-point: rank 2 waits in recv 1->2 (#3, 64 B, Float[2, 8]) that rank 1 "
                                    "never sent (the 3rd; rank 1 sent 2); rank 1: recv 1<-0 #5 (default_pg) in flight")
    raw = _verdict(pipes / "chain")
    assert raw["flight_recorder"]["verdict"] == lines[at]  # (gloo's: the collective's only)
    with pytest.raises(AssertionError, match="can't get dst of non-p2p op"):
        fr_trace(tmp_path / "chain")  # (it takes the 3 ranks' sends and recvs for a coalesced group)


def _p2p_dump(rank: int, ops, group=("0", "default_pg"), first_record: int = 0, ranks=None) -> frverdict.RankDump:
    """A dump as NCCL writes one, of ops ('send 0->1' or 'recv 1<-0', shape, ended) in order."""
    entries = []
    for i, (op, shape, ended) in enumerate(ops):
        entries.append({"record_id": first_record + i, "process_group": list(group), "pg_id": int(group[0]),
                        "collective_seq_id": 0, "p2p_seq_id": first_record + i + 1, "op_id": first_record + i + 1,
                        "profiling_name": f"nccl:{op}", "is_p2p": True, "input_sizes": [shape], "output_sizes": [shape],
                        "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed" if ended else "started",
                        "retired": ended, "time_created_ns": 1_000_000 * (first_record + i + 1)})
    cfg = {group[0]: {"name": group[0], "desc": group[1], "ranks": str(ranks)}} if ranks else {}
    return frverdict.rank_dump({"version": "2.10", "entries": entries, "pg_config": cfg}, rank)


def test_point_to_point_cycles_wrapped_buffers_and_a_subgroup():
    """Without a job: two ranks that each wait in a recv from the other (a cycle, neither
    sends); a buffer that wrapped (its first sends gone: paired from the last that ended on
    both sides, no place said); a subgroup's ranks named as global ranks (NCCL names them by
    their place in the group)."""
    t = [4]
    v = frverdict.verdict({0: _p2p_dump(0, [("send 0->1", t, True), ("recv 0<-1", t, False)]),
                           1: _p2p_dump(1, [("recv 1<-0", t, True), ("recv 1<-0", t, False)])})
    (g,) = v.groups
    assert [(i.kind, i.pair, i.cycle, i.root) for i in g.p2p] == [("no_send", "0->1", [0, 1], False),
                                                                 ("no_send", "1->0", [0, 1], False)]
    assert v.headline().endswith("rank 1 waits in recv 0->1 (#2, 16 B, Float[4]) that rank 0 never sent (the 2nd; "
                                 "rank 0 sent 1); rank 0: recv 0<-1 #2 (default_pg) in flight; a cycle: ranks 0, 1 "
                                 "each wait for another of them"), v.headline()
    # rank 0's buffer wrapped: its first 5 sends to rank 1 gone; its 6th and 7th kept, the 7th in flight
    sends = [("send 0->1", t, True), ("send 0->1", t, False)]
    recvs = [("recv 1<-0", t, True)] * 6
    v = frverdict.verdict({0: _p2p_dump(0, sends, first_record=5), 1: _p2p_dump(1, recvs)})
    (g,) = v.groups
    assert g.p2p_matched == 1 and [(i.kind, i.index, i.waiting) for i in g.p2p] == [("no_recv", None, 0)]
    assert "rank 0 waits in send 0->1 (#7, 16 B, Float[4]) that rank 1 never posted a recv for; rank 1: " \
           "last completed recv 1<-0 #6 (default_pg), nothing in flight" in v.headline(), v.headline()
    # a subgroup of global ranks 2 and 5: 'send 0->1' on rank 2 is 2 -> 5
    grp = ("3", "pp")
    v = frverdict.verdict({2: _p2p_dump(2, [("send 0->1", t, True)], grp, ranks=[2, 5]),
                           5: _p2p_dump(5, [("recv 1<-0", [5], True)], grp, ranks=[2, 5])}, world=6)
    (g,) = [g for g in v.groups if g.name == "3"]
    assert [(i.kind, i.pair) for i in g.p2p] == [("sizes", "2->5")]
    assert v.short() == "Flight Recorder: pp (group 3) send 2->5 #1: r2 r5 other sizes"
