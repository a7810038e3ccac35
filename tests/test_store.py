"""The Store (ddptui/model/store/) by feature: its intake (ingest, a refusal that changes
nothing, one handler per frame type), its figuring (figures of complete steps, eviction
within bounds), its queries (what is in force at a step, who waited for whom, copies handed
out) and the rule that readers outside it go through those queries."""
from __future__ import annotations

import copy
import os
import re
import threading
from statistics import mean

import pytest
from hypothesis import given, settings

from ddptui.model import figures, stragglers
from ddptui.model.store import RankInfo, Store, in_force
from ddptui.model.store.history import in_force_span
from ddptui.model.store.figuring import Figuring
from ddptui.model.store.intake import Intake
from ddptui.model.store.queries import Queries
from ddptui.recording.synthetic import SyntheticRun, fill_store
from ranks import frames, spec
from ranks.wire import BWD, COMM, FWD, STEP

from .bad_frames import TYPES, bad_frame
from .helpers import examples, synthetic_frames, synthetic_meta
from .test_bad_frames import CONTROL, META, good_frames

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def state(st: Store):
    """Everything a frame could change, as plain data."""
    with st.lock:
        return copy.deepcopy((
            {r: vars(i) | {"last_seen": 0} for r, i in st.ranks.items()}, st.meta.as_dict(),
            {s: {k: sorted(v) for k, v in per.items()} for s, per in st.raw.items()},
            st.bucket_assignments, st.reported_sizes, st.events, st.cap_changes, list(st.gpu), list(st.cpu),
            st.spans, st.rejected, [x[1:] for x in st.log]))


def store_of(steps: int = 6, keep_steps: int = 400, **kw) -> Store:
    """A Store fed a synthetic run's frames (tests/helpers.synthetic_frames), figures made."""
    st = Store(keep_steps=keep_steps)
    for f in synthetic_frames(steps=steps, **kw):
        st.ingest(f)
    st.update()
    return st


# -- the parts ---------------------------------------------------------------------------------
def test_the_store_is_its_three_parts_sharing_one_state():
    assert Store.__mro__[1:4] == (Intake, Figuring, Queries)
    st = Store()
    assert {"ingest", "set_meta", "add_log"} <= set(vars(Intake))
    assert {"update", "rank_figures", "bucket_figures", "comm_bytes_fn"} <= set(vars(Figuring))
    assert {"view", "summaries", "step_batches", "step_waits", "marks", "ddp_reported",
            "bucket_assignment", "step_figures"} <= set(vars(Queries))
    own = [{n for n in vars(part) if not n.startswith("__")} for part in (Intake, Figuring, Queries)]
    assert not (own[0] & own[1] or own[0] & own[2] or own[1] & own[2])  # each method in one part
    declared = set(vars(st))  # the state: declared in Store.__init__, none added by the parts
    assert not any("__init__" in vars(part) for part in (Intake, Figuring, Queries))
    fill_store(st, SyntheticRun("small", 2, ("naive", "ddp")), 3)
    st.summaries(), st.view("ddp", 2), st.bucket_figures("ddp", 2), st.hosts(), st.clock_offsets()
    assert set(vars(st)) == declared
    assert st.node_of is st.host_clocks.node_of and st.clocks is st.host_clocks.clocks


# -- intake: ingest, a refusal, the handlers -----------------------------------------------------
@settings(max_examples=examples(300), deadline=None)
@given(bad_frame(types=tuple(t for t in TYPES if t not in CONTROL)))
def test_a_refused_frame_changes_nothing_in_the_store(f):
    st = Store()
    st.set_meta(META)
    for g in good_frames(2):
        st.ingest(g)
    before = state(st)
    with pytest.raises(frames.FrameError):
        st.ingest(f)
    assert state(st) == before  # no partial RankInfo, no half-applied bucket assignment


