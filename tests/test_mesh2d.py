"""A 2D device mesh, torchtitan's layout, under `ddptui run --auto` (4 CPU ranks on gloo):
(dp, tp) = (2, 2), ColwiseParallel/RowwiseParallel inside each block on `tp`, FSDP2 on `dp`
(tests/scripts/tp2d.py). What is checked: the forward tensor-parallel all_reduce (DTensor's
redistribution of RowwiseParallel's output, a functional collective waited on through a view
of its result) is timed to the wait that needs it, as the backward one is; every collective
is named, counted and matched across ranks by its mesh dimension (`tp`, `dp`) in the table,
the JSON, the lanes, the waits and the exports; the ranks say their backend. One run for
the module; beside it, without torchrun, how a rank names a mesh's groups (a dimension over
every rank, HSDP's all-reduce) and how the app reads the names.
"""
from __future__ import annotations

import json
import os
import statistics

import pytest

from tests.helpers import ROOT, assert_no_leftovers, run_cli

SLOW, RUN = pytest.mark.slow, pytest.mark.xdist_group("mesh2d")  # (the tests of the one run: one worker)

ITERS = 6
COLL = 6  # (ranks.wire's span kind)


@pytest.fixture(scope="module")
def mesh2d(tmp_path_factory):
    """(its JSON, the recording loaded, stdout, stderr, the recording's path)."""
    from ddptui.recording.loader import load
    tmp = tmp_path_factory.mktemp("mesh2d")
    rec, js = tmp / "run.ddptui", tmp / "run.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "4", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "tp2d.py"), "--iters", str(ITERS), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_leftovers()
    return json.loads(js.read_text()), load(str(rec)), r.stdout, r.stderr, rec


def _durations(got, op: str, phase: str, group: str) -> list[float]:
    """ms of every COLL span of every rank and step (but the first) whose row is (op, phase,
    group's base name)."""
    out = []
    tables = got.store.collective_tables("fsdp")
    for k, ranks in got.store.span_batches()["fsdp"].items():
        for r, b in ranks.items():
            for i in range(len(b.kind)):
                row = tables[r].get(b.idx[i]) if b.kind[i] == COLL else None
                if k and row and row[1] == op and row[6] == phase and row[4].split("@")[0] == group:
                    out.append((b.t1[i] - b.t0[i]) / 1e3)
    return out


@SLOW
@RUN
def test_the_forward_tensor_parallel_all_reduce_is_timed(mesh2d):
    """RowwiseParallel's forward all_reduce ends where its result is first used (through
    to_local's view of it), not where it was issued: on gloo it is real work, of the order of
    the backward one of the same bytes (before, every one was 0.0 ms)."""
    doc, got, _, _, _ = mesh2d
    fwd = _durations(got, "all_reduce", "forward", "mesh_tp")
    bwd = _durations(got, "all_reduce", "backward", "mesh_tp")
    assert len(fwd) == len(bwd) == 4 * 2 * (ITERS - 1), (len(fwd), len(bwd))  # (4 ranks, 2 blocks)
    fm, bm = statistics.median(fwd), statistics.median(bwd)
    assert fm > 0.05 and fm > bm / 20, (fm, bm)
    assert sum(1 for d in fwd if d == 0) < len(fwd) / 4, fwd
    row = next(c for c in doc["strategies"][0]["collectives"]
               if (c["op"], c["phase"], c["group"]) == ("all_reduce", "forward", "tp"))
    assert row["median_ms"] > 0.05 and row["calls_per_step"] == 2, row
    # its layer stood waiting for it (WAIT: from the wait_tensor that needs it to its end): it
    # holds the layer up, exposed, not hidden by the layer it runs in (before: exposed 0)
    assert row["exposed_ms_per_step"] >= 0.5 * row["time_ms_per_step"] > 0, row
    waits = [b.waits for ranks in got.store.span_batches()["fsdp"].values() for b in ranks.values()]
    assert sum(len(w) > 0 for w in waits) >= len(waits) - 4, "the recording keeps the waits"


@SLOW
@RUN
def test_collectives_are_split_by_mesh_dimension(mesh2d):
    """The table and the JSON: a row per (op, mesh dimension, pass), tensor-parallel
    all_reduces on `tp`, FSDP2's all-gathers and reduce-scatters on `dp`, none on the whole
    world; the ranks say gloo (the mesh's groups), not 'undefined'."""
    doc, _, out, err, _ = mesh2d
    rows = {(c["op"], c["group"], c["phase"]): c for c in doc["strategies"][0]["collectives"]}
    assert set(rows) == {("all_reduce", "tp", "forward"), ("all_reduce", "tp", "backward"),
                         ("all_gather", "dp", "forward"), ("all_gather", "dp", "backward"),
                         ("reduce_scatter", "dp", "backward")}, sorted(rows)
    assert rows[("all_gather", "dp", "forward")]["calls_per_step"] == 3  # (the root and 2 blocks)
    for label in ("all_reduce@tp (forward)", "all_reduce@tp (backward)", "all_gather@dp (forward)",
                  "reduce_scatter@dp (backward)"):
        assert label in out, out
    assert "connected: cpu, gloo" in err and "undefined" not in err


