"""What `ddptui attach` names across polls (model/frwatch.py) and where a rank's Python is
(model/pystack.py), pure: on the dumps of a real gloo job made to hang (demo/fr-hang-2ranks-gloo,
tests/scripts/fr_hang.py: on a subgroup rank 1 never issued the 4th all_reduce; on the default
group rank 1 broadcast where rank 0 all_reduced) and on faulthandler's text as the debug
server's dump_traceback writes it. The end-to-end test on a live job: tests/test_attach.py."""
from __future__ import annotations

import dataclasses
import os

import pytest

from ddptui.model import frverdict, pystack
from ddptui.model.frwatch import Watch
from ddptui.recording.frdump import FrDumpReader

from .helpers import ROOT

DEMO = os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo")
S = 1_000_000_000


@pytest.fixture(scope="module")
def demo():
    return FrDumpReader(DEMO).dumps


def _only(dumps, group: str) -> dict:
    return {r: dataclasses.replace(d, entries=[e for e in d.entries if e.group == group]) for r, d in dumps.items()}


def _live(dumps) -> dict:
    """The subgroup as a live job shows it before gloo's timeout: rank 0's all_reduce #4 in
    flight (not retired, not counted completed), rank 1 never issued it."""
    d0 = dumps[0]
    return {**dumps, 0: dataclasses.replace(d0, entries=[dataclasses.replace(e, retired=e.seq < 4) for e in d0.entries],
                                            status={**d0.status, "1": (4, -1, 3)})}


def _since(dumps, group: str, seq: int) -> int:
    return min(e.created_ns for d in dumps.values() for e in d.entries if e.group == group and e.seq == seq)


