"""torch.profiler traces whose collectives are not only gradient AllReduces, read by
`ddptui summary|replay DIR`: real 2-rank CPU runs (gloo, torchrun) profiled by torch.profiler
(tests/kineto_record_colls.py): a script's own all_to_all (forward and backward),
all_gather_into_tensor, reduce_scatter_tensor, broadcast and barrier beside its all_reduce;
and FSDP2 (fully_shard per block, then the root)."""
from __future__ import annotations

import json

import pytest

from ddptui.recording.rankset import open_reader
from ranks import frames, wire
from tests.helpers import run_main

pytestmark = pytest.mark.slow

D = 64
BLOCK = 2 * D + (D * 2 * D + 2 * D) + (2 * D * D + D)  # LayerNorm, Linear(D, 2D), Linear(2D, D)
ROOT_UNIT = 128 * D + D * 128  # the root's own parameters: embedding and output


@pytest.fixture(scope="module")
def kineto_colls(kineto_traces):
    """One run (conftest's kineto_traces), two traces: (the explicit collectives' folder, FSDP2's)."""
    return kineto_traces["explicit"], kineto_traces["fsdp"]


@pytest.fixture
def explicit(kineto_colls):
    return kineto_colls[0]


@pytest.fixture
def fsdp(kineto_colls):
    return kineto_colls[1]


def _read(d: str):
    """(the reader, {rank: its collectives table rows}, {(rank, step): [(kind, idx)]} in time order)."""
    rd = open_reader(d)
    tables: dict = {}
    steps: dict = {}
    for _body, f in rd:
        assert not isinstance(f, frames.Invalid), f
        if type(f) is frames.Colls:
            assert all(r[0] >= len(tables.get(f.rank, [])) for r in f.rows)  # new rows only
            tables.setdefault(f.rank, []).extend(f.rows)
        elif type(f) is frames.Spans:
            b = wire.decode_spans(f)
            rows = {r[0] for r in tables.get(f.rank, [])}
            for k, i in zip(b.kind, b.idx):
                if k == wire.COLL:
                    assert i in rows  # the row came before the spans that name it
            steps[(f.rank, f.step)] = [(k, i) for k, i, _ in sorted(zip(b.kind, b.idx, b.t0), key=lambda x: x[2])
                                       if k in wire.COMM_KINDS]
    return rd, tables, steps


def _summary(d: str, tmp_path) -> dict:
    out = tmp_path / "s.json"
    p = run_main("summary", d, "--json", str(out))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return json.loads(out.read_text())


def test_a_scripts_own_collectives_are_coll_spans(explicit, tmp_path):
    rd, tables, steps = _read(explicit)
    assert rd.meta["strategies"] == ["ddp"]
    layers = rd.meta["layers"]
    assert layers == ["Linear_0", "Exchange_0", "Linear_1"]
    ex = layers.index("Exchange_0")
    # (op, bytes, group size, group, layer, phase, async): the buffer's bytes (the gathered
    # output of the all-gather, the reduce-scatter's input), the pass from the trace
    want = [("all_to_all", 8 * D * 4, 2, "world", ex, "forward", True),
            ("all_to_all", 8 * D * 4, 2, "world", ex, "backward", True),
            ("all_gather", 2 * 256 * 4, 2, "world", -1, "step", True),
            ("reduce_scatter", 2 * 256 * 4, 2, "world", -1, "step", True),
            ("broadcast", D * D * 4, 2, "world", -1, "step", True),
            ("barrier", 0, 2, "world", -1, "step", True)]
    for r in (0, 1):
        assert [tuple(row[1:]) for row in tables[r]] == want
        assert [row[0] for row in tables[r]] == list(range(6))
    assert sorted(steps) == [(r, k) for r in (0, 1) for k in (1, 2, 3)]
    for sp in steps.values():  # issue order: a2a, a2a, the gradients' all_reduce, AG, RS, BC, barrier
        assert sp == [(wire.COLL, 0), (wire.COLL, 1), (wire.COMM, 0)] + [(wire.COLL, i) for i in (2, 3, 4, 5)]
    doc = _summary(explicit, tmp_path)
    (s,) = doc["strategies"]
    assert s["allreduce_calls_per_step"] == 1 and s["collective_calls_per_step"] == 6
    n_params = (D * D + D) + (D * 10 + 10)
    assert s["bytes_per_step"] == 4 * n_params + sum(w[1] for w in want)
    rows = {(c["op"], c["phase"]): c for c in s["collectives"]}
    assert set(rows) == {("all_to_all", "forward"), ("all_to_all", "backward"), ("all_gather", "step"),
                         ("reduce_scatter", "step"), ("broadcast", "step"), ("barrier", "step"),
                         ("all_reduce", "backward")}
    assert rows[("all_reduce", "backward")]["gradients"] is True
    assert rows[("all_to_all", "forward")]["calls_per_step"] == 1
    p = run_main("replay", explicit, "--headless")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_fsdp2_trace_its_all_gathers_and_reduce_scatters(fsdp, tmp_path):
    rd, tables, steps = _read(fsdp)
    assert rd.meta["strategies"] == ["fsdp"]  # FSDP's own annotations: the fsdp pane
    layers = rd.meta["layers"]
    assert layers == ["Embedding_0", "FSDPBlock_0", "FSDPBlock_1", "Linear_4"]
    b0, b1 = layers.index("FSDPBlock_0"), layers.index("FSDPBlock_1")
    for r in (0, 1):
        rows = {row[0]: tuple(row[1:]) for row in tables[r]}
        for k in (1, 2, 3):
            sp = steps[(r, k)]
            assert all(kind == wire.COLL for kind, _ in sp)  # no gradient AllReduce under FSDP
            seq = [rows[i] for _, i in sp]
            fwd = [(x[0], x[1], x[4]) for x in seq if x[5] == "forward"]
            # the root's all-gather first (attributed to no layer), then each block's, in its forward
            assert fwd == [("all_gather", 4 * ROOT_UNIT, -1), ("all_gather", 4 * BLOCK, b0),
                           ("all_gather", 4 * BLOCK, b1)]
            bwd = [x for x in seq if x[5] == "backward"]
            assert [x[0] for x in bwd].count("all_gather") >= 1  # gathered again for the backward
            rs = [(x[1], x[4]) for x in bwd if x[0] == "reduce_scatter"]
            # each unit's gradients reduce-scattered after its backward: the last block first
            assert rs == [(4 * BLOCK, b1), (4 * BLOCK, b0), (4 * ROOT_UNIT, -1)]
            assert all(x[2] == 2 and x[3] == "world" for x in seq)
    doc = _summary(fsdp, tmp_path)
    assert doc["steps_read"] == {"fsdp": 3}
    (s,) = doc["strategies"]
    assert s["allreduce_calls_per_step"] == 0 and s["collective_calls_per_step"] >= 7
    ops = {(c["op"], c["phase"]) for c in s["collectives"]}
    assert {("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")} == ops
    assert s["comm_ms"] > 0
