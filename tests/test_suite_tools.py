"""The suite's own tools: tests/cost.py reads what DDPTUI_TEST_COST made conftest write."""
from __future__ import annotations

import json

from tests import cost


def test_cost_ranks_tests_and_modules_by_their_cpu(tmp_path, capsys):
    rows = [{"test": "tests/test_a.py::t1", "worker": "gw0", "start": 0, "wall": 2.0, "self_cpu": 0.5, "children_cpu": 1.0},
            {"test": "tests/test_a.py::t2", "worker": "gw1", "start": 0, "wall": 9.0, "self_cpu": 0.1, "children_cpu": 8.0},
            {"test": "tests/test_b.py::t3", "worker": "gw0", "start": 0, "wall": 4.0, "self_cpu": 3.0, "children_cpu": 0.0}]
    f = tmp_path / "cost.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cost.main([str(f), "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "3 tests, 13 CPU-s (9 in processes they started), 15 s of test wall time"
    tests = [ln.split()[-1] for ln in out[3:5]]
    assert tests == ["tests/test_a.py::t2", "tests/test_b.py::t3"]  # the 2 costliest, costliest first
    mods = out[out.index(next(ln for ln in out if ln.endswith("module"))) + 1:]
    assert [ln.split() for ln in mods] == [["9.6", "11.0", "tests/test_a.py"], ["3.0", "4.0", "tests/test_b.py"]]


def test_cost_says_what_it_could_not_read(tmp_path, capsys):
    assert cost.main([str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert cost.main([str(tmp_path / "empty.jsonl")]) == 1
    assert "holds no test's line" in capsys.readouterr().out