def test_a_collective_some_rank_never_issued_is_named_once_it_lasts(demo):
    dumps = _live(_only(demo, "1"))  # the subgroup: rank 1 never issued all_reduce #4
    t0 = _since(dumps, "1", 4)
    v = frverdict.verdict(dumps)
    w = Watch(hang_s=2.0)
    assert w.update(v, t0 + S // 2, 100.0) == []  # half a second in: a rank a little behind, not a hang
    (ev,) = w.update(v, t0 + 5 * S // 2, 102.0)  # no progress since: named
    assert ev[0] == "named"
    n = ev[1]
    assert (n.kind, n.group, n.name, n.never, list(n.inside), n.late) == ("hang", "group 1", "all_reduce #4", [1], [0], [1])
    assert n.inside[0] == pytest.approx(2.5) and n.after_s() == pytest.approx(2.5)
    assert n.line().startswith("hang: group 1 [ranks 0, 1] all_reduce #4 (256 B, Float[64]): rank 0 inside it for 2.5 s; "
                               "rank 1 never issued it")
    assert [e[0] for e in w.update(v, t0 + 4 * S, 103.5)] == ["still"] and n.inside[0] == pytest.approx(4.0)


def test_progress_in_the_group_is_no_hang(demo):
    """A collective old enough, but a rank keeps issuing in its group: a job whose backend runs
    ahead of its collectives (NCCL's queue), not named."""
    dumps = _live(_only(demo, "1"))
    t0 = _since(dumps, "1", 4)
    w = Watch(hang_s=2.0)
    for i in range(4):  # rank 0 issues one more a poll
        d0 = dumps[0]
        last = d0.entries[-1]
        more = [dataclasses.replace(last, record_id=last.record_id + 1 + j, seq=last.seq + 1 + j,
                                    created_ns=t0 + (2 * j + 5) * S // 2) for j in range(i + 1)]
        polled = {**dumps, 0: dataclasses.replace(d0, entries=d0.entries + more)}
        assert w.update(frverdict.verdict(polled), t0 + (i + 3) * S, 10.0 + i) == []


def test_another_op_at_the_same_number_is_a_desync_named_at_once(demo):
    dumps = _only(demo, "0")  # the default group: rank 1 broadcast #6 where rank 0 all_reduced
    t0 = _since(dumps, "0", 6)
    (ev,) = Watch().update(frverdict.verdict(dumps), t0 + S // 10, 1.0)
    n = ev[1]
    assert (ev[0], n.kind, n.group, n.name, n.other, n.late) == \
        ("named", "desync", "default_pg", "all_reduce #6", {1: "issued broadcast instead"}, [1])


def test_a_hang_that_ended_by_its_timeout_is_named_so(demo):
    """As the demo's dumps were taken: rank 0's all_reduce #4 ended by gloo's timeout."""
    dumps = _only(demo, "1")
    (ev,) = Watch().update(frverdict.verdict(dumps), _since(dumps, "1", 4) + 3 * S, 1.0)
    n = ev[1]
    assert (n.inside, n.failed, n.never) == ({}, [0], [1])
    assert "rank 0 issued it, ended by an error (its timeout?); rank 1 never issued it" in n.line()


def test_a_named_hang_that_goes_on_is_resolved(demo):
    dumps = _live(_only(demo, "1"))
    t0 = _since(dumps, "1", 4)
    w = Watch(hang_s=2.0)
    assert w.update(frverdict.verdict(dumps), t0 + 10 * S, 1.0)[0][0] == "named"
    # rank 1 issues #4 after all, and both complete it (retired)
    d0, d1 = dumps[0], dumps[1]
    done0 = [dataclasses.replace(e, retired=True) for e in d0.entries]
    d0 = dataclasses.replace(d0, status={**d0.status, "1": (4, -1, 4)})
    mine = dataclasses.replace(d0.entries[-1], rank=1, retired=True, record_id=d1.entries[-1].record_id + 1)
    later = {0: dataclasses.replace(d0, entries=done0), 1: dataclasses.replace(d1, entries=d1.entries + [mine])}
    events = w.update(frverdict.verdict(later), t0 + 11 * S, 2.0)
    assert [e[0] for e in events] == ["resolved"] and events[0][2] == pytest.approx(11.0)
    assert w.current is None


TRACEBACK = """\
Current thread 0x00007f56adffb6c0 (most recent call first):
  <no Python frame>

Thread 0x00007f56c8bff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f56d59e2b80 (most recent call first):
  File "/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/site-packages/torch/_tensor.py", line 623 in backward
  File "/job/train.py", line 16 in step
  File "/job/train.py", line 40 in <module>
"""


def test_the_training_threads_line_is_read_from_faulthandlers_text():
    stacks = pystack.parse(TRACEBACK)
    assert [(s.current, len(s.frames)) for s in stacks] == [(True, 0), (False, 2), (False, 4)]
    main = pystack.main_stack(stacks)
    assert main is stacks[2]
    assert pystack.where(main).short() == "graph.py:979 in _engine_run_backward"
    assert pystack.own_frame(main).short() == "train.py:16 in step"
    assert pystack.describe(main) == "torch/autograd/graph.py:979 in _engine_run_backward (called from train.py:16 in step)"
    own = pystack.parse('Thread 0x1 (most recent call first):\n  File "/job/train.py", line 11 in stall_here\n'
                        '  File "/job/train.py", line 21 in <module>\n')
    assert pystack.describe(pystack.main_stack(own)) == "train.py:11 in stall_here"
    assert pystack.main_stack(pystack.parse("not a traceback")) is None and pystack.describe(None) == ""


def test_a_rank_inside_a_deep_import_is_at_the_module_imported_called_from_its_own_line():
    """Seen attaching to a job still starting: rank 0 importing torch._dynamo inside DDP's
    constructor, 90 frames of importlib: its line was '<frozen importlib._bootstrap>:241 in
    _call_with_frames_removed' and its own line lost past the frames kept."""
    frozen = ['  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed',
              '  File "<frozen importlib._bootstrap_external>", line 940 in exec_module',
              '  File "<frozen importlib._bootstrap>", line 1176 in _find_and_load']
    lines = ["Thread 0x00007f56d59e2b80 (most recent call first):", *frozen[:1],
             '  File "/v/site-packages/torch/_dynamo/variables/builder.py", line 298 in <module>']
    while len(lines) < 90:
        lines += frozen + ['  File "/v/site-packages/torch/_dynamo/trace_rules.py", line 60 in <module>']
    lines += ['  File "/v/site-packages/torch/nn/parallel/distributed.py", line 850 in __init__',
              '  File "/job/train_debug_server.py", line 39 in main',
              '  File "/job/train_debug_server.py", line 55 in <module>']
    (st,) = pystack.parse("\n".join(lines) + "\n")
    assert len(st.frames) == pystack.MAX_FRAMES and st.frames[-1].short() == "train_debug_server.py:55 in <module>"
    assert pystack.main_stack([st]) is st
    assert pystack.where(st).short() == "builder.py:298 in <module>"
    assert pystack.describe(st) == ("torch/_dynamo/variables/builder.py:298 in <module> "
                                    "(called from train_debug_server.py:39 in main)")