@pytest.mark.parametrize("bad", [
    frames.Buckets(rank=0, strategy="ddp", step=3, buckets=[(0, [0, 1], 8), (1, [1], 4)]),  # param twice
    frames.Buckets(rank=0, strategy="ddp", step=3, buckets=[(0, [10_000], 8)]),  # no such param
    frames.Hb(rank=2, step=1),  # outside the world of 2
    frames.Event(rank=0, step=3, what="slow_ms", value=5.0),  # a straggler without rank and layer
    frames.Event(rank=0, step=3, what="bucket_cap_mb", value=0.0),
    frames.spans_frame(1, "single", 3, 10**9, [STEP], [0], [10**9], [10**9 + 5], []),  # single: rank 0 only
    frames.spans_frame(0, "interleaved", 3, 10**9, [STEP], [0], [10**9], [10**9 + 5], []),  # not this run's
    frames.Stop(),  # a control frame: for ranks, not the store
], ids=["param-twice", "param-range", "rank-range", "straggler", "cap", "single", "strategy", "control"])
def test_each_kind_of_refusal_leaves_the_state_and_version_as_they_were(bad):
    st = store_of(steps=3)
    before, version = state(st), st.version
    with pytest.raises(frames.FrameError):
        st.ingest(bad)
    assert state(st) == before and st.version == version


def test_a_frame_counts_once_in_version_and_a_map_is_taken_as_its_struct():
    st = Store()
    st.set_meta(synthetic_meta())
    v = st.version
    st.ingest({"t": "phase", "r": 0, "ph": "training"})
    assert st.version == v + 1 and st.ranks[0].phase == "training"
    st.ingest(frames.Phase(rank=1, phase="building"), validated=True)
    assert st.version == v + 2 and st.ranks[1].phase == "building"


def test_hello_describes_the_rank_and_the_run():
    st = Store()
    st.ingest(frames.Hello(rank=1, world=2, pid=42, device="cuda:1", backend="nccl", note="n", uuid="GPU-1",
                           model="small", layers=spec.layer_names("small"),
                           params=[tuple(p) for p in spec.param_table("small")], strategies=["naive", "ddp"]))
    info = st.ranks[1]
    assert (info.pid, info.device, info.backend, info.note, info.uuid) == (42, "cuda:1", "nccl", "n", "GPU-1")
    assert info.connected and info.phase == "connected" and info.last_seen > 0
    assert st.meta.world == 2 and st.world == 2 and st.strategies() == ["naive", "ddp"]
    assert st.limits.world == 2 and st.limits.n_params == len(spec.param_table("small"))
    assert st._param_bytes == spec.grad_bytes(spec.param_table("small"))
    assert st.log_lines()[-1][1:] == ("info", "rank 1 connected: cuda:1, nccl")
    with pytest.raises(frames.FrameError, match="outside this run"):  # the run's limits now hold
        st.ingest(frames.Phase(rank=2, phase="x"))


def test_the_rank_handlers():
    st = Store()
    st.set_meta(synthetic_meta(world=4))
    st.ingest(frames.Drop(rank=3, why="closed"))  # a rank never seen: nothing made for it
    assert st.ranks == {}
    st.ingest(frames.Hb(rank=0, step=7, phase="training", dropped=3, residual_ns=120))
    i = st.ranks[0]
    assert (i.step, i.dropped_spans, i.clock_res_ns, i.phase) == (7, 3, 120, "training")
    st.ingest(frames.Hb(rank=0, step=8, phase="other"))  # a phase past "connected" stays
    assert st.ranks[0].phase == "training" and st.ranks[0].step == 8 and st.ranks[0].clock_res_ns == 120
    st.ingest(frames.Bye(rank=0, dropped=5))
    assert st.ranks[0].finished and st.ranks[0].phase == "done" and st.ranks[0].dropped_spans == 5
    st.ingest(frames.Error(rank=1, msg="boom\n  at line 3\t" + "x" * 400))
    e = st.ranks[1]
    assert e.phase == "failed" and len(e.error) == 298 and e.error.startswith("boom at line 3 x")
    assert e.error.endswith("…") and st.log_lines()[-1][1] == "error"
    for r in (0, 1, 2):
        st.ingest(frames.Exit(rank=r, status="exit code 1"))
    assert [st.ranks[r].phase for r in (0, 1, 2)] == ["done", "failed", "died"]  # only 2 died unsaid
    assert st.ranks[2].exit == "exit code 1"
    st.ingest(frames.Phase(rank=3, phase="training"))
    st.ranks[3].connected = True
    st.ingest(frames.Drop(rank=3, why="closed"))
    assert not st.ranks[3].connected and st.ranks[3].phase == "training"
    assert st.dropped_spans() == [(0, 5)]


