"""NCCL's own timing of DDP's buckets, read from PyTorch's Flight Recorder (ranks/core/flightrec.py,
Recorder.comm_issue_fr/comm_seal/_fr_place, DDPStrategy without a comm hook).

Without a GPU the path runs on stand-ins that behave as PyTorch's does: a dump function whose
entries are shaped as torch 2.10+ writes them (the fields an H200 run printed: record_id,
process_group (name, desc), collective_seq_id, state, duration_ms once the watchdog retired
the collective, input_sizes/dtypes) and are completed only a while after the collective, from
another thread; and, end to end, gloo's real Flight Recorder in real torchrun ranks
(seam DDPTUI_FR_STANDIN)."""
from __future__ import annotations

import json
import os
import pickle
import threading
import time

import pytest

from ranks.core import flightrec
from ranks.core.flightrec import DumpError, FlightTimes, load_dump


def entry(rid, seq, group="0", dur_ms=None, state="completed", numel=1000):
    e = {"record_id": rid, "pg_id": int(group), "process_group": (group, "default_pg"),
         "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce",
         "time_created_ns": 1_795_804_695_080_773_534 + rid, "input_sizes": [[numel]],
         "input_dtypes": ["Float"], "output_sizes": [[numel]], "output_dtypes": ["Float"],
         "state": state, "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False}
    if dur_ms is not None:
        e["duration_ms"] = dur_ms
    return e


class Watchdog:
    """A stand-in ProcessGroupNCCL + Flight Recorder: collectives enqueued on one stream each
    take `dur_ms`; the watchdog thread retires finished ones (state completed, duration) every
    `poll_s`; the buffer keeps the last `size` entries; `dump()` gives the pickle bytes."""

    def __init__(self, size=64, poll_s=0.02, dur_ms=0.5):
        self.size, self.poll_s, self.dur_ms = size, poll_s, dur_ms
        self.entries: list = []
        self.seq: dict = {}
        self.rid = 0
        self.lock = threading.Lock()
        self.stop = False
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def issue(self, group="0", numel=1000) -> int:
        with self.lock:
            s = self.seq[group] = self.seq.get(group, 0) + 1
            self.entries.append((time.monotonic(), entry(self.rid, s, group, None, "scheduled", numel)))
            self.rid += 1
            self.entries = self.entries[-self.size:]
            return s

    def _loop(self):
        while not self.stop:
            time.sleep(self.poll_s)
            now = time.monotonic()
            with self.lock:
                for t, e in self.entries:
                    if e["state"] != "completed" and now - t >= self.dur_ms / 1e3:
                        e["state"] = "completed"
                        e["duration_ms"] = self.dur_ms

    def dump(self) -> bytes:
        with self.lock:
            return pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {},
                                 "entries": [dict(e) for _, e in self.entries]})


