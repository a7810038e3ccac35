"""ddptui's host cost on a GPU, held on a CPU by the CUDA cost model (tests/cuda_cost.py: each
CUDA call counted, at the first H100's measured costs, benchmarks/h100_costs.json) and the CUDA
stand-in (tests/cuda_sim.py):
the CUDA calls a step makes, the calls its resolution makes, and the period of layer marks
judged on the device's step, not the host's launch time."""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ranks.core.clocks import CudaClock
from ranks.core.recorder import Recorder
from ranks.builtin.strategies import attach_layer_hooks
from tests.cuda_cost import counted_cuda, h100
from ranks import wire
from tests.cuda_sim import SimCuda

LAYERS, BUCKETS = 8, 5  # xlarge on the first H100: 8 layers, 5 DDP buckets a step


BUCKET_AT = (7, 5, 3, 1, 0)  # the block whose weight completes each bucket, in issue order


def _xlarge_step(rec, model, x, y, k):
    """What DDPStrategy's step does: its buckets' AllReduces issued from the weights' hooks
    (DDP's reducer's, before the layer marks), with ddptui's marks around them."""
    rec.begin("ddp", k)
    loss = F.cross_entropy(model(x), y)
    rec.backward_starts()
    loss.backward()
    rec.opt_begin()
    rec.opt_end(last=True)
    rec.end()


def _bucket_hooks(rec, model):
    blocks = list(model.children())
    for b, i in enumerate(BUCKET_AT):
        def issue(p, b=b):
            cur = rec.cur
            slot = rec.comm_issue(b)
            rec.comm_done(cur, slot)  # (NCCL: the callback runs at issue, on a stream that waits)
        next(blocks[i].parameters()).register_post_accumulate_grad_hook(issue)


def _counted_run(steps: int = 6):
    cuda = counted_cuda()
    rec = Recorder(CudaClock("cuda:0", torch_cuda=cuda, host_ns=time.monotonic_ns, hook_lag_ns=3210), LAYERS,
                   every=1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(LAYERS)])
    _bucket_hooks(rec, model)  # (the reducer's hooks come before the layer marks)
    attach_layer_hooks(model, rec, "ddp")
    x, y = torch.randn(2, 8), torch.zeros(2, dtype=torch.long)
    _xlarge_step(rec, model, x, y, 0)  # (the first step: the backward's calls counted)
    for p in rec.poll(wait=True, lazy=True):
        p()
    c0 = dict(cuda.calls)
    items = []
    for k in range(1, steps + 1):
        _xlarge_step(rec, model, x, y, k)
        items += rec.poll(lazy=True)  # (the worker's poll after each step, on the training thread)
    c1 = dict(cuda.calls)
    for p in items:
        p()
    c2 = dict(cuda.calls)
    per = {k: (c1.get(k, 0) - c0.get(k, 0)) / steps for k in c1}
    resolved = {k: (c2.get(k, 0) - c1.get(k, 0)) / steps for k in c2}
    return per, resolved, len(items)


def test_a_marked_xlarge_step_makes_one_event_a_moment_and_no_stream_look_up():
    """Every layer marked, on NCCL: one event where the step and its forward start, one per
    layer boundary forward and backward, a bucket's ready moment the boundary's after the hook
    that issued it (but the last bucket's, issued in the first block's backward), its end one,
    one where the optimizer starts and one where it and the step end (26); a collective's end on
    the completion callback's stream, looked up once, not a new Python Stream each time (3 µs
    on an H100 host); polling asks the step's end and the last collective's (they end in order
    on NCCL's one stream). Before: 32 records a step, 5 stream look-ups and 6 queries."""
    per, _, steps = _counted_run()
    assert steps == 6
    assert per.get("record") == 1 + LAYERS + (LAYERS + 1) + (BUCKETS + 1) + 2 == 26
    assert per.get("current_stream", 0) == 0
    assert per.get("query", 0) == 2
    assert per.get("synchronize", 0) == 0  # nothing waits for the GPU inside a step


def test_a_buckets_ready_moment_is_the_block_boundary_after_its_hook():
    """On the CUDA stand-in (streams stamp events when they reach them): a bucket issued in
    block i's backward (i > 0) is drawn ready where block i's backward ends, the boundary the
    next mark takes; the one issued in block 0's is marked at its issue."""
    sim = SimCuda()
    rec = Recorder(CudaClock("cuda:0", torch_cuda=sim, host_ns=sim.host_ns, hook_lag_ns=0), LAYERS, every=1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(LAYERS)])
    blocks = list(model.children())
    for b, i in enumerate(BUCKET_AT):
        def issue(p, b=b):
            sim.compute(10_000)  # (the reducer's copy into the bucket: on the training stream)
            slot = rec.comm_issue(b)
            rec.comm_done(rec.cur, slot)
        next(blocks[i].parameters()).register_post_accumulate_grad_hook(issue)
    attach_layer_hooks(model, rec, "ddp")
    x, y = torch.randn(2, 8), torch.zeros(2, dtype=torch.long)
    for k in range(2):
        _xlarge_step(rec, model, x, y, k)
    (_, _, _, kinds, idxs, t0s, t1s, issues), = [p() for p in rec.poll(wait=True, lazy=True)][-1:]
    bwd_end = {i: t1 for k, i, t1 in zip(kinds, idxs, t1s) if k == wire.BWD}
    comm_ready = [iss for k, iss in zip(kinds, issues) if k == wire.COMM] if len(issues) == len(kinds) \
        else list(issues)
    for b, i in enumerate(BUCKET_AT[:-1]):
        assert comm_ready[b] == bwd_end[i], (b, i, comm_ready, bwd_end)
    assert comm_ready[-1] <= bwd_end[0]