def test_the_run_handlers_events_buckets_samples_log_rejections():
    st = Store()
    st.set_meta(synthetic_meta(strategies=("naive", "ddp")))
    st.ingest(frames.Event(rank=0, step=4, what="bucket_cap_mb", value=5.0))
    st.ingest(frames.Event(rank=1, step=4, what="bucket_cap_mb", value=5.0))  # rank 0's counts
    st.ingest(frames.Event(rank=0, step=6, what="slow_ms", value=30.0, slow_rank=1, layer=0))
    st.ingest(frames.Event(rank=0, step=9, what="slow_ms", value=0.0, slow_rank=1, layer=0))
    assert st.cap_changes == [(4, 5.0)] and st.slow_changes == [(6, 30.0, 1, 0), (9, 0.0, 1, 0)]
    layer = spec.layer_names("small")[0]
    assert st.marks("ddp", 4) == ["bucket_cap_mb → 5 MB"] and st.marks("naive", 4) == []
    assert st.marks("naive", 6) == st.marks("ddp", 6) == [f"straggler rank 1 {layer} +30 ms"]
    assert st.marks("ddp", 9) == ["straggler off"]
    a = [(0, [3, 2], 800), (1, [1, 0], 400)]
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=0, buckets=a, cap_mb=25.0, ddp_reported=[800, 400]))
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=1, buckets=a))  # the same: no new entry
    st.ingest(frames.Buckets(rank=1, strategy="ddp", step=0, buckets=a))
    b = [(0, [3, 2, 1, 0], 1200)]
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=5, buckets=b, cap_mb=50.0))
    assert st.bucket_history("ddp", 0) == [(0, [[0, [3, 2], 800], [1, [1, 0], 400]]), (5, [[0, [3, 2, 1, 0], 1200]])]
    assert st.bucket_assignments[("ddp", 0)][0][1] == {0: 800, 1: 400}
    assert st.bucket_reporters() == {0, 1}
    assert st.ddp_reported("ddp") == [800, 400] and st.ddp_reported("ddp", 1) is None
    assert st.meta.bucket_cap_mb_now == 50.0
    run = SyntheticRun("small", 2)
    st.ingest(run.gpu_frame(0))
    st.ingest(frames.Cpu(ts=5, ranks={"0": 90.0}))
    assert [len(x) for x in st.samples()] == [1, 1]
    st.ingest(frames.Status(text="spawning", level="warn"))
    st.ingest(frames.Reject(rank=1, why="bad hb"))
    st.ingest(frames.Reject(frame_type="spans", why="bad"))
    st.ingest(frames.Reject(why="token"))
    assert st.rejected == 3
    assert [t for _, _, t in st.log_lines()] == [
        "spawning", "rejected rank 1: bad hb", "rejected a spans frame: bad", "rejected unauthenticated client: token"]


