"""The rank-side instrumentation without a GPU: the GPU-timer -> host-clock mapping on a fake
GPU timer (drift, float32 `elapsed_time`), the event pool, when concurrent collectives start,
and DDP's hidden runtime-stats sync kept out of measured steps."""
from __future__ import annotations

import struct

import pytest
import torch

from ranks.core.instrument import CudaClock, GpuTimeMap, Recorder, comm_starts
from ranks.wire import BWD


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class FakeGpu:
    """A stand-in for `torch.cuda` with the timer properties that matter: the GPU's clock
    runs `drift_ppm` fast against the host's and starts at an arbitrary offset; an event is
    stamped when recorded (on an idle stream: at once); `elapsed_time` is float32 ms, as
    cudaEventElapsedTime. Host readings advance `read_ns` per call, so a calibration bracket
    is that wide."""

    def __init__(self, drift_ppm: float = 50.0, offset_ns: int = 123_456_789_000, read_ns: int = 1000):
        self.host = 10_000_000_000
        self.rate = 1 + drift_ppm * 1e-6
        self.offset = offset_ns
        self.read_ns = read_ns
        self.created = 0
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                gpu.created += 1
                self.t = None

            def record(self, stream=None):
                self.t = gpu.offset + gpu.host * gpu.rate  # GPU ns, stamped now

            def query(self):
                return True

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return f32((other.t - self.t) / 1e6)

        self.Event = Event

    def host_ns(self) -> int:
        t = self.host
        self.host += self.read_ns
        return t

    def Stream(self, device, priority=0):  # noqa: N802 - the torch.cuda name
        return object()

    def current_stream(self, device):
        return None


def test_gpu_time_map_stays_within_2us_over_8_hours_with_drift():
    gpu = FakeGpu(drift_ppm=50.0)
    clock = CudaClock("cuda:0", torch_cuda=gpu, host_ns=gpu.host_ns, calib_period_s=1.0)
    worst = 0
    hours = 8
    for second in range(hours * 3600):
        gpu.host += 1_000_000_000 - 7 * gpu.read_ns  # about a second between steps
        clock.maybe_calibrate()
        if second % 97 == 5:  # a step now and then (once the drift is known, from the
            # second calibration on): its events mapped back to host time
            ref = clock.ref()
            true0 = gpu.host
            s = clock.mark()
            gpu.host += 37_000_000 + second  # a 37 ms step, and a bit more each time
            true1 = gpu.host
            e = clock.mark()
            ns = clock.resolver(s, ref)
            worst = max(worst, abs(ns(s) - true0), abs(ns(e) - true1))
    assert worst <= 2000, f"worst mapping error {worst} ns"
    assert abs(clock.residual_ns) <= 2000
    # the drift was estimated, not assumed: 50 ppm
    assert clock.map.rate == pytest.approx(1 / 1.00005, abs=1e-7)


def test_a_calibration_never_shows_a_half_updated_fit_to_the_resolving_thread():
    """calibrate() (the training thread) updates the time map while the sender resolves steps
    with it. At every line the update runs, a reader sees the old fit or the new one, never a
    new offset with an old rate (the fit was two attributes set one after the other: off by
    the change in drift times the GPU time since the first point)."""
    import sys
    from ranks.core.instrument import GpuTimeMap
    m = GpuTimeMap()
    g = 0.0
    for i in range(8):  # a drift of 50 ppm, then the point that changes it
        g += 1e9
        m.add(g, int(g * 1.00005) + 1000, int(g * 1.00005) + 3000)
    far = 3600e9  # an hour of GPU time on
    before = m.host_ns(far)
    seen = set()

    def tracer(frame, event, arg):
        if frame.f_code.co_filename.endswith("instrument.py") and frame.f_code.co_name in ("add", "_fit"):
            if event == "line":
                seen.add(m.host_ns(far))
            return tracer
        return None

    sys.settrace(tracer)
    try:
        m.add(g + 1e9, int((g + 1e9) * 1.00010), int((g + 1e9) * 1.00010) + 2000)
    finally:
        sys.settrace(None)
    after = m.host_ns(far)
    assert before != after and seen <= {before, after}, (before, after, seen - {before, after})


def test_one_float32_anchor_would_not_do():
    """What the mapping replaces: a single anchor and one float32 elapsed_time. After an hour
    float32 ms resolution alone is 250 µs (the test above would fail with it)."""
    gpu = FakeGpu(drift_ppm=0.0)
    a, b = gpu.Event(), gpu.Event()
    a.record()
    gpu.host += 3600 * 10**9 + 123_457
    b.record()
    assert abs(a.elapsed_time(b) * 1e6 - (b.t - a.t)) > 10_000


def test_time_map_residual_reports_a_clock_jump():
    m = GpuTimeMap()
    for i in range(10):
        m.add(i * 1e9, i * 10**9, i * 10**9 + 1000)
    m.add(10e9, 10 * 10**9 + 50_000, 10 * 10**9 + 51_000)  # the host clock moved 50 µs
    assert m.residual_ns == pytest.approx(-50_000, abs=1000)


