"""What `ddptui attach` names across polls (model/frwatch.py) and where a rank's Python is
(model/pystack.py), pure: on the dumps of a real gloo job made to hang (demo/fr-hang-2ranks-gloo,
tests/scripts/fr_hang.py: on a subgroup rank 1 never issued the 4th all_reduce; on the default
group rank 1 broadcast where rank 0 all_reduced), on pipelines' sends and recvs written as NCCL
records them (gloo's Flight Recorder records none; as tests/test_frdump.py writes them) and on
faulthandler's text as the debug server's dump_traceback writes it. The end-to-end test on a
live job: tests/test_attach.py."""
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



# -- point-to-point: a pipeline's sends and recvs, as NCCL records them ---------------------------
T0 = 1_700_000_000 * S  # when the stuck send or recv was issued (the job's clock)


def _nccl(rank: int, ops, wrapped: int = 0) -> frverdict.RankDump:
    """A rank's dump of the default group as NCCL writes one: ops ('send 0->1', 'recv 1<-0' or
    a collective; shape, ended, created_ns) in order, numbered as NCCL numbers them; `wrapped`:
    its first ones gone (the buffer wrapped)."""
    entries, p2p, coll = [], 0, 0
    for i, (op, shape, ended, t) in enumerate(ops):
        is_p2p = op.split(" ")[0] in ("send", "recv")
        p2p, coll = p2p + is_p2p, coll + (not is_p2p)
        entries.append({"record_id": i, "process_group": ["0", "default_pg"], "pg_id": 0,
                        "collective_seq_id": coll, "p2p_seq_id": p2p, "op_id": i + 1,
                        "profiling_name": f"nccl:{op}", "is_p2p": is_p2p, "input_sizes": [shape],
                        "output_sizes": [shape], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
                        "state": "completed" if ended else "started", "retired": ended, "time_created_ns": t,
                        "time_discovered_started_ns": t,
                        "time_discovered_completed_ns": t + S // 100 if ended else None})
    return frverdict.rank_dump({"version": "2.10", "entries": entries[wrapped:]}, rank)


def _pipeline(steps: int = 6):
    """Two stages' last `steps` steps, every send met: rank 0 sends its activations to rank 1
    and receives their gradients back, a step a second up to T0."""
    r0, r1 = [], []
    for k in range(steps):
        t = T0 - (steps - k) * S
        r0 += [("send 0->1", [4], True, t), ("recv 0<-1", [4], True, t + S // 2)]
        r1 += [("recv 1<-0", [4], True, t), ("send 1->0", [4], True, t + S // 2)]
    return r0, r1


def test_a_recv_that_no_send_answers_is_named_with_the_rank_that_never_sent():
    """Stage 1 posts its 7th recv from stage 0 at T0; stage 0 never sends it (stuck before its
    send). Polled a second apart: not named before --hang-s, named within 5 s of T0, with
    rank 0 (never sent) the late rank whose stack says why; resolved when the pair completes."""
    r0, r1 = _pipeline()
    dumps = {0: _nccl(0, r0), 1: _nccl(1, r1 + [("recv 1<-0", [4], False, T0)])}
    v = frverdict.verdict(dumps)
    w = Watch(hang_s=2.0)
    named = None
    for k in range(5):
        now = T0 + 3 * S // 10 + k * S
        events = w.update(v, now, 100.0 + k)
        if now - T0 < 2 * S:
            assert events == []
        elif named is None:
            (ev,) = events
            assert ev[0] == "named"
            named = ev[1]
        else:
            assert [e[0] for e in events] == ["still"]
    n = named
    assert n is not None and n.after_s() == pytest.approx(2.3) and n.after_s() <= 5
    assert (n.kind, n.group, n.name, n.pair, n.inside, n.never, n.other, n.late) == \
        ("hang", "default_pg", "recv 0->1 #13", "0->1", {1: pytest.approx(4.3)}, [0], {}, [0])
    n.stacks[0] = "train.py:11 in stall_here"  # (as attach fetches it)
    assert n.short() == ("hang: default_pg recv 0->1 #13: r1 waiting 4 s · r0 never sent it · "
                         "r0 at train.py:11 in stall_here")
    assert n.line() == ("hang: default_pg [ranks 0, 1] recv 0->1 #13 (16 B, Float[4]): rank 1 waiting in it for 4.3 s; "
                        "rank 0 never sent it (the 7th; rank 0 sent 6); rank 0: last completed recv 0<-1 #12 "
                        "(default_pg), nothing in flight")
    doc = n.doc()["point_to_point"]
    assert (doc["kind"], doc["src"], doc["dst"], doc["culprit"], doc["recv"]["seq"]) == ("no_send", 0, 1, 0, 13)
    # rank 0 sends it after all: the pair completes
    later = {0: _nccl(0, r0 + [("send 0->1", [4], True, T0 + 7 * S)]),
             1: _nccl(1, r1 + [("recv 1<-0", [4], True, T0)])}
    events = w.update(frverdict.verdict(later), T0 + 15 * S // 2, 105.5)
    assert [e[0] for e in events] == ["resolved"] and events[0][1] is n and events[0][2] == pytest.approx(7.5)
    assert w.current is None and w.update(frverdict.verdict(later), T0 + 17 * S // 2, 106.5) == []


def test_a_slow_stage_and_an_eager_send_are_no_hang():
    """A recv answered within --hang-s (stage 0's forward slower than usual) is never named;
    nor a send that completed with no recv posted yet (NCCL sends small ones eagerly): no rank
    waits in it."""
    r0, r1 = _pipeline()
    w = Watch(hang_s=2.0)
    waiting = frverdict.verdict({0: _nccl(0, r0), 1: _nccl(1, r1 + [("recv 1<-0", [4], False, T0)])})
    for k in range(4):
        assert w.update(waiting, T0 + (k + 1) * S * 4 // 10, 10.0 + k * 0.4) == []
    answered = {0: _nccl(0, r0 + [("send 0->1", [4], True, T0 + 18 * S // 10)]),
                1: _nccl(1, r1 + [("recv 1<-0", [4], True, T0)])}
    assert w.update(frverdict.verdict(answered), T0 + 2 * S, 12.0) == []
    eager = frverdict.verdict({0: _nccl(0, r0 + [("send 0->1", [4], True, T0)]), 1: _nccl(1, r1)})
    assert [i.kind for i in eager.groups[0].p2p] == ["no_recv"]
    assert Watch(hang_s=2.0).update(eager, T0 + 10 * S, 1.0) == []


def test_a_send_and_its_recv_of_other_sizes_is_a_desync():
    """Stage 1's 7th recv from stage 0 is of 5 floats, the send of 4: a desync named at once
    (both ranks' stacks); where a buffer wrapped (the pair's place unknown) only once it lasts."""
    r0, r1 = _pipeline()
    dumps = {0: _nccl(0, r0 + [("send 0->1", [4], False, T0)]), 1: _nccl(1, r1 + [("recv 1<-0", [5], False, T0)])}
    (ev,) = Watch().update(frverdict.verdict(dumps), T0 + S // 10, 1.0)
    n = ev[1]
    assert (ev[0], n.kind, n.name, n.never, n.late) == ("named", "desync", "send 0->1 #13", [], [0, 1])
    assert n.line() == ("desync: default_pg [ranks 0, 1] send 0->1 #13 (16 B, Float[4]): ranks 0, 1 waiting in it for "
                        "0.1 s; rank 0 sent Float[4], rank 1 posted its recv for Float[5] (other sizes; the 7th from "
                        "rank 0 to rank 1)")
    assert n.short() == "desync: default_pg send 0->1 #13: r0 r1 waiting 0 s · r0 r1 other sizes"
    wrapped = {**dumps, 0: _nccl(0, r0 + [("send 0->1", [4], False, T0)], wrapped=2)}
    w = Watch(hang_s=2.0)
    assert w.update(frverdict.verdict(wrapped), T0 + S // 10, 1.0) == []
    (ev,) = w.update(frverdict.verdict(wrapped), T0 + 21 * S // 10, 3.0)
    assert (ev[0], ev[1].kind, ev[1].name, ev[1].issue.index) == ("named", "desync", "send 0->1 #13", None)


def test_a_stage_waiting_in_a_recv_is_named_before_the_collective_it_never_issued():
    """Three ranks: rank 2 inside all_reduce #2, rank 1 never issued it because it waits in a
    recv from rank 0, which never sends: named is the recv, and rank 0 (the root), not the
    all_reduce that ranks 0 and 1 never issued."""
    t = T0 - 5 * S
    ar = ("all_reduce", [4], True, t)
    r0 = [ar, ("send 0->1", [4], True, t + S)]
    r1 = [ar, ("recv 1<-0", [4], True, t + S), ("recv 1<-0", [4], False, T0)]
    r2 = [ar, ("all_reduce", [4], False, T0)]
    v = frverdict.verdict({0: _nccl(0, r0), 1: _nccl(1, r1), 2: _nccl(2, r2)})
    assert v.lead()[0] == "p2p" and v.groups[0].first.never == [0, 1]
    w = Watch(hang_s=2.0)
    assert w.update(v, T0 + S, 1.0) == []
    (ev,) = w.update(v, T0 + 3 * S, 3.0)
    n = ev[1]
    assert (ev[0], n.kind, n.name, n.inside, n.late) == \
        ("named", "hang", "recv 0->1 #2", {1: pytest.approx(3.0)}, [0])
    assert n.short() == "hang: default_pg recv 0->1 #2: r1 waiting 3 s · r0 never sent it"


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