@SLOW
@RUN
def test_the_global_batch_counts_each_sample_once(mesh2d):
    """8 sequences a rank on a (dp, tp) = (2, 2) mesh: the two ranks of a tp group are given the
    same samples, so the global batch is 16, not the 4 ranks' 32 (samples/s with it)."""
    doc, _, out, _, _ = mesh2d
    assert doc["batch"] == 16 and doc["batch_from"] == "inputs", (doc["batch"], doc["batch_from"])
    assert "global batch 16" in out


@SLOW
@RUN
def test_waits_are_matched_within_each_group(mesh2d):
    """Who waits for whom compares a rank with the ranks of its own group only (rank 1's tp
    all_reduce with rank 0's, never rank 2's), and says each dimension's waits (the JSON, the
    summary's line, the waits panel)."""
    doc, got, out, _, _ = mesh2d
    st = doc["strategies"][0]["stragglers"]
    assert set(st["wait_ms_median_by_group"]) == {"tp", "dp"}, st
    assert all(set(v) == {"0", "1", "2", "3"} for v in st["wait_ms_median_by_group"].values()), st
    assert " · tp r0 " in out and " · dp r0 " in out, out
    from ddptui.ui.widgets.waits import _by_group
    said = "".join(text for text, _ in _by_group(st))  # (the waits panel: who waits most, per dimension)
    assert said.startswith(" · ") and " · tp: r" in said and " · dp: r" in said, said
    tables = got.store.collective_tables("fsdp")
    seen = 0
    for k in got.store.complete_steps("fsdp"):
        w = got.store.step_waits("fsdp", k)
        for c in w.collectives:
            if c.kind != COLL:
                continue
            base, dim = tables[c.last][c.idx][4].split("@")[0], c.label
            assert len(c.ready) == 2 and c.last in c.ready, c  # (one group of 2 ranks)
            a, b = sorted(c.ready)
            assert (b - a == 1 and a % 2 == 0) if base == "mesh_tp" else (b - a == 2), (base, c.ready)
            assert dim == base[5:], (dim, base)
            seen += 1
    assert seen >= 12 * 2 * 3, seen  # (12 a step, on two groups each, over the steps kept)


@SLOW
@RUN
def test_lanes_say_the_dimension(mesh2d):
    """The comm lane's labels and the pane header say which collectives are tp and dp."""
    from ddptui.model.views import step_view
    from ddptui.ui.widgets.lanes import coll_look
    from ddptui.ui.widgets.timeline import _by_group
    _, got, _, _, _ = mesh2d
    v = step_view(got.store, "fsdp", got.store.complete_steps("fsdp")[-1])
    names = list(got.store.meta.layers)
    labels = {coll_look(row, names)[1] for row in v.coll_table(0).values()}
    assert {"AR@tp layers.0", "AR@tp layers.1", "AG@dp layers.0", "RS@dp layers.1", "AG@dp"} <= labels, labels
    assert _by_group(v) == " (dp 8 · tp 4)", _by_group(v)