def test_event_pool_stays_flat_over_many_steps():
    """bwd_end is marked once per parameter gradient: the superseded events go back to the
    pool, so after warm-up no step allocates events."""
    gpu = FakeGpu()
    clock = CudaClock("cuda:0", torch_cuda=gpu, host_ns=gpu.host_ns)
    rec = Recorder(clock, 3)
    counts = []
    for k in range(1000):
        rec.begin("ddp", k)
        for i in range(3):
            rec.fwd_begin(i); rec.fwd_end(i)
        for i in reversed(range(3)):
            rec.bwd_begin(i)
            for _ in range(3):  # input gradient, weight, bias
                rec.bwd_end(i)
        slot = rec.comm_issue(0)
        rec.comm_done(rec.cur, slot)
        rec.opt_begin(); rec.opt_end()
        rec.end()
        out = rec.poll()
        assert len(out) == 1
        counts.append(clock.allocated)
    assert counts[-1] == counts[1], "the pool keeps allocating"
    assert counts[-1] <= 3 * 3 * 2 + 5


def test_comm_starts_threads_vs_serial():
    ready = [0, 10, 20, 30]
    end = [100, 50, 120, 140]
    # gloo: two worker threads, "a" ran #0 and #2, "b" ran #1 and #3
    assert comm_starts(ready, end, ["a", "b", "a", "b"], serial=False) == [0, 10, 100, 50]
    # NCCL: one stream, one after another
    assert comm_starts(ready, end, [None] * 4, serial=True) == [0, 50, 100, 120]


@pytest.mark.slow  # (a real DDP)
def test_ddp_runtime_stats_never_logged_inside_a_step(tmp_path):
    """DDP's forward logs runtime stats on its first 10 iterations (on CUDA: an event sync
    inside the measured step). ddptui's DDP does it only between steps, while it tracks the
    bucket assignment; after that, DDP's logging data stops moving."""
    import torch.distributed as dist

    from ranks.core.instrument import CpuClock
    from ranks.builtin.models import build_model
    from ranks.builtin.strategies import DDPStrategy

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rec = Recorder(CpuClock(), 4)  # small: fc1..fc4
        s = DDPStrategy(build_model("small"), rec, torch.device("cpu"), 0.01, 1, bucket_cap_mb=1.0)
        x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
        k = 0
        while s.track_buckets or s.ddp is None:
            s.prepare(); rec.begin("ddp", k); s.step(x, y); rec.end(); s.take_layout_change()
            k += 1
            assert k < 8
        logged = s.ddp._get_ddp_logging_data().get("iteration")
        assert logged is not None and logged > 0
        for _ in range(3):  # iterations still <= 10: DDP's own forward would log them
            s.prepare(); rec.begin("ddp", k); s.step(x, y); rec.end()
            k += 1
        assert k <= 10
        assert s.ddp._get_ddp_logging_data().get("iteration") == logged
        assert len(rec.poll()) == k
    finally:
        dist.destroy_process_group()


def test_interleaved_completion_keeps_the_tensors_for_the_optimizer_to_wait_on(tmp_path):
    """The child future of an interleaved AllReduce must carry the reduced tensors: on NCCL
    its CUDA events are what makes the optimizer's stream wait (a None value carries none,
    and the optimizer would race the kernel). CPU seam: the value is there, the span ends."""
    import torch.distributed as dist

    from ranks.core.instrument import CpuClock
    from ranks.builtin.strategies import _done

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        rec = Recorder(CpuClock(), 1)
        rec.begin("interleaved", 0)
        t = torch.ones(4)
        slot = rec.comm_issue(0)
        cur = rec.cur
        child = dist.all_reduce(t, async_op=True).get_future().then(lambda f: _done(rec, cur, slot, f))
        got = child.wait()
        assert isinstance(got, list) and got[0] is t
        assert cur.comm_end[slot] is not None and cur.comm_thr[slot] is not None
    finally:
        dist.destroy_process_group()


def test_engine_runs_a_blocks_weight_accumulation_last():
    """What attach_layer_hooks rests on: in backward, a Linear+ReLU block's bias, then its
    weight, are accumulated before the block below starts (its output's node runs)."""
    from ranks.builtin.models import build_model
    model = build_model("small")
    blocks = list(model.children())
    order = []
    for i, b in enumerate(blocks):
        w, bias = b.parameters()
        w.register_post_accumulate_grad_hook(lambda p, i=i: order.append(("w", i)))
        bias.register_post_accumulate_grad_hook(lambda p, i=i: order.append(("b", i)))
    h = torch.randn(4, 784)
    for i, b in enumerate(blocks):
        h = b(h)
        h.grad_fn.register_prehook(lambda g, i=i: order.append(("out", i)))
    torch.nn.functional.cross_entropy(h, torch.zeros(4, dtype=torch.long)).backward()
    want = [x for i in reversed(range(len(blocks))) for x in (("out", i), ("b", i), ("w", i))]
    assert order == want