def test_node_and_clock_frames_map_a_hosts_times_onto_node_0s():
    st = Store()
    st.set_meta(synthetic_meta(world=4))
    for r in range(4):
        st.ingest(frames.Node(rank=r, node=r // 2, host=f"h{r // 2}"))
    assert st.node_of == {0: 0, 1: 0, 2: 1, 3: 1} and st.hosts() == {}  # (no rank has spoken yet)
    assert st.to_common(3, 10**9) == 10**9  # no clock yet: identity
    st.ingest(frames.Clock(node=1, host="h1", offset_ns=5000, uncertainty_ns=100))
    assert st.to_common(3, 10**9) == 10**9 - 5000 and st.to_common(0, 10**9) == 10**9
    assert "node 1 (h1): clock +0.005 ms" in st.log_lines()[-1][2]
    st.ingest(frames.Clock(node=1, host="h1", offset_ns=6000, uncertainty_ns=50, ntp_offset_ns=5000,
                           ntp_uncertainty_ns=100, collectives=40, steps=8))
    assert "refined from 40 collectives" in st.log_lines()[-1][2]
    offs = st.clock_offsets()
    assert [o["node_rank"] for o in offs] == [0, 1] and offs[1]["offset_ns"] == 6000
    b = frames.spans_frame(3, "naive", 0, 10**9, [STEP], [0], [10**9], [10**9 + 1000], [])
    st.ingest(b)
    assert st.raw["naive"][0][3].base_ns == 10**9 - 6000 and st._shift[("naive", 0)] == {3: 6000}
    assert st.hosts() == {1: [3]}


def test_spans_are_kept_as_they_came_and_mark_their_step_for_figuring():
    st = Store()
    fs = synthetic_frames(steps=2)
    for f in fs:
        st.ingest(f)
    n = sum(len(f.kind) for f in fs if type(f) is frames.Spans)
    assert st.spans == n and st._dirty == {"naive": {0, 1}, "ddp": {0, 1}}
    assert sorted(st.raw["ddp"][1]) == [0, 1] and st.ranks[1].step == 1
    assert st.complete_steps("ddp") == []  # nothing figured before update()
    st.update()
    assert st.complete_steps("ddp") == [0, 1] and st._dirty == {"naive": set(), "ddp": set()}


def test_a_handler_may_be_replaced_on_one_store():
    st = Store()
    seen = []
    st._handlers = dict(Store._handlers)
    st._handlers[frames.Phase] = lambda self, f: seen.append(f.phase)
    st.ingest(frames.Phase(rank=0, phase="x"))
    assert seen == ["x"] and 0 not in st.ranks and Store()._handlers is Store._handlers


# -- figuring: complete steps, eviction ----------------------------------------------------------
def test_store_summary_and_eviction_from_synthetic_run():
    st = Store(keep_steps=10)
    fill_store(st, SyntheticRun("small", 2, ("naive", "interleaved", "ddp", "single")), 30)
    rows = {r["strategy"]: r for r in st.summaries()}
    assert rows["naive"]["steps"] == 30 and rows["single"]["ranks"] == 1
    assert rows["naive"]["overlap_pct"] == 0
    assert rows["interleaved"]["overlap_pct"] > 0
    assert rows["ddp"]["allreduce_calls_per_step"] == len(st.bucket_assignment("ddp"))
    assert len(st.raw["naive"]) == 10 and st.view("naive", 5) is None
    v = st.view("ddp", 29)
    assert set(v.spans) == {0, 1} and v.n_buckets == len(st.bucket_assignment("ddp"))
    assert figures.speedups(list(rows.values()))["ddp_vs_naive"] > 1


def test_figures_only_of_steps_every_rank_sent():
    fs = synthetic_frames(steps=4)
    late = [f for f in fs if type(f) is frames.Spans and f.rank == 1 and f.strategy == "ddp" and f.step == 2]
    st = Store()
    for f in fs:
        if f not in late:
            st.ingest(f)
    st.update()
    assert st.complete_steps("ddp") == [0, 1, 3] and st.complete_steps("naive") == [0, 1, 2, 3]
    assert st.step_waits("ddp", 2) is None and st.bucket_figures("ddp", 2) is not None
    assert ("ddp", 2) not in st.bucket_figs  # an incomplete step's bucket figures are not kept
    v = st.version
    st.update()  # nothing new: nothing published
    assert st.version == v
    for f in late:
        st.ingest(f)
    st.update()
    assert st.complete_steps("ddp") == [0, 1, 3, 2]  # (in the order they completed)
    assert st.step_waits("ddp", 2) is not None and st.version > v
    one = st.step_figures("ddp")[-1]
    ranks = [st.rank_figures("ddp", 2, r) for r in (0, 1)]
    assert one.step == 2 and one == figures.combine(2, ranks)
    assert st.rank_figures("ddp", 2, 5) is None and st.rank_figures("ddp", 99, 0) is None


def test_eviction_keeps_every_per_step_table_within_its_bounds():
    keep = 5
    st = Store(keep_steps=keep, keep_figures=8)
    fill_store(st, SyntheticRun("small", 2, ("naive", "ddp"), seed=4), 20)
    for s in ("naive", "ddp"):
        assert list(st.raw[s]) == list(range(15, 20))
        assert list(st.waits[s]) == list(range(15, 20))
        assert list(st.step_figs[s]) == list(range(12, 20))  # keep_figures: longer than the spans
        assert [k for k, _, _ in st.step_intervals(s)] == list(range(15, 20))
    st.bucket_figures("ddp", 19)
    assert {k for _, k, _ in st.rank_figs} == set(range(15, 20))
    assert {k for _, k in st.bucket_figs} <= set(range(15, 20)) and ("ddp", 19) in st.bucket_figs
    assert st.oldest_step() == 15 and st.view("ddp", 14) is None and st.view("ddp", 15) is not None


def test_without_update_the_raw_spans_stay_bounded_anyway():
    st = Store(keep_steps=3)
    run = SyntheticRun("small", 2, ("naive",), seed=1)
    for f in run.header_frames():
        st.ingest(f)
    for k in range(20):
        for f in run.step_frames(k):
            st.ingest(f)
    assert list(st.raw["naive"]) == list(range(8, 20))  # 4 x keep_steps
    st.update()
    assert list(st.raw["naive"]) == list(range(17, 20)) and st.complete_steps("naive") == list(range(8, 20))


def test_a_step_evicted_while_its_figures_were_made_is_not_published():
    st = Store(keep_steps=2)
    run = SyntheticRun("small", 2, ("naive",), seed=1)
    for f in run.header_frames():
        st.ingest(f)
    for f in run.step_frames(0):
        st.ingest(f)
    real, started, go = figures.combine, threading.Event(), threading.Event()

    def slow(*a, **kw):
        started.set()
        go.wait(5)
        return real(*a, **kw)

    figures.combine = slow
    try:
        t = threading.Thread(target=st.update)
        t.start()
        assert started.wait(5)
        with st.lock:  # meanwhile step 0 is evicted (as ingest does when nobody updates)
            st.raw["naive"].pop(0)
        go.set()
        t.join(5)
    finally:
        figures.combine = real
    assert st.complete_steps("naive") == [] and not st.waits.get("naive")


def test_bucket_figures_match_the_spans_of_the_view():
    """The store's per-bucket figures (computed once per step from the raw batches) equal the
    time and compute overlap of each AllReduce measured on the drawn spans, mean over ranks."""
    st = Store()
    fill_store(st, SyntheticRun("xlarge", 4, ("naive", "ddp"), seed=3), 3, gpu=True)
    k = st.latest_complete("ddp")
    v = st.view("ddp", k)
    times, over = {}, {}
    for spans in v.spans.values():
        compute = figures.union([(s.start_ms, s.end_ms) for s in spans if s.kind in (FWD, BWD)])
        for s in spans:
            if s.kind == COMM:
                d = s.end_ms - s.start_ms
                times.setdefault(s.idx, []).append(d)
                over.setdefault(s.idx, []).append(100 * figures.intersection_length([(s.start_ms, s.end_ms)], compute) / d)
    got = st.bucket_figures("ddp", k)
    assert set(got) == set(times) and len(got) > 1
    for b, (t, ov) in got.items():
        assert t == pytest.approx(mean(times[b]), rel=1e-6)
        assert ov == pytest.approx(mean(over[b]), abs=1e-6)
    assert any(0 < ov < 100 for _, ov in got.values())  # some overlap, not all


def test_gpu_pct_per_strategy_from_the_samples_inside_its_complete_steps():
    """Each complete step's interval (first rank's STEP start to last rank's end, made once
    when the step completes), and the GPU % of a strategy from the sample periods that lie
    within one of its steps; a step still missing a rank has no interval yet."""
    from ddptui.ui.widgets.figures_panel import gpu_pct_by_strategy
    from ranks.frames import Spans
    from ranks.wire import STEP as STEP_KIND

    st = Store()
    frames = synthetic_frames(steps=4)
    late = [f for f in frames if type(f) is Spans and f.rank == 1 and f.strategy == "ddp" and f.step == 3]
    for f in frames:
        if f not in late:
            st.ingest(f)
    st.update()
    for s in ("naive", "ddp"):
        want = []
        for k, ranks in st.raw[s].items():
            ends = [(b.base_ns + b.t0[i] * 1000, b.base_ns + b.t1[i] * 1000)
                    for b in ranks.values() for i in range(len(b.kind)) if b.kind[i] == STEP_KIND]
            if len(ranks) == 2:
                want.append((k, min(a for a, _ in ends), max(z for _, z in ends)))
        assert st.step_intervals(s) == want and len(want) == (4 if s == "naive" else 3)
    samples = []  # (ts, util), as the sampler takes them: in time order
    for s, util in (("naive", 80), ("ddp", 20)):
        for _, a, z in st.step_intervals(s):
            samples += [(a + (z - a) // 4, util), (a + (z - a) // 2, util)]  # a period inside the step
    samples.append((max(t for t, _ in samples) + 10**9, 0))  # a period in no step
    for t, u in sorted(samples):
        st.ingest({"t": "gpu", "ts": t, "gpus": [{"index": 0, "util": u}]})
    got = gpu_pct_by_strategy(st)
    assert got == {"naive": 80, "ddp": 20}
    for f in late:  # the last rank comes: the step completes and gets its interval
        st.ingest(f)
    st.update()
    assert [k for k, _, _ in st.step_intervals("ddp")] == [0, 1, 2, 3]


def test_ddp_allreduce_bytes_follow_the_bucket_assignment_in_force():
    st = store_of(steps=6, cap_change_at=3)
    first, second = (st.bucket_assignment("ddp", k) for k in (2, 3))
    assert first != second and len(second) > len(first)
    # (each rank's lookup is kept while its assignment is in force: asked in and out of turn)
    for k, want in ((2, first), (4, second), (5, second), (2, first), (0, first)):
        f = st.comm_bytes_fn("ddp", 0, k)
        assert [f(b) for b, _, _ in want] == [nb for _, _, nb in want]
        assert st.rank_figures("ddp", k, 0).bytes == sum(nb for _, _, nb in want)
    pb = spec.grad_bytes(spec.param_table("small"))
    f = st.comm_bytes_fn("naive", 0, 2)
    assert [f(i) for i in range(len(pb))] == pb and f(len(pb)) == 0


# -- queries: in force at a step, waits, copies ----------------------------------------------------
def test_store_queries():
    assert in_force([(0, "a"), (3, "b"), (7, "c")], 5) == "b"
    assert in_force([(2, "a")], 1, "dflt") == "dflt" and in_force([(2, "a")], 1, first=True) == "a"
    for h in ([(0, "a"), (3, "b"), (7, "c")], [(2, "a")], [(2, "a"), (2, "b")]):
        for k in range(0, 10):
            i, lo, hi = in_force_span(h, k)
            assert h[i][1] == in_force(h, k, first=True) and lo <= k < hi, (h, k)
    run = SyntheticRun("small", 2, ("naive", "ddp"))
    st = Store(keep_steps=10)
    fill_store(st, run, 30)
    st.ingest({"t": "event", "r": 0, "k": 12, "what": "bucket_cap_mb", "value": 5.0})
    assert st.cap_at(11) == 25.0 and st.cap_at(12) == 5.0 and st.cap_at(29) == 5.0
    assert st.cap_changed_at(11) == 0 and st.cap_changed_at(20) == 12 and st.cap_changed_at() == 12
    assert st.oldest_step() == 20  # raw spans of the last 10 steps are kept
    assert st.last_complete("ddp") == 29 and st.last_complete("ddp", 7) == 7
    figs = st.recent_figures("naive", upto=25, n=5)
    assert [f.step for f in figs] == [21, 22, 23, 24, 25]
    assert [f.step for f in st.recent_figures("ddp", since=27)] == [27, 28, 29]
    snap = st.rank_snapshot()
    snap[0].phase = "changed"  # a copy: the store is not touched
    assert st.ranks[0].phase != "changed" and sorted(snap) == [0, 1]


def test_the_bucket_assignment_and_cap_in_force_at_each_step():
    st = store_of(steps=6, cap_change_at=3)
    history = st.bucket_history("ddp")
    assert [k for k, _ in history] == [0, 3]
    assert st.bucket_assignment("ddp") == history[-1][1]
    assert [st.bucket_assignment("ddp", k) for k in (0, 2, 3, 5)] == [history[0][1]] * 2 + [history[1][1]] * 2
    assert st.bucket_assignment("naive") is None and st.bucket_assignment("ddp", -1) == history[0][1]
    assert st.cap_history() == [(3, 1.0)] and st.cap_at(2) == 25.0 and st.cap_at(3) == 1.0
    assert st.view("ddp", 2).n_buckets == len(history[0][1]) and st.view("ddp", 4).n_buckets == len(history[1][1])
    assert st.view("ddp", 3).bucket_cap_mb == 1.0 and st.view("naive", 3).bucket_cap_mb is None
    assert st.marks("ddp", 3) == ["bucket_cap_mb → 1 MB"] and st.view("ddp", 3).marks == st.marks("ddp", 3)
    stamp = st.view_stamp("ddp")
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=6, buckets=[(0, [0], 4)]))
    assert st.view_stamp("ddp") != stamp  # a view of ddp is made again


def test_who_waited_for_whom_per_step_and_over_the_kept_steps():
    st = store_of(steps=8, keep_steps=6)
    kept = list(st.waits["ddp"])
    assert kept == list(range(2, 8)) and st.waits_kept("ddp") and not st.waits_kept("nope")
    for k in kept:
        assert st.step_waits("ddp", k) is st.waits["ddp"][k] is st.view("ddp", k).waits
    assert st.step_waits("ddp", 1) is None and st.step_waits("nope", 3) is None
    every = st.recent_waits("ddp", n=None)
    assert every == [st.waits["ddp"][k] for k in kept] and st.recent_waits("ddp", n=2) == every[-2:]
    assert st.recent_waits("ddp", upto=4) == every[:3]
    st0 = store_of(steps=3)  # step 0 (a warm-up) never counts
    assert len(st0.recent_waits("ddp", n=None)) == 2 and st0.step_waits("ddp", 0) is not None
    row = st.summary("ddp")
    assert row["stragglers"] == stragglers.summarize(every, list(st.meta.layers))


def test_step_batches_step_figures_and_ddp_reported():
    st = store_of(steps=4)
    got = st.step_batches("ddp", 2)
    assert list(got) == [0, 1] and got[1] is st.raw["ddp"][2][1]
    assert st.step_batches("ddp", 99) is None and st.step_batches("nope", 0) is None
    assert [f.step for f in st.step_figures("naive")] == [0, 1, 2, 3] and st.step_figures("nope") == []
    assert st.ddp_reported("ddp") is None and "ddp_reported" in st.summary("ddp")
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=4, buckets=[(0, [0, 1], 8)], ddp_reported=[8]))
    assert st.ddp_reported("ddp") == [8] == st.summary("ddp")["ddp_reported"]
    assert st.summary("ddp")["buckets"] == st.bucket_rows("ddp")
    assert st.bucket_rows("naive") is None and "buckets" not in st.summary("naive")