def test_a_dump_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    raw = pickle.dumps({"version": "2.10", "entries": [Evil()]})
    with pytest.raises(DumpError, match="refused: the dump asks for"):
        load_dump(raw)
    assert not marker.exists()
    good = pickle.dumps({"version": "2.10", "entries": [entry(0, 1, dur_ms=0.1)]})
    for bad in (good[:len(good) // 2], b"", b"not a pickle", pickle.dumps([1, 2])):
        with pytest.raises(DumpError):
            load_dump(bad)
    assert load_dump(good)["entries"][0]["collective_seq_id"] == 1
    assert flightrec.entry_bytes(entry(0, 1, numel=1000)) == 4000


def test_a_dump_that_fails_keeps_no_step_waiting():
    calls = [0]

    def broken():
        calls[0] += 1
        raise RuntimeError("NCCL communicator aborted")
    ft = FlightTimes(broken, interval_s=0.05)
    t = time.monotonic()
    assert ft.wait_for([("0", 1), ("0", 2)], deadline_s=5.0) is False
    assert time.monotonic() - t < 0.5 and calls[0] == 1
    assert ft.stats()["failed"] == "RuntimeError: NCCL communicator aborted"


def test_durations_arrive_after_the_watchdog_and_wrapped_entries_are_counted():
    wd = Watchdog(size=16, poll_s=0.02, dur_ms=0.5)
    try:
        ft = FlightTimes(wd.dump, interval_s=0.01)
        seqs = [wd.issue() for _ in range(5)]
        assert ft.refresh(force=True)
        # (seen before the watchdog retired them: not timed yet, asked again later)
        keys = [("0", s) for s in seqs]
        assert ft.wait_for(keys, deadline_s=2.0)
        assert [ft.get("0", s)[0] for s in seqs] == [500_000] * 5
        assert ft.get("0", seqs[0])[1] == 4000
        # 40 more than the buffer holds between two dumps: the first 24 are gone unread
        more = [wd.issue() for _ in range(40)]
        time.sleep(0.1)
        ft.refresh(force=True)
        assert ft.missed == 40 - 16
        assert ft.settled("0", more[0]) and ft.get("0", more[0]) is None  # (a later one finished)
        assert ft.get("0", more[-1]) is not None
        assert not ft.wait_for([("0", more[0])], deadline_s=0.5)  # (settled: no wait to the end)
    finally:
        wd.stop = True


def _fake_record(recorder, n_buckets, ready_ns, group="0"):
    """A step on a CPU Recorder whose clock reads `ready_ns` at each bucket's ready hook."""
    from ranks.core.recorder import FrEnd
    recorder.begin("ddp", 1)
    for b in range(n_buckets):
        recorder.comm_issue_fr(b, group)
    c = recorder.cur
    assert all(type(e) is FrEnd for e in c.comm_end)
    c.comm_ready[:] = ready_ns
    return c


def test_buckets_are_placed_after_their_ready_moment_and_never_overlap():
    from ranks.core.clocks import CpuClock
    from ranks.core.recorder import Recorder
    rec = Recorder(CpuClock(), 4, every=1)
    durs = {1: 2.0, 2: 0.5, 3: 1.0}  # ms, by sequence number

    def dump():
        return pickle.dumps({"entries": [entry(i, s, dur_ms=d) for i, (s, d) in enumerate(durs.items())]})
    rec.fr = FlightTimes(dump, interval_s=0.0)
    t0 = 1_000_000_000
    # bucket 1 ready 0.5 ms after bucket 0 (inside bucket 0's 2 ms); bucket 2 long after
    c = _fake_record(rec, 3, [t0, t0 + 500_000, t0 + 10_000_000])
    rec.comm_seal("0", 3)  # (the group's sequence number after the backward: 3)
    assert [e.seq for e in c.comm_end] == [1, 2, 3]
    rec.end()
    (item,) = rec.poll(wait=True)
    _, _, _, kinds, idxs, t0s, t1s, _ = item
    comm = [(i, a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == 2]
    starts = [a for _, a, _ in comm]
    ends = [b for _, _, b in comm]
    assert [i for i, _, _ in comm] == [0, 1, 2]
    assert starts[0] == t0 and ends[0] == t0 + 2_000_000
    assert starts[1] == ends[0], "bucket 1 must wait for bucket 0 on the one NCCL stream"
    assert ends[1] - starts[1] == 500_000
    assert starts[2] == t0 + 10_000_000, "bucket 2 starts at its own ready moment"
    assert all(s >= r for s, r in zip(starts, [t0, t0 + 500_000, t0 + 10_000_000]))
    assert rec.fr_untimed == 0


def test_a_rebuilt_layout_matches_each_bucket_to_its_own_collective():
    """The step's FrEnd slots are the group's last n collectives: with 4 buckets before DDP's
    rebuild and 2 after, each step's buckets take their own sequence numbers."""
    from ranks.core.clocks import CpuClock
    from ranks.core.recorder import Recorder
    rec = Recorder(CpuClock(), 4, every=1)
    table = {s: 0.1 * s for s in range(1, 7)}  # seq s lasts 0.1*s ms: which one a bucket got shows
    rec.fr = FlightTimes(lambda: pickle.dumps({"entries": [entry(s, s, dur_ms=d) for s, d in table.items()]}),
                         interval_s=0.0)
    got = []
    for n, last in ((4, 4), (2, 6)):
        c = _fake_record(rec, n, [10_000 * (j + 1) for j in range(n)])
        rec.comm_seal("0", last)
        rec.end()
        (item,) = rec.poll(wait=True)
        _, _, _, kinds, idxs, t0s, t1s, _ = item
        got.append([round((b - a) / 1e5) for k, a, b in zip(kinds, t0s, t1s) if k == 2])
    assert got == [[1, 2, 3, 4], [5, 6]]


def test_every_step_marked_each_bucket_is_ready_at_its_blocks_mark_with_no_hook():
    """The layer marks registered once (every step marked): no bucket hook is registered; each
    bucket's ready moment is the backward end of the block holding its last gradient, the very
    mark, and its span starts there or after the bucket before it. Sampled: the hooks are back."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from ranks.builtin.strategies import BucketReady, attach_layer_hooks
    from ranks.core.clocks import CpuClock
    from ranks.core.recorder import Recorder
    rec = Recorder(CpuClock(), 4, every=1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4)])
    marks = attach_layer_hooks(model, rec, "ddp")
    marks.move_after()
    weights = [next(b.parameters()) for b in model.children()]
    ready = BucketReady(rec, "0", active=not marks.on)
    ready.set([(0, weights[3]), (1, weights[1]), (2, weights[0])])
    assert len(ready.handles) == 3  # (sampled until the steps are timed: a hook a bucket)

    def switch(on):
        marks.set(on)
        ready.enable(not on)
    rec.switches["ddp"] = switch
    switch(True)
    assert marks.on and ready.handles == [], "every step marked: no bucket hook at all"
    rec.fr = FlightTimes(lambda: pickle.dumps({"entries": [entry(s, s, dur_ms=0.001) for s in (1, 2, 3)]}),
                         interval_s=0.0)
    rec.begin("ddp", 0, every=1)
    F.cross_entropy(model(torch.randn(2, 8)), torch.zeros(2, dtype=torch.long)).backward()
    c = rec.cur
    assert c.comm_idx == (), "no hook issued a bucket"
    rec.comm_seal("0", 3, [3, 1, 0])
    assert [c.comm_ready[j] is c.bwd_e[i] for j, i in enumerate((3, 1, 0))] == [True] * 3
    assert [e.seq for e in c.comm_end] == [1, 2, 3]
    rec.opt_begin(); rec.opt_end(last=True); rec.end()
    (item,) = rec.poll(wait=True)
    _, _, _, kinds, idxs, t0s, t1s, _ = item
    bwd_end = {i: b for k, i, b in zip(kinds, idxs, t1s) if k == 1}
    comm = [(i, a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == 2]
    assert [i for i, _, _ in comm] == [0, 1, 2] and rec.fr_untimed == 0
    for (i, a, b), blk in zip(comm, (3, 1, 0)):
        assert a >= bwd_end[blk], f"bucket {i} placed before its block's backward ended"
        assert b - a == 1_000
    switch(False)
    assert len(ready.handles) == 3, "layers sampled: the ready hooks are back"


def test_a_bucket_the_recorder_never_saw_is_a_moment_and_counted():
    from ranks.core.clocks import CpuClock
    from ranks.core.recorder import Recorder
    rec = Recorder(CpuClock(), 4, every=1)
    # seq 1 was overwritten; seq 2 finished (so seq 1 is settled: no wait)
    rec.fr = FlightTimes(lambda: pickle.dumps({"entries": [entry(5, 2, dur_ms=1.0)]}), interval_s=0.0)
    _fake_record(rec, 2, [100, 200])
    rec.comm_seal("0", 2)
    rec.end()
    t = time.monotonic()
    (item,) = rec.poll(wait=True)
    assert time.monotonic() - t < 0.5
    _, _, _, kinds, idxs, t0s, t1s, _ = item
    comm = [(a, b) for k, a, b in zip(kinds, t0s, t1s) if k == 2]
    assert comm[0] == (100, 100) and comm[1] == (200, 200 + 1_000_000)
    assert rec.fr_untimed == 1


def test_the_launcher_turns_nccl_timing_on_for_gpu_runs_and_keeps_the_users_choice():
    from ddptui.live.launcher import FR_BUFFER, nccl_timing_env
    env = nccl_timing_env({})
    assert env == {"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_FR_BUFFER_SIZE": str(FR_BUFFER)}
    mine = nccl_timing_env({"TORCH_NCCL_ENABLE_TIMING": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert mine == {"TORCH_NCCL_ENABLE_TIMING": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


@pytest.mark.slow
def test_buckets_stay_timed_after_ddp_is_wrapped_again_for_a_new_cap(tmp_path, monkeypatch):
    """Real torchrun ranks, DDP with no comm hook: every bucket's AllReduce timed from the
    Flight Recorder (gloo's, standing in for NCCL's: each lasts the stand-in's 0.3 ms), placed
    after its ready moment, never overlapping the one before it, every step kept (the last
    ones too); the recording's summary and its JSON say which path timed them. A bucket cap
    changed mid-run re-wraps DDP: the ready hooks of the old buckets go with the old DDP, the
    new buckets get theirs, and every bucket after the change is timed."""
    from ranks.wire import COMM
    from .helpers import assert_no_leftovers
    from ddptui.live.launcher import plan
    from ddptui.live.session import LiveRun, RunOptions
    monkeypatch.setenv("DDPTUI_FR_STANDIN", "0.3")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "512")
    # (30 steps: on a quick day 16 were over before the cap asked after the fourth was applied)
    run = LiveRun(RunOptions(model="small", strategies=["ddp"], steps=30, batch_size=256,
                             bucket_cap_mb=0.05, record=str(tmp_path / "cap.ddptui")), plan(2, None, "cpu"))
    run.start()
    deadline, changed = time.monotonic() + 150, False
    try:
        while not run.poll():
            assert time.monotonic() < deadline, "the run did not finish"
            if not changed and len(run.store.complete_steps("ddp")) >= 4:
                run.set_bucket_cap(1.0)
                changed = True
            time.sleep(0.05)
    finally:
        if run.state in ("running", "starting"):
            run.stop("test timeout")
    assert changed
    assert run.store.bucket_timing() == {"by": "flight-recorder", "ranks": {"0": "flight-recorder",
                                                                          "1": "flight-recorder"}, "untimed": 0}
    caps = [c for _, c in run.store.cap_changes]
    assert caps and caps[-1] == 1.0
    k_cap = run.store.cap_changes[-1][0]
    per_step = {}
    for k, by_rank in run.store.span_batches()["ddp"].items():
        for b in by_rank.values():
            comm = [(b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == COMM]
            per_step.setdefault(k, []).append(len(comm))
            assert all(abs((t1 - t0) - 300) <= 1 for t0, t1 in comm)
    before = {n for k, ns in per_step.items() if 2 <= k < k_cap for n in ns}
    after = {n for k, ns in per_step.items() if k >= k_cap + 2 for n in ns}
    # (0.05 MB: three buckets of small's gradients; 1 MB: two, DDP's first bucket kept small)
    assert before == {3} and after == {2}, per_step
    assert_no_leftovers()
    # the recording, read back: every step kept, each bucket after its ready moment and after
    # the one before it on the stream; its summary and JSON name the path
    from ddptui.recording.loader import load
    from .helpers import run_main, spans_of, step_batches
    rec = tmp_path / "cap.ddptui"
    batches = step_batches(load(str(rec)))
    assert sorted(batches) == list(range(30)), sorted(batches)
    for k, by_rank in batches.items():
        if k < 2:  # (before DDP's rebuild: untimed by design)
            continue
        for b in by_rank.values():
            comm = spans_of(b, 2)
            for (_, a0, a1), (_, b0, _) in zip(comm, comm[1:]):
                assert b0 >= a1, f"step {k}: a bucket overlaps the one before it on the stream"
    js = tmp_path / "s.json"
    summ = run_main("summary", str(rec), "--json", str(js))
    assert summ.returncode == 0 and "buckets timed by NCCL's own timing" in summ.stdout, summ.stdout[-2000:]
    (ddp,) = [x for x in json.loads(js.read_text())["strategies"] if x["strategy"] == "ddp"]
    assert ddp["bucket_timing"] == {"by": "flight-recorder", "ranks": {"0": "flight-recorder",
                                                                      "1": "flight-recorder"}, "untimed": 0}


@pytest.mark.slow
def test_a_users_ddp_script_has_its_buckets_timed_by_nccl_itself_and_a_hang_named(tmp_path):
    """`ddptui run --auto` on a plain DDP script (gloo's Flight Recorder standing in for NCCL's):
    no comm hook of ddptui's, each bucket timed by the Flight Recorder (the stand-in's 0.3 ms)
    although the script all_reduces a metric on the same group every iteration (each bucket's
    sequence number read when DDP hands it over: no guess at the last n); the metric's own
    all_reduce still timed by the collective tap; a rank 5 s late into its backward named
    within 5 s, rank 0 inside DDP's bucket (the process group's own last completed sequence
    number drops the buckets it finished); and a comm hook the script registers late (at
    iteration 7) puts ddptui's comm hook back around it, the steps going on."""
    import re

    from .helpers import ROOT, run_cli, spans_of, step_batches
    from ddptui.recording.loader import load
    rec, js = tmp_path / "fr.ddptui", tmp_path / "fr.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "2", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "stall.py"), "--iters", "10", "--bucket-at", "3",
                "--sleep", "5", "--at", "100", "--hook-at", "7", timeout=240,
                env={"DDPTUI_FR_STANDIN": "0.3", "TORCH_FR_BUFFER_SIZE": "512"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    m = re.search(r"no progress for (\d+) s: rank 0 inside DDP bucket 0 AllReduce #\d+ \(44,072 B, layers 2, 0\)"
                  r".*rank 1 never entered it", out)
    assert m and int(m.group(1)) <= 5, out[-3000:]
    doc = json.loads(js.read_text())
    (ddp,) = doc["strategies"]
    assert ddp["bucket_timing"]["by"] == "flight-recorder" and ddp["bucket_timing"]["untimed"] == 0, ddp
    batches = step_batches(load(str(rec)))
    assert sorted(batches) == list(range(10))
    for k in range(2, 7):  # (after DDP's rebuild, before the late hook)
        for b in batches[k].values():
            (bucket,) = spans_of(b, 2)
            assert abs((bucket[2] - bucket[1]) - 300) <= 1, (k, bucket)  # (µs, as stored)
            (metric,) = spans_of(b, 6)
            assert metric[2] > metric[1], "the script's own all_reduce is timed by the tap"
    late = [spans_of(b, 2) for k in (8, 9) for b in batches[k].values()]
    assert all(len(c) == 1 for c in late)
    # ddptui's comm hook again, around the script's: timed as it ran, not the stand-in's 0.3 ms
    assert not all(abs((c[0][2] - c[0][1]) - 300) <= 1 for c in late), late


@pytest.mark.slow
def test_accumulation_and_a_ddp_that_never_rebuilds_have_their_buckets_timed_by_nccl_itself(tmp_path):
    """`ddptui run --auto` on gradient accumulation (nanoGPT's `require_backward_grad_sync` flag
    and `no_sync()` in turn) over a DDP with find_unused_parameters and a layer used in some
    steps only (tests/scripts/accumulate.py), gloo's Flight Recorder standing in for NCCL's:
    such a DDP never rebuilds its buckets, and its first layout (two buckets here) is read as
    DDP made it; each optimizer step has exactly its two buckets, each the stand-in's 0.3 ms,
    one after the other: the accumulating backwards issue none and mark none (before: no
    bucket at all, the summary saying nothing was missing)."""
    from .helpers import ROOT, run_cli, spans_of, step_batches
    from ddptui.recording.loader import load
    rec, js = tmp_path / "acc.ddptui", tmp_path / "acc.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "2", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "accumulate.py"), "--iters", "6", "--micro", "2",
                "--how", "both", timeout=240, env={"DDPTUI_FR_STANDIN": "0.3", "TORCH_FR_BUFFER_SIZE": "512"})
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(js.read_text())
    (ddp,) = doc["strategies"]
    assert ddp["bucket_timing"]["by"] == "flight-recorder" and ddp["bucket_timing"]["untimed"] == 0, ddp
    batches = step_batches(load(str(rec)))
    assert sorted(batches) == list(range(6))
    for k in range(1, 6):  # (the first step: before any layout is read, untimed as DDP's first)
        for b in batches[k].values():
            comm = spans_of(b, 2)
            assert [i for i, _, _ in comm] == [0, 1], (k, comm)
            assert all(abs((t1 - t0) - 300) <= 1 for _, t0, t1 in comm), (k, comm)  # (µs, as stored)
            assert comm[1][1] >= comm[0][2], "a bucket overlaps the one before it on the stream"


@pytest.mark.slow
def test_a_ddp_whose_layout_cannot_be_read_goes_to_the_comm_hook_and_says_so(tmp_path):
    """NCCL's own timing needs DDP's bucket layout; a DDP that reports none (the seam
    DDPTUI_DDP_LAYOUT_HIDDEN: as a torch reporting it in another form would) has its buckets
    handed to ddptui's comm hook after its first steps, said once on the run's output and in
    the summary's JSON: from then on every step's buckets are timed (as they ran, not the
    stand-in's 0.3 ms), before it none was drawn as if timed."""
    from .helpers import ROOT, run_cli, spans_of, step_batches
    from ddptui.recording.loader import load
    rec, js = tmp_path / "hidden.ddptui", tmp_path / "hidden.json"
    r = run_cli("run", "--auto", "--headless", "--nproc-per-node", "2", "--record", str(rec), "--json", str(js),
                "--", os.path.join(ROOT, "tests", "scripts", "stall.py"), "--iters", "7", "--at", "100",
                timeout=240, env={"DDPTUI_FR_STANDIN": "0.3", "TORCH_FR_BUFFER_SIZE": "512",
                                  "DDPTUI_DDP_LAYOUT_HIDDEN": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    said = "DDP's bucket layout could not be read after 3 steps: its buckets are timed by ddptui's comm hook from now on"
    assert (r.stdout + r.stderr).count(said) == 1, (r.stdout + r.stderr)[-3000:]
    (ddp,) = json.loads(js.read_text())["strategies"]
    assert ddp["bucket_timing"]["by"] == "comm-hook", ddp["bucket_timing"]
    batches = step_batches(load(str(rec)))
    for k in range(3):  # (NCCL's path, its layout unknown: no bucket drawn as timed)
        assert all(not spans_of(b, 2) for b in batches[k].values()), k
    for k in range(4, 7):  # (ddptui's comm hook: every bucket, as it ran)
        for b in batches[k].values():
            comm = spans_of(b, 2)
            assert comm and not all(abs((t1 - t0) - 300) <= 1 for _, t0, t1 in comm), (k, comm)
