"""The CUDA path's semantics without a GPU, on tests/cuda_sim.py (streams that stamp events when
they reach them, pool streams handed out in turn, a gloo future that completes before its
copy back lands): the calibration stream, gloo-CUDA AllReduce ends, one mark per moment, the
resolution off the training thread, and the `--slow-rank` delay sized by timing."""
from __future__ import annotations

import pytest

from ranks.instrument import CudaClock, Recorder
from ranks.strategies import Straggle, sleep_cycles_per_ms
from ranks.wire import BWD, COMM
from tests.cuda_sim import POOL, SimCuda, SimDevice


def _clock(sim, **kw):
    return CudaClock("cuda:0", torch_cuda=sim, host_ns=sim.host_ns, **kw)


def test_calibration_never_waits_behind_an_allreduce_on_a_pool_stream():
    """Every low-priority pool stream carries a 5 ms AllReduce (callbacks, backend streams):
    a calibration must neither stall the host nor stamp late."""
    sim = SimCuda()
    clock = _clock(sim)
    for st in sim.low:
        st.enqueue(5_000_000)
    h0 = sim.now
    clock.calibrate()
    assert sim.now - h0 < 50_000, f"calibration held the host {(sim.now - h0) / 1e3:.0f} µs"
    g, h, width = clock.map.points[-1]
    assert width < 5_000
    assert clock.side not in sim.low


def test_calibration_gives_up_rather_than_blocks_on_a_busy_gpu():
    sim = SimCuda()
    clock = _clock(sim)
    n = len(clock.map.points)
    for st in sim.low + sim.high:  # a GPU shared with other work: no stream is idle
        st.enqueue(50_000_000)
    h0 = sim.now
    clock.calibrate()
    assert sim.now - h0 < 3 * CudaClock.SPIN_NS + 100_000  # never waited for the 50 ms
    assert len(clock.map.points) == n  # no wide bracket taken as a point
    assert clock.next_cal > sim.now  # tried again later


def _gloo_cuda_allreduce(sim, rec, cur, slot, host_free_at: int, copy_ns: int):
    """What ProcessGroupGloo does with CUDA tensors, as it touches streams: the host reduction
    ends at host_free_at; the copy back is queued on a pool stream; the default stream is made
    to wait for it (Work::synchronize); the future completes on the gloo thread, recording its
    event on that thread's current (default) stream; a `then` callback runs at once on the next
    pool stream, made to wait for that event."""
    sim.now = max(sim.now, host_free_at)
    copy = sim.pool_stream()
    copy_end = copy.enqueue(copy_ns)
    done = sim.Event()
    done.record(copy)
    sim.default.wait_event(done)
    fut_ev = sim.Event()
    fut_ev.record(sim.default)
    cb = sim.pool_stream()
    cb.wait_event(fut_ev)
    sim.set_stream(cb)
    try:
        rec.comm_done(cur, slot)
    finally:
        sim.set_stream(None)
    return copy_end


def test_gloo_cuda_allreduce_ends_when_the_copy_back_lands_and_chains_on_the_host():
    sim = SimCuda()
    clock = _clock(sim, comm_on_host=True)
    rec = Recorder(clock, 1)
    rec.begin("interleaved", 0)
    cur = rec.cur
    s0 = rec.comm_issue(0)
    s1 = rec.comm_issue(1)
    t_ready = sim.now
    # the same gloo thread runs both: the first is done on the host 1 ms later, its copy back
    # takes 2 ms; the second is done on the host 1 ms after the first
    end0 = _gloo_cuda_allreduce(sim, rec, cur, s0, t_ready + 1_000_000, 2_000_000)
    end1 = _gloo_cuda_allreduce(sim, rec, cur, s1, t_ready + 2_000_000, 2_000_000)
    rec.end()
    sim.now += 10_000_000
    (item,) = rec.poll()
    _, _, _, kinds, idxs, t0s, t1s, _ = item
    comm = [(t0, t1) for k, t0, t1 in zip(kinds, t0s, t1s) if k == COMM]
    assert abs(comm[0][1] - end0) < 5_000, "the end is drawn before the copy back landed"
    assert abs(comm[1][1] - end1) < 5_000
    # the second started when the gloo thread was free (host), not when the first's copy landed
    assert abs(comm[1][0] - (t_ready + 1_000_000)) < 50_000