def test_queries_hand_out_copies():
    st = store_of(steps=4, cap_change_at=2)
    st.ingest(frames.Buckets(rank=0, strategy="ddp", step=3, buckets=[(0, [0, 1], 8)], ddp_reported=[8]))
    st.ingest(SyntheticRun("small", 2).gpu_frame(0))
    before = state(st)
    st.rank_snapshot()[0].phase = "x"
    st.first_rank().phase = "x"
    assert isinstance(st.first_rank(), RankInfo)
    st.span_batches()["ddp"].clear()
    st.step_batches("ddp", 1).clear()
    st.step_figures("ddp").clear()
    st.recent_figures("ddp").clear()
    st.complete_steps("ddp").clear()
    st.recent_waits("ddp", n=None).clear()
    st.strategies().clear()
    st.cap_history().clear()
    st.bucket_assignment("ddp")[0][1].clear()
    st.bucket_assignment("ddp", 0).clear()
    st.bucket_history("ddp")[0][1].clear()
    st.bucket_reporters().clear()
    st.ddp_reported("ddp").clear()
    st.marks("ddp", 2).clear()
    for got in st.samples():
        got.clear()
    st.log_lines().clear()
    st.hosts().clear()
    st.dropped_spans().clear()
    st.clock_samples(1).clear()
    assert state(st) == before
    assert list(st.step_figs["ddp"]) == [0, 1, 2, 3] and st.strategies() == ["naive", "ddp"]