def test_layer_marks_fill_every_span_once_per_moment():
    """The hooks of the built-in models: every layer's forward and backward span, forward
    spans end-to-end (one mark between two layers), backward spans likewise."""
    from ranks.core.instrument import CpuClock
    from ranks.builtin.models import build_model
    from ranks.builtin.strategies import attach_layer_hooks
    from ranks.wire import FWD
    model = build_model("small")
    rec = Recorder(CpuClock(), 4)
    attach_layer_hooks(model, rec)
    for k in range(2):
        rec.begin("single", k)
        torch.nn.functional.cross_entropy(model(torch.randn(8, 784)),
                                          torch.zeros(8, dtype=torch.long)).backward()
        rec.end()
    for _, _, _, kinds, idxs, t0s, t1s, _ in rec.poll():
        fwd = {i: (a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == FWD}
        bwd = {i: (a, b) for k, i, a, b in zip(kinds, idxs, t0s, t1s) if k == BWD}
        assert sorted(fwd) == sorted(bwd) == [0, 1, 2, 3]
        for i in range(3):
            assert fwd[i][1] == fwd[i + 1][0]  # one moment, one mark
            assert bwd[i][0] == bwd[i + 1][1]
        assert all(a <= b for a, b in [*fwd.values(), *bwd.values()])


@pytest.mark.slow  # (a real DDP)
@pytest.mark.parametrize("name", ["interleaved", "ddp"])
def test_a_strategys_work_on_a_gradient_is_in_its_layer(tmp_path, name):
    """The weight's mark ends its block's backward. Interleaved's division and AllReduce issue,
    and DDP's reducer (its copy into the bucket, then the bucket's AllReduce issue through the
    comm hook), run on the gradient after it is accumulated: that work is the block's, so the
    block ends after it, the block below starts after it. Seen here: every weight's AllReduce
    was ready (issued) before its block's backward ended."""
    import torch.distributed as dist

    from ranks.core.instrument import CpuClock
    from ranks.builtin.models import build_model
    from ranks.builtin.strategies import STRATEGY_CLASSES

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)
    try:
        rec = Recorder(CpuClock(), 4)
        kw = {"bucket_cap_mb": 1e-6} if name == "ddp" else {}  # a bucket per parameter
        s = STRATEGY_CLASSES[name](build_model("small"), rec, torch.device("cpu"), 0.01, 1, **kw)
        x, y = torch.randn(16, 784), torch.randint(0, 10, (16,))
        for k in range(3):  # DDP rebuilds its buckets after the first step
            s.prepare(); rec.begin(name, k)
            r = rec.cur
            s.step(x, y); rec.end()
        # the parameters each AllReduce carries (interleaved: one; ddp: its bucket's)
        if name == "ddp":
            carries = {b: set(ps) for b, ps, _ in s.seen}
        else:
            carries = {i: {i} for i in range(len(s.params))}
        pidx = {id(p): i for i, p in enumerate(s.params)}
        block_of = {pidx[id(p)]: j for j, b in enumerate(s.module.children()) for p in b.parameters()}
        for i in range(4):
            # every AllReduce of gradients from blocks i and above only was ready by block i's end
            for slot, idx in enumerate(r.comm_idx):
                if min(block_of[p] for p in carries[idx]) >= i:
                    assert r.comm_ready[slot] <= r.bwd_e[i], \
                        f"block {i} ended before the AllReduce of {sorted(carries[idx])} was issued"
    finally:
        dist.destroy_process_group()


def _late_rank(store_path: str, delay_s: float) -> None:
    """Rank 1 of test_naive_allreduce_ends_where_it_completes: reaches the AllReduce late."""
    import time

    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=1, world_size=2)
    time.sleep(delay_s)
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # (a second process)
def test_naive_allreduce_ends_where_it_completes_not_where_the_training_thread_wakes(tmp_path):
    """Naive's blocking AllReduce: its end is marked by the completion callback, on gloo's
    thread as soon as the collective is done, not after the training thread wakes from the
    wait (10-50 µs later on a busy host, and on CUDA an event stamped that late)."""
    import multiprocessing as mp
    import threading

    import torch.distributed as dist

    from ranks.core.instrument import CpuClock
    from ranks.builtin.strategies import Naive

    store = str(tmp_path / "store")
    other = mp.get_context("spawn").Process(target=_late_rank, args=(store, 0.3))
    other.start()
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=0, world_size=2)
        rec = Recorder(CpuClock(), 1)
        s = Naive(torch.nn.Sequential(torch.nn.Linear(4, 1, bias=False)), rec, torch.device("cpu"), 0.01, 2)
        s.params[0].grad = torch.ones(1, 4)
        rec.begin("naive", 0)
        cur = rec.cur
        s.after_backward()  # waits ~0.3 s for rank 1
        rec.end()
        assert cur.comm_end[0] is not None
        assert cur.comm_thr[0] != threading.get_ident(), "the end was marked after the wait, on the training thread"
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        other.join(30)