@SLOW
@RUN
def test_exports_name_the_dimension(mesh2d, tmp_path):
    """The Chrome trace's slices 'all_reduce@tp layers.0' with mesh_dim, group and the group's
    first rank, and its last arriver in the slice's own group; the Kineto export's kernels."""
    _, _, _, _, rec = mesh2d
    out = tmp_path / "t.json"
    r = run_cli("export", str(rec), "-o", str(out))
    assert r.returncode == 0, r.stderr
    ev = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X" and "group" in e.get("args", {})]
    names = {e["name"] for e in ev}
    assert {"all_reduce@tp layers.0", "all_gather@dp layers.1", "reduce_scatter@dp"} <= names, names
    for e in ev:
        a = e["args"]
        assert a["group"] in ("mesh_tp", "mesh_dp") and a["mesh_dim"] == a["group"][5:], a
        rank, first = a["rank"], a["group_first_rank"]
        assert first == (rank - rank % 2 if a["mesh_dim"] == "tp" else rank % 2), a
        if "last_arriver" in a:
            last = a["last_arriver"]
            assert (last // 2 == rank // 2) if a["mesh_dim"] == "tp" else (last % 2 == rank % 2), a
    # where the compute stood waiting for a collective: a slice on a track of its own beside the
    # compute one, named for the collective it waited for, inside that collective's slice
    xs = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") in ("X", "M")]
    waits = [e for e in xs if e["name"].startswith("waiting for ")]
    assert waits and all(e["cat"] == "waits" and e["args"]["kind"] == "wait" for e in waits), len(waits)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in xs if e["name"] == "thread_name"}
    assert {threads[(e["pid"], e["tid"])] for e in waits} <= {"compute waits", "compute waits 2"}
    colls = [e for e in xs if e.get("ph") == "X" and e.get("cat") == "communication"]
    for e in waits:
        what = e["name"][len("waiting for "):]
        assert any(x["pid"] == e["pid"] and x["name"] == what and x["ts"] <= e["ts"] + 0.001
                   and e["ts"] + e["dur"] <= x["ts"] + x["dur"] + 0.001 for x in colls), e
    tp = [e for e in waits if e["name"].startswith("waiting for all_reduce@tp")]
    assert len(tp) >= 2 * 2 * 4 * (ITERS - 1), len(tp)  # (forward and backward, 2 blocks, 4 ranks)
    kdir = tmp_path / "kineto"
    r = run_cli("export", str(rec), "--format", "kineto", "-o", str(kdir))
    assert r.returncode == 0, r.stderr
    doc = json.loads((kdir / sorted(os.listdir(kdir))[0]).read_text())
    kern = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "ddptui: all_reduce@tp" in e["name"]]
    assert kern and all(e["args"]["mesh_dim"] == "tp" and e["args"]["Process Group Name"] == "mesh_tp"
                        for e in kern), kern[:1]
    # the layers' kernels are cut where their compute waited for a collective (WAIT): HTA reads
    # the overlap the summary prints, rank by rank (the tensor-parallel all_reduces exposed)
    if os.environ.get("CI") != "true":  # (.ci/run installs HTA: no skipping there)
        pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    from tests.helpers import hta_analysis
    got = hta_analysis(kdir)["overlap"]
    js = tmp_path / "s.json"
    r = run_cli("summary", str(rec), "--json", str(js))
    assert r.returncode == 0, r.stderr
    ours = {int(k): v for k, v in json.loads(js.read_text())["strategies"][0]["hta_overlap_pct"].items()}
    assert set(got) == set(ours) == {0, 1, 2, 3}
    assert all(abs(got[k] - ours[k]) <= 0.5 for k in got), (got, ours)


# -- without torchrun --------------------------------------------------------------------------
class _Pg:
    def __init__(self, size: int, desc: str, ranks: list[int]):
        self._size, self.group_desc, self.ranks = size, desc, ranks

    def size(self) -> int:
        return self._size


class _Mesh:
    """A DeviceMesh as colltap reads it: its dimensions' names and groups, its root."""
    def __init__(self, dims: dict):
        self.mesh_dim_names, self._groups = tuple(dims), list(dims.values())
        self._flatten_mapping = {}

    def get_group(self, i: int):
        return self._groups[i]

    def _get_root_mesh(self):
        return self


class _Rec:
    cur = 0
    def __init__(self):
        self.issued = []

    def comm_issue(self, rid, kind, synced=False):
        self.issued.append((rid, kind, synced))
        return len(self.issued) - 1


@pytest.fixture
def four_ranks(monkeypatch):
    """colltap's view of torch.distributed on a world of 4."""
    import torch.distributed as dist
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda pg: pg.ranks)


def test_a_rank_names_its_groups_by_mesh_dimension(four_ranks):
    """A dimension's group by the mesh's name (mesh_tp), one of several by its lowest rank
    (@2); a dimension over every rank runs on the default group: named once the rank has seen
    its mesh (an FSDP2 unit's, a DTensor collective's); a group outside any mesh as before."""
    from ranks.core.colltap import CollTap
    world, tp, other = _Pg(4, "default_pg", [0, 1, 2, 3]), _Pg(2, "mesh_tp", [2, 3]), _Pg(2, "undefined", [0, 2])
    tap = CollTap(_Rec())
    assert tap._group(world) == (4, "world") and tap._group(tp) == (2, "mesh_tp@2")
    assert tap._group(other)[1].startswith("group") and tap._group(other)[1].endswith("@0")
    tap.learn_mesh(_Mesh({"dp_shard": world, "tp": tp}))
    assert tap._group(world) == (4, "mesh_dp_shard") and tap._group(tp) == (2, "mesh_tp@2")
    tap.learn_mesh(object())  # (not a mesh: nothing learnt, nothing raised)