def test_resolving_a_step_asks_each_event_its_time_once():
    """A layer's end is the next one's start (one event, two slots): its elapsed_time is asked
    once (~6 µs an H100 host, under the sender thread's GIL). 26 events a step: 25 against the
    step's start and one for the start against the calibration point. Before: 46."""
    _, resolved, _ = _counted_run()
    assert resolved.get("elapsed_time") == 26


def test_the_layer_period_is_judged_on_the_gpus_step_not_the_hosts_launch():
    """A GPU-bound xlarge step (7.7 ms on the GPU, launched by the host in a fraction of that):
    at the H100's costs (a mark 2.39 µs, a hook's dispatch 3.21 µs: 64 µs of layer marks) every
    layer of every step is marked, within 1 % of the step. Judged on the host's launch time,
    as before, it was 1 step in 2 or more."""
    sim = SimCuda(read_ns=50)
    clock = CudaClock("cuda:0", torch_cuda=sim, host_ns=sim.host_ns, hook_lag_ns=3210)
    rec = Recorder(clock, LAYERS)
    rec.switches["ddp"] = lambda on: None
    rec._mark_ns = h100()["event_record"] * 1000
    gpu_step = 7_700_000
    for k in range(24):
        rec.begin("ddp", k)
        sim.compute(gpu_step)  # the step's kernels, queued
        sim.host_work(900_000)  # the host's launches: it runs ahead
        rec.end()
        for p in rec.poll(wait=True, lazy=True):  # (the sender thread's part)
            p()
    assert abs(rec._dev_ns["ddp"] - gpu_step) < 0.05 * gpu_step  # the device's own step length
    assert rec.wanted_every("ddp") == 1
    # the host's launch time alone (the rule before) says a sample of steps
    rec._dev_ns.clear()
    assert rec.wanted_every("ddp") >= 2


def test_charge_prices_each_counted_call_at_its_measured_cost():
    """The goal's figure (P7 --device h100-model) adds `charge` to ddptui's own Python: each
    counted CUDA call at what the GPU measured it to cost, a record less this CPU's part of a
    mark; elapsed_time is the sender thread's and not charged. Doubled, halved or a call
    dropped, this fails."""
    from tests.cuda_cost import charge
    costs = h100()
    calls = {"record": 26, "query": 2, "current_stream": 1, "wait": 3, "elapsed_time": 25, "event_create": 4}
    want = 26 * costs["event_record"] + 2 * costs["event_query"] + costs["current_stream"] + 3 * costs["stream_wait"]
    assert abs(charge(calls, costs) - want) < 1e-9
    assert abs(charge(calls, costs, mark_overhead_us=1.0) - (want - 26 * 1.0)) < 1e-9
    # a record cheaper here than the whole mark is charged nothing below zero
    assert charge({"record": 5}, costs, mark_overhead_us=costs["event_record"] + 1) == 0.0
    assert charge({}, costs) == 0.0
    # the figures it charges are the ones benchmarks/h100_costs.json holds
    assert costs["comm_hook"] == 26.0 and costs["event_record"] == 2.39


def test_the_flight_recorder_path_charges_no_comm_hook_and_no_mark_a_bucket():
    """NCCL's own timing on the cost model, every step marked: no bucket hook and no mark a
    bucket (each is ready at its block's mark; the comm hook's path marks each end, and the
    ready moment of the bucket issued in the first block), nothing charged for a comm hook."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import p7_hook_cost as p7
    from ranks.core import instrument
    from ranks.builtin import strategies
    fr = p7.measure_h100_model(instrument, strategies, "xlarge", 30, path="flight-recorder")
    hook = p7.measure_h100_model(instrument, strategies, "xlarge", 30, path="comm-hook")
    assert fr["comm_hook_us"] == h100().get("seq_read", 1.0)
    assert hook["comm_hook_us"] == hook["buckets"] * h100()["comm_hook"]
    assert fr["every"] == hook["every"] == 1
    # the comm hook's path: an end mark a bucket and the first block's bucket's ready mark
    # (the others' are the block boundaries'); NCCL's own timing: the layer marks alone
    assert round(hook["calls"]["record"] - fr["calls"]["record"]) == hook["buckets"] + 1
    assert fr["bucket_hooks"] == 0