def test_each_moment_is_marked_once_and_the_last_call_still_wins():
    sim = SimCuda()
    clock = _clock(sim)
    rec = Recorder(clock, 3)
    counts = []
    for _ in range(3):
        r0, c0 = sim.records, sim.current_calls
        rec.begin("ddp", 0)
        last_call = {}
        for i in range(3):
            rec.fwd_begin(i); rec.fwd_end(i)
        for i in reversed(range(3)):
            rec.bwd_begin(i)
            for _ in range(3):  # input gradient, weight, bias
                sim.host_work(10_000)
                last_call[i] = sim.now
                rec.bwd_end(i)
        rec.opt_begin(); rec.opt_end()
        rec.end()
        counts.append((sim.records - r0, sim.current_calls - c0))
        (item,) = rec.poll()
        _, _, _, kinds, idxs, t0s, t1s, _ = item
        ends = {i: t1 for k, i, t1 in zip(kinds, idxs, t1s) if k == BWD}
        for i in range(3):
            assert abs(ends[i] - last_call[i]) < 2_000
    # step 1 learns the calls per layer (9 marks of bwd_end); later steps mark once per layer
    assert counts[0][0] - counts[1][0] == 6
    assert counts[1][0] == 1 + 6 + 3 + 3 + 2 + 1
    # the stream is looked up once per step, not once per mark
    assert counts[1][1] == 1


def test_a_layer_called_more_often_than_last_step_still_ends_at_its_last_call():
    sim = SimCuda()
    rec = Recorder(_clock(sim), 1)
    for calls in (2, 4):
        rec.begin("ddp", 0)
        rec.bwd_begin(0)
        for _ in range(calls):
            sim.host_work(10_000)
            last = sim.now
            rec.bwd_end(0)
        rec.end()
        (item,) = rec.poll()
        assert abs(item[6][-1] - last) < 2_000


def test_lazy_poll_leaves_the_resolution_to_the_caller():
    sim = SimCuda()
    rec = Recorder(_clock(sim), 2)
    rec.begin("naive", 0)
    rec.fwd_begin(0); rec.fwd_end(0)
    rec.end()
    calls = []
    real = sim.Event.elapsed_time

    def counting(self, other):
        calls.append(1)
        return real(self, other)

    sim.Event.elapsed_time = counting
    (lazy,) = rec.poll(lazy=True)
    assert callable(lazy) and not calls  # nothing resolved on the polling (training) thread
    item = lazy()
    assert calls and item[0] == "naive" and len(item[3]) == 2
    assert lazy.n_spans == len(item[3])  # what a dropped frame counts


@pytest.mark.parametrize("sm_khz", [1_200_000, 1_980_000, 900_000])
def test_slow_rank_delay_is_sized_by_timing_not_by_the_nominal_clock(sm_khz):
    """The nominal clock_rate says 1.98 GHz; the SMs run at sm_khz (a power limit): the
    injected 40 ms must take 40 ms."""
    sim = SimCuda(sm_khz=sm_khz)
    s = Straggle(SimDevice(), 40, 1, torch_cuda=sim)
    assert s.cycles_per_ms == pytest.approx(sm_khz, rel=0.01)
    t0 = sim.default.tail = sim.now
    s.delay()
    assert (sim.default.tail - t0) / 1e6 == pytest.approx(40, rel=0.01)


def test_sleep_timing_refuses_an_untimeable_sleep():
    sim = SimCuda()
    sim._sleep = lambda cycles: None  # a build whose _sleep does nothing
    with pytest.raises(RuntimeError):
        sleep_cycles_per_ms(sim, SimDevice())


def test_pool_streams_are_handed_out_in_turn():
    """The property the calibration fix rests on, kept by the stand-in: the 33rd request for
    a default-priority stream gets the first one again."""
    sim = SimCuda()
    first = sim.Stream(None)
    for _ in range(POOL - 1):
        sim.Stream(None)
    assert sim.Stream(None) is first
    assert sim.Stream(None, priority=-1) not in sim.low