def test_hsdps_all_reduce_after_a_units_backward_synchronises_gradients(four_ranks):
    """FSDP2's post-backward all-reduce (HSDP across replicas; alone where a shard is one
    rank) makes a step as its reduce-scatter does; an all_reduce of the script's does not."""
    from ranks.core.colltap import CollTap
    rec = _Rec()
    tap = CollTap(rec, layer_of=lambda mods: 0)
    rep = _Pg(2, "mesh_dp_replicate", [0, 2])
    tap.unit = ((), "reduce")
    tap.enter("all_reduce", 64, rep)
    tap.unit = None
    tap.enter("all_reduce", 64, rep)
    assert [s for _, _, s in rec.issued] == [True, False]
    assert [row[3] for row in tap.rows] == ["mesh_dp_replicate@0"] * 2


def test_the_app_reads_group_names():
    from ddptui.model.collectives import group_label, group_parts, row_label, with_group
    assert group_parts("mesh_tp@2") == ("mesh_tp", 2) and group_parts("mesh_tp") == ("mesh_tp", None)
    assert group_parts("a@b") == ("a@b", None)
    assert [group_label(g) for g in ("mesh_tp@2", "mesh_dp_shard", "world", "default_pg", "group1@0",
                                     "mesh_tp (group 3)")] == ["tp", "dp_shard", "world", "world", "group1",
                                                                "tp (group 3)"]
    assert with_group("AR", "tp") == "AR@tp" and with_group("AR", "world") == "AR"
    assert row_label({"op": "all_reduce", "phase": "forward", "group": "tp"}) == "all_reduce@tp (forward)"
    assert row_label({"op": "all_gather", "phase": "forward"}) == "all_gather (forward)"  # (older JSON)


def test_a_collective_on_a_dimensions_groups_is_matched_within_each():
    """rank 0 and 1 in one tp group, 2 and 3 in another: one table row, two collectives, each
    with its own last arriver; the dp collective over all four stays one."""
    from ddptui.model.stragglers import Collective, rank_arrival_keys, split_by_group
    tp = Collective(2, 0, {0: 10, 1: 30, 2: 50, 3: 20}, {r: 60 for r in range(4)}, 2, 50, COLL)
    dp = Collective(3, 0, {r: 5 * r for r in range(4)}, {r: 60 for r in range(4)}, 3, 15, COLL)
    groups = {r: {2: (0 if r < 2 else 2, "tp"), 3: (None, "dp")} for r in range(4)}
    got = split_by_group([tp, dp], groups)
    assert [(c.group, c.label, sorted(c.ready), c.last, c.last_ready) for c in got] == [
        (0, "tp", [0, 1], 1, 30), (2, "tp", [2, 3], 2, 50), (None, "dp", [0, 1, 2, 3], 3, 15)]
    assert split_by_group([tp], {}) is None
    assert rank_arrival_keys([(COLL, 2, 0), (COLL, 3, 0), (2, 1, 0)], groups[3]) == [
        (COLL, 2, 0, 2), (COLL, 3, 0), (2, 1, 0)]


@SLOW
@RUN
@pytest.mark.asyncio
async def test_the_lanes_draw_where_a_layer_stood_waiting_for_a_collective(mesh2d):
    """The recording replayed in the app: on each rank's compute lane the stretches its layers
    stood waiting for a tensor-parallel all_reduce (WAIT) are cut out of the layer's bar and
    drawn as 'wait', and the legend says so."""
    from ddptui.recording.replay import ReplaySource
    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets import lanes, theme
    _, _, _, _, rec = mesh2d
    src = ReplaySource(str(rec), clock=lambda: 10**9)
    last = max(src.store.span_batches()["fsdp"]) if src.store.span_batches().get("fsdp") else ITERS - 1
    src.seek(ITERS - 1)
    v = src.store.view("fsdp", ITERS - 1)
    bars = lanes.compute_bars(v.spans[0], src.store.meta.layers)
    waits = [(a, z) for a, z, c, _ in bars if c == theme.COMPUTE_WAIT]
    layers = [(a, z) for a, z, c, _ in bars if c in (theme.FWD_A, theme.FWD_B, theme.BWD_A, theme.BWD_B)]
    assert len(waits) >= 4, bars  # (2 forward and 2 backward tensor-parallel all_reduces, at least)
    assert not any(a < z2 and a2 < z for a, z in waits for a2, z2 in layers), "a wait drawn as compute"
    app = DdpApp(ReplaySource(str(rec), clock=lambda: 10**9))
    async with app.run_test(size=(200, 50)) as pilot:
        app.source.seek(last)
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
    assert "compute waits" in text, text[-2000:]