def test_the_log_is_followed_by_sequence_number():
    st = Store()
    for i in range(510):
        st.add_log(f"line {i}")
    seq, lines, lost = st.log_since(0)
    assert seq == 510 and len(lines) == 500 and lost == 10 and lines[0][2] == "line 10"
    st.add_log("more", "warn")
    seq2, lines, lost = st.log_since(seq)
    assert seq2 == 511 and [t[1:] for t in lines] == [("warn", "more")] and lost == 0
    assert st.log_since(seq2) == (511, [], 0)


# -- readers go through the queries ---------------------------------------------------------------
STORE_FIELDS = ("raw", "step_figs", "rank_figs", "bucket_figs", "waits", "events", "bucket_assignments",
                "reported_sizes", "cap_changes", "slow_changes", "ranks", "gpu", "cpu", "log", "_[a-z_]+")
REACH = re.compile(r"\b(?:store|st|self\.store|self\._store|scan\.store|src\.store|run\.store|frame\.store)"
                   r"\.(?:" + "|".join(STORE_FIELDS) + r")\b")


def test_readers_outside_the_store_use_its_queries_not_its_fields():
    """summary.py, views.py and every other module of ddptui/ read a Store through its queries
    (the store's own modules aside; `meta`, `lock`, `spans`, `rejected`, `version`, `world`
    and `limits` are public)."""
    found = []
    for d, dirs, files in os.walk(os.path.join(ROOT, "ddptui")):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        if os.path.join("ddptui", "model", "store") in d:
            continue
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    if REACH.search(line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_collectives_traced_into_a_compiled_graph_are_counted_per_rank():
    """Each rank counts the functional collectives torch.compile traced into its graph (run
    untimed) as events: rank 0's count and bytes a step, and every rank that ran them, are
    what the summary says (the Inductor test's real run is one rank's: the ranks' merge here)."""
    st = Store()
    st.set_meta(synthetic_meta(strategies=("ddp",)))
    assert st.traced_collectives() is None
    for k in range(8):
        for r in (0, 1):
            st.ingest(frames.Event(rank=r, step=k, what="traced all_reduce", value=k + 1))
            st.ingest(frames.Event(rank=r, step=k, what="traced_b all_reduce", value=4 * (k + 1)))
    assert st.traced_collectives() == {"all_reduce": {"per_step": 1.0, "bytes_per_step": 4, "ranks": [0, 1]}}
    assert sum("traced into a compiled graph" in line for _, _, line in st.log_lines()) == 1
