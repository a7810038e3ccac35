"""`ddptui verify`: every ddptui span matched to torch.profiler's own record of the same work.

Pure functions (no torch, no processes): the rank side (ranks/builtin/profwin.py) wrote, per rank, the
events torch.profiler collected over a window of loop iterations, on the host
CLOCK_MONOTONIC axis; the app has ddptui's spans of the same steps in its Store. Here each
span is paired with profiler records STRUCTURALLY, never by looking for the nearest event in
time (a span shifted by milliseconds would still find some op near it), and never with a
range ddptui opened itself (ddptui adds none to the profile):

- steps: a measured step is ``zero_grad`` (``aten::_foreach_zero_``) ... forward ... backward
  ... optimizer (``aten::_foreach_add_``) on the training thread (PlainSGD in
  ranks/builtin/strategies.py); the gradients are zeroed before ddptui's step (Strategy.prepare), which
  starts with the forward's first ``aten::linear`` and ends with the optimizer. The i-th such pair of a rank's window is the i-th ddptui STEP span of
  that rank in time order (all strategies together); different counts leave the rank's
  spans unmatched.
- forward layer j: the j-th ``aten::linear`` of the step on the training thread, through the
  first ``aten::relu`` after it (fc1..fcN are Linear+ReLU blocks, the last has no ReLU); a
  layer after the first starts where the one before ended (ddptui marks the two with one
  timestamp: the module-call overhead between them is drawn in the later layer).
- backward layer j: the autograd engine's ``autograd::engine::evaluate_function: X`` records
  whose sequence number is that of one of layer j's forward ops (the profiler links a
  backward node to the forward op that created it by that number); ``AccumulateGrad`` nodes,
  which have none, belong to the layer of the linked node before them. A layer ends with its
  last AccumulateGrad node, hooks included: a strategy's work on the gradient (DDP's copy
  into its bucket, interleaved's division, an AllReduce's issue) is the layer's, and ddptui
  marks after it; the layer below starts at that moment (one timestamp for the two).
- allreduce: the ``gloo:all_reduce`` records (gloo worker threads, two of them) that start
  inside the step, in start order (= the order the worker threads took them off gloo's
  queue = issue order), paired with ddptui's COMM spans in issue order; the tensor size the
  profiler recorded must equal the parameter's (naive, interleaved) or the bucket's (ddp),
  else the pair counts as unmatched. The per-step control all_reduce runs before the step's
  ``zero_grad`` and is therefore never inside a step.
- optimizer: ``aten::_foreach_add_``.

On CUDA (written against PyTorch's profiler data model, tested on traces in the shape of real
GPU ones, run on the first H100 pass): the times are those of the device work: kernels (and
memcpys) linked to their launching CPU op by the profiler's correlation ids (a CUDA runtime
call among the events stands for the op it is linked to: its own id is CUPTI's). A CUDA
run's spans are GPU times mapped to the host's clock: the tolerances are widened to that
map's error bound where it is wider (`widen_for_clock`; two ranks time-sliced on one GPU). The autograd engine runs a CUDA backward on its own device thread, not the
training thread: backward nodes, and the ``c10d::allreduce_`` that DDP's and interleaved's
hooks issue from them, are looked up on every thread. Layer j's kernels are those launched by
layer j's ops above, less those launched under ``c10d::``/``nccl:``/``gloo:``/
``record_param_comms`` (a hook's AllReduce inside an AccumulateGrad node is not the layer's
compute; the hooks' other kernels, DDP's copy into its bucket, are). An NCCL AllReduce is the kernel (``ncclKernel_*`` or ``ncclDevKernel_*``) launched
inside its ``c10d::allreduce_``; with one rank NCCL launches no kernel for an in-place sum, so
communication is not checked at world size 1 (said in the notes). gloo with CUDA tensors: the
end is that of the copy back to the GPU made inside the ``gloo:all_reduce`` record.

GPU tolerances. A CUDA event is stamped when its stream reaches it: on a stream that is
waiting for the host, at once, while the kernel launched next starts 10–30 µs later. So on GPU
every start is held one way (ddptui may draw it earlier than the first kernel, not later). The
NCCL kernel's start also waits for free SMs, which no event can see: the gap between ddptui's
start and the kernel's is reported as `queued` and not held. Spans shorter than
`SHORT_SPAN_US` are counted apart: for them a 5 µs error is not a small one.
"""
from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field

from ranks.wire import BWD, COMM, FWD, KIND_NAMES, OPT, STEP

KINDS = KIND_NAMES  # forward, backward, allreduce, optimizer, step

# tolerances in µs: (start, end); None = that edge is reported but not held to a tolerance
GPU_TOL = {FWD: (5, 5), BWD: (5, 5), OPT: (5, 5), STEP: (5, 5), COMM: (5, 10)}
GPU_LATE_ONLY = frozenset({FWD, BWD, OPT, STEP, COMM})  # every start, on GPU
# gloo with CUDA tensors: the gloo thread's record starts before the copy to the host has
# landed; ddptui's start is when the GPU reached the collective: reported, not held
GLOO_CUDA_TOL = {**GPU_TOL, COMM: (None, 10)}
SHORT_SPAN_US = 20
COMM_RECORDS = ("c10d::", "nccl:", "gloo:", "record_param_comms")
# CPU: from measurement on a 2-core VM, 2 ranks on gloo (benchmarks/README.md, "Verify on CPU"). A hook reads the
# clock in Python; the profiler records the first/last op at the dispatcher: forward/backward
# differ by the module call path (p95 <= 70 µs measured), optimizer/step starts by the Python
# prologue of zero_grad / the update (median ~90 µs, p95 up to ~210 µs); an allreduce starts on
# a gloo worker thread some time after the training thread hands it over (thread wake-up on
# busy cores: median ~100 µs, p95 ~250 µs for naive, whose spans are otherwise exact).
# The allreduce START is held one way on CPU: ddptui must never draw a collective later than
# the gloo thread ran it (the error of drawing collectives one at a time), but may draw it
# earlier by the time the idle gloo thread took to wake up and get a core after the hand-over:
# ddptui takes no timestamp on that thread before the work runs (only its completion callback
# runs there), so that wait is drawn as communication. Measured on 2 busy cores: median
# ~150 µs, up to a few ms while both cores compute backward (DDP).
CPU_TOL = {FWD: (100, 100), BWD: (100, 100), OPT: (250, 250), STEP: (250, 250), COMM: (400, 400)}
LATE_ONLY_START = {COMM}  # on CPU
# a kind passes when at least this share of its spans is within tolerance: most of them, not
# all, because on a busy host the scheduler now and then takes a core away from a rank for a
# few ms between a hook's clock read and the op it times (seen: 1 to 4 ms, in a few % of the
# spans, at a load average of 2 to 4 on 2 cores). A systematic error moves most spans: a 3 ms
# shift leaves 0 % within; gloo collectives drawn one at a time leave 40 to 60 %.
PASS_PCT = 75.0

EVAL = "autograd::engine::evaluate_function: "


class VerifyError(Exception):
    """A profile that cannot be read or does not belong to this run."""


@dataclass
class ProfEvent:
    """One torch.profiler record (fields as ranks/builtin/profwin.py writes them)."""
    name: str
    tid: int
    t0: int  # ns, host monotonic axis
    t1: int
    seq: int  # autograd sequence number (-1: none)
    dev: int  # 1: device work (kernel, copy, set), 0: a CPU op or annotation
    corr: int  # correlation id: what device work names as `linked`
    linked: int  # device work: the correlation id of the CPU op that launched it
    shapes: list | None  # input shapes


@dataclass
class Profile:
    """One rank's profiled window: its records, time-ordered."""
    rank: int
    window: tuple[int, int]
    cuda: bool
    drift_ns: int
    events: list[ProfEvent]


def load_profile(path: str) -> Profile:
    try:
        with open(path) as f:
            doc = json.load(f)
        names = doc["names"]
        events = [ProfEvent(names[rec[0]], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7], rec[8])
                  for rec in doc["events"]]
        return Profile(int(doc["rank"]), tuple(doc["window"]), bool(doc.get("cuda")),
                       int(doc.get("offset_drift_ns", 0)), sorted(events, key=lambda e: (e.t0, -e.t1)))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise VerifyError(f"{path}: not a readable profile ({type(e).__name__}: {e})") from None


# -- ddptui's side ---------------------------------------------------------------------------
@dataclass
class SpanStep:
    """ddptui's spans of one (strategy, step) on one rank, absolute ns (µs resolution)."""
    strategy: str
    step: int
    t0: int
    t1: int
    fwd: dict = field(default_factory=dict)   # layer -> (t0, t1)
    bwd: dict = field(default_factory=dict)
    comm: list = field(default_factory=list)  # (idx, t0, t1, issued) in issue order
    opt: tuple | None = None


def steps_from_batches(batches) -> list[SpanStep]:
    """SpanBatch objects (one rank) -> SpanSteps in time order."""
    out = []
    for b in batches:
        base = b.base_ns
        step = None
        comm = []
        comm_i = 0
        for i, kind in enumerate(b.kind):
            t0, t1 = base + b.t0[i] * 1000, base + b.t1[i] * 1000
            if kind == STEP:
                step = SpanStep(b.strategy, b.step, t0, t1)
            elif kind == COMM:
                comm.append((b.idx[i], t0, t1, base + b.iss[comm_i] * 1000))
                comm_i += 1
        if step is None:
            continue
        for i, kind in enumerate(b.kind):
            t0, t1 = base + b.t0[i] * 1000, base + b.t1[i] * 1000
            if kind == FWD:
                step.fwd[b.idx[i]] = (t0, t1)
            elif kind == BWD:
                step.bwd[b.idx[i]] = (t0, t1)
            elif kind == OPT:
                step.opt = (t0, t1)
        step.comm = sorted(comm, key=lambda c: c[3])
        out.append(step)
    return sorted(out, key=lambda s: s.t0)


# -- the profiler's side ----------------------------------------------------------------------
@dataclass
class ProfiledStep:
    """The profiler's own record of one step (absolute ns, host monotonic axis)."""
    t0: int
    t1: int
    opt: tuple
    fwd: dict = field(default_factory=dict)   # layer -> (t0, t1)
    bwd: dict = field(default_factory=dict)
    comm: list = field(default_factory=list)  # (t0, t1, numel or None), issue order
    notes: list = field(default_factory=list)
    # each block compiled: layer -> ((start lo, hi), (end lo, hi)), the profiler's bounds of a
    # boundary it has no record of (the Python between two blocks' compiled regions); and the
    # step's start's (lo, hi). A ddptui mark inside its bounds is 0 off, else off the nearest
    fwd_within: dict = field(default_factory=dict)
    t0_within: tuple | None = None


def off(t: int, lo: int, hi: int) -> int:
    """How far t is outside [lo, hi] (negative: before it; 0: inside)."""
    return t - lo if t < lo else (t - hi if t > hi else 0)


def _device_span(cpu_ops: list[ProfEvent], by_linked: dict) -> tuple | None:
    """Earliest start and latest end of the device work (kernels, copies) that these CPU
    ops launched, linked by correlation id; None if they launched none.

    A CUDA runtime call (cudaLaunchKernel, cudaEventRecord: a host event torch.profiler puts
    on the thread of the op that made it, inside it) carries CUPTI's correlation id, a count
    of its own, and is linked to its op: it stands for that op, never for whatever op has
    its CUPTI id as its own (the first H100 pass: one step in five off by 30-125 ms)."""
    work = []
    for op in cpu_ops:
        key = _op_key(op)
        if key is not None:
            work.extend(by_linked.get(key, ()))
    if not work:
        return None
    return min(w.t0 for w in work), max(w.t1 for w in work)


_RUNTIME_CALL = re.compile(r"(cuda|cu|nvtx)[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, ...


def _op_key(op: ProfEvent) -> int | None:
    """The correlation id device work names `op` by: its own (a CPU op's), or, for a CUDA
    runtime or driver call (cudaLaunchKernel, cudaEventRecord, cuLaunchKernel), that of the op
    it is linked to; None for a call linked to none (ddptui's own event records, made by its
    hooks outside any op): its correlation id is CUPTI's, another count."""
    if op.linked > 0:
        return op.linked
    return None if _RUNTIME_CALL.match(op.name) else op.corr


def _numel(shapes) -> int | None:
    if not shapes or not isinstance(shapes[0], list):
        return None
    return math.prod(shapes[0]) if shapes[0] else None


def _is_device_work(e: ProfEvent) -> bool:
    """A kernel, memcpy or memset: not a GPU-side annotation of a CPU range."""
    return e.dev == 1 and not e.name.startswith(("nccl:", "gloo:", "ProfilerStep", "## "))


def _nested(by_tid: dict, parent: ProfEvent) -> list[ProfEvent]:
    """Events of parent's thread nested inside it (the profiler's own nesting)."""
    return [e for e in by_tid.get(parent.tid, ()) if e is not parent
            and e.t0 >= parent.t0 and e.t1 <= parent.t1]


def _compute_ops(by_tid: dict, ops: list[ProfEvent]) -> list[ProfEvent]:
    """ops less those inside a collective's records (their kernels are communication)."""
    comm = [e for o in ops if o.name.startswith(COMM_RECORDS) for e in [o, *_nested(by_tid, o)]]
    if not comm:
        return ops
    drop = {id(e) for e in comm}
    return [o for o in ops if id(o) not in drop]


# the step's first op: a block's aten::linear, or (each block compiled) Dynamo's cache lookup
# before its first compiled region
CACHE_LOOKUP = "TorchDynamo Cache Lookup"
FIRST_OPS = frozenset(("aten::linear", CACHE_LOOKUP))
COMPILED_REGION = "Torch-Compiled Region"


def profile_steps(prof: Profile, n_layers: int) -> list[ProfiledStep]:
    """The steps of one rank's profile, each with its layers, allreduces and optimizer."""
    events = prof.events
    host = [e for e in events if e.dev == 0]
    by_tid: dict = {}
    for e in host:
        by_tid.setdefault(e.tid, []).append(e)
    zeros = [e for e in host if e.name == "aten::_foreach_zero_"]
    if not zeros:
        return []
    main = zeros[0].tid
    mainev = by_tid[main]
    adds = [e for e in mainev if e.name == "aten::_foreach_add_"]
    by_linked: dict = {}
    if prof.cuda:
        for e in events:
            if _is_device_work(e) and e.linked > 0:
                by_linked.setdefault(e.linked, []).append(e)
    colls = sorted((e for e in host if e.name == "gloo:all_reduce"), key=lambda e: e.t0)
    coll_t0 = [e.t0 for e in colls]
    c10d = sorted((e for e in host if e.name == "c10d::allreduce_"), key=lambda e: e.t0)
    c10d_t0 = [e.t0 for e in c10d]
    # backward nodes run on the training thread on CPU, on the autograd engine's device
    # thread on CUDA: look for them on every thread
    evals = sorted((e for e in host if e.name.startswith(EVAL)), key=lambda e: e.t0)
    evals_t0 = [e.t0 for e in evals]
    steps = []
    for zero_i, zero in enumerate(zeros):
        next_zero = zeros[zero_i + 1].t0 if zero_i + 1 < len(zeros) else None
        add = next((a for a in adds if a.t0 >= zero.t1 and (next_zero is None or a.t1 <= next_zero)), None)
        if add is None:
            continue
        # the gradients are zeroed before the step (Strategy.prepare, outside measurement):
        # the step starts with its forward, its first aten::linear
        first = next((e for e in mainev if e.name in FIRST_OPS and e.t0 >= zero.t1
                      and e.t1 <= add.t0), None)
        t0 = first.t0 if first is not None else zero.t1
        step = ProfiledStep(t0, add.t1, (add.t0, add.t1))
        inside = [e for e in mainev if e.t0 >= t0 and e.t1 <= add.t1]
        linears = [e for e in inside if e.name == "aten::linear"]
        relus = [e for e in inside if e.name == "aten::relu"]
        regions = [e for e in inside if e.name.startswith(COMPILED_REGION)]
        seq_layer: dict[int, int] = {}
        fwd_ops: dict[int, list] = {}
        if regions and not linears:  # each block compiled (`--compile`): layer j is the j-th
            # compiled region, its backward the CompiledFunctionBackward node linked to the
            # region's CompiledFunction. Between two blocks' regions the profiler records
            # nothing of the Python that returns from one and calls the next, where ddptui's
            # one mark is: a boundary is held to that stretch, from the region before it ends
            # to Dynamo's cache lookup for the next block (after the last: the loss's first op)
            if len(regions) == n_layers:
                lookups = [e for e in inside if e.name == CACHE_LOOKUP]
                calls = [max((e.t0 for e in lookups if e.t1 <= r.t0), default=r.t0)
                         for r in regions]  # (each region's own lookup: where its call shows)
                after = next((e.t0 for e in inside if e.t0 >= regions[-1].t1), regions[-1].t1)
                for j, region in enumerate(regions):
                    ops = [e for e in inside if e.t0 >= region.t0 and e.t1 <= region.t1]
                    fwd_ops[j] = ops
                    step.fwd[j] = (region.t0, region.t1)
                    start = (zero.t1, calls[0]) if j == 0 else (regions[j - 1].t1, calls[j])
                    end = (region.t1, calls[j + 1] if j + 1 < n_layers else after)
                    step.fwd_within[j] = (start, end)
                    for e in ops:
                        if e.seq >= 0:
                            seq_layer.setdefault(e.seq, j)
                step.t0_within = step.fwd_within[0][0]
            else:
                step.notes.append(f"{len(regions)} compiled regions in the step, the model has {n_layers} layers")
        elif len(linears) == n_layers:
            for j, linear in enumerate(linears):
                end = linear.t1
                if j < n_layers - 1:
                    relu = next((x for x in relus if x.t0 >= linear.t1 and x.t1 <= linears[j + 1].t0), None)
                    if relu is None:
                        step.notes.append(f"no aten::relu after layer {j}'s aten::linear")
                        continue
                    end = relu.t1
                ops = [e for e in inside if e.t0 >= linear.t0 and e.t1 <= end]
                fwd_ops[j] = ops
                step.fwd[j] = (linear.t0, end)
                for e in ops:
                    if e.seq >= 0:
                        seq_layer.setdefault(e.seq, j)
        else:
            step.notes.append(f"{len(linears)} aten::linear in the step, the model has {n_layers} layers")
        for j in range(1, n_layers):
            if j in step.fwd and j - 1 in step.fwd:  # a layer starts when the one before ended:
                step.fwd[j] = (step.fwd[j - 1][1], step.fwd[j][1])  # one moment, one mark
        last_fwd = max((v[1] for v in step.fwd.values()), default=zero.t1)
        lo, hi = bisect_left(evals_t0, last_fwd), bisect_left(evals_t0, add.t1)
        nodes = [e for e in evals[lo:hi] if e.t1 <= add.t1]
        cur = None
        bwd_nodes: dict[int, list] = {}
        bwd_ops: dict[int, list] = {}  # the ops whose kernels are the layer's compute (CUDA)
        for e in nodes:
            acc = "AccumulateGrad" in e.name
            if acc:
                layer = cur
            else:
                layer = cur = seq_layer.get(e.seq)
            if layer is None:
                continue
            bwd_nodes.setdefault(layer, []).append(e)
            kids = _nested(by_tid, e)
            # an AccumulateGrad node's hooks too (DDP's copy into its bucket, interleaved's
            # division): the layer's work on its gradient, less the collectives they issue
            bwd_ops.setdefault(layer, []).extend(_compute_ops(by_tid, [e, *kids]))
        for j, layer_nodes in bwd_nodes.items():
            # a block's backward ends with its (last) parameter's AccumulateGrad node, hooks
            # included: ddptui marks after them (ranks/builtin/strategies.attach_layer_hooks)
            end = max(e.t1 for e in layer_nodes)
            step.bwd[j] = (min(e.t0 for e in layer_nodes), end)
        for j in sorted(step.bwd):
            if j + 1 in step.bwd:  # the block below starts when this one has ended: one moment
                step.bwd[j] = (step.bwd[j + 1][1], step.bwd[j][1])
        lo, hi = bisect_left(coll_t0, zero.t0), bisect_left(coll_t0, add.t1)
        step.comm = [(c.t0, c.t1, _numel(c.shapes)) for c in colls[lo:hi]]
        if prof.cuda:
            c10d_lo, c10d_hi = bisect_left(c10d_t0, zero.t0), bisect_left(c10d_t0, add.t1)
            _device_times(step, by_tid, inside, fwd_ops, bwd_ops, colls[lo:hi], c10d[c10d_lo:c10d_hi],
                          add, by_linked)
        steps.append(step)
    return steps


def _device_times(step: ProfiledStep, by_tid, inside, fwd_ops, bwd_ops, colls, c10d, add,
                  by_linked) -> None:
    """CUDA: replace host times by the times of the device work each part launched."""
    span = _device_span(_compute_ops(by_tid, inside), by_linked)
    if span is not None:
        step.t0, step.t1 = span
    for j, ops in fwd_ops.items():
        span = _device_span(ops, by_linked)
        if span is not None:
            step.fwd[j] = span
    for j, ops in bwd_ops.items():
        span = _device_span(ops, by_linked)
        if span is not None:
            step.bwd[j] = span
    span = _device_span([add, *_nested(by_tid, add)], by_linked)
    if span is not None:
        step.opt = span
    comm = []
    for c in c10d:  # NCCL: the kernel launched inside each c10d::allreduce_, issue order
        span = _device_span([c, *_nested(by_tid, c)], by_linked)
        if span is not None and not colls:
            comm.append((span[0], span[1], _numel(c.shapes)))
    if comm:
        step.comm = comm
        return
    gloo = []
    for c in colls:  # gloo with CUDA tensors: the copy back made inside the gloo record
        span = _device_span([c, *_nested(by_tid, c)], by_linked)
        gloo.append((c.t0, span[1] if span else c.t1, _numel(c.shapes)))
    step.comm = gloo


# -- pairing -----------------------------------------------------------------------------------
@dataclass
class SpanPair:
    """One ddptui span and the profiler's record of the same work (deltas: ddptui minus profiler)."""
    strategy: str
    kind: int
    start_delta: int | None  # ddptui - profiler, ns; None: unmatched
    end_delta: int | None
    dur: int | None = None  # the profiler's span, ns


def match_rank(span_steps: list[SpanStep], profiled_steps: list[ProfiledStep], comm_bytes, elem_size: int = 4,
               n_layers: int | None = None, check_comm: bool = True) -> tuple[list[SpanPair], list[str]]:
    """Pair one rank's ddptui steps with its profiler steps; comm_bytes(strategy, step, idx)
    gives the bytes ddptui says an allreduce carried. `check_comm` False (NCCL at world size
    1: no kernel to compare with) leaves AllReduces out."""
    pairs: list[SpanPair] = []
    notes: list[str] = []

    def miss(strategy, kind, n=1):
        pairs.extend(SpanPair(strategy, kind, None, None) for _ in range(n))

    if len(span_steps) != len(profiled_steps):
        notes.append(f"{len(span_steps)} ddptui steps but {len(profiled_steps)} profiled steps: "
                     f"steps cannot be paired")
        for ours in span_steps:
            miss(ours.strategy, STEP)
            miss(ours.strategy, FWD, len(ours.fwd))
            miss(ours.strategy, BWD, len(ours.bwd))
            miss(ours.strategy, COMM, len(ours.comm) if check_comm else 0)
            if ours.opt:
                miss(ours.strategy, OPT)
        return pairs, notes
    for ours, theirs in zip(span_steps, profiled_steps):
        s = ours.strategy
        notes.extend(f"{s} step {ours.step}: {n}" for n in theirs.notes)
        d0 = ours.t0 - theirs.t0 if theirs.t0_within is None else off(ours.t0, *theirs.t0_within)
        pairs.append(SpanPair(s, STEP, d0, ours.t1 - theirs.t1, theirs.t1 - theirs.t0))
        if ours.opt:
            pairs.append(SpanPair(s, OPT, ours.opt[0] - theirs.opt[0], ours.opt[1] - theirs.opt[1],
                                  theirs.opt[1] - theirs.opt[0]))
        for kind, ours_of, theirs_of in ((FWD, ours.fwd, theirs.fwd), (BWD, ours.bwd, theirs.bwd)):
            for j, (t0, t1) in sorted(ours_of.items()):
                got = theirs_of.get(j)
                within = theirs.fwd_within.get(j) if kind == FWD else None
                if got is None:
                    miss(s, kind)
                elif within is not None:
                    pairs.append(SpanPair(s, kind, off(t0, *within[0]), off(t1, *within[1]), got[1] - got[0]))
                else:
                    pairs.append(SpanPair(s, kind, t0 - got[0], t1 - got[1], got[1] - got[0]))
        if not check_comm:
            continue
        their_comm = list(theirs.comm)
        for i, (idx, t0, t1, _iss) in enumerate(ours.comm):
            want = comm_bytes(s, ours.step, idx)
            if i < len(their_comm) and i + 1 < len(their_comm) and their_comm[i][2] is not None and want \
                    and their_comm[i][2] * elem_size != want and their_comm[i + 1][2] * elem_size == want:
                # two works taken off gloo's queue by its two threads at the same moment:
                # the profiler's start order may swap them; the size says which is which
                their_comm[i], their_comm[i + 1] = their_comm[i + 1], their_comm[i]
            if i >= len(their_comm):
                miss(s, COMM)
                continue
            their_t0, their_t1, numel = their_comm[i]
            if numel is not None and want and numel * elem_size != want:
                notes.append(f"{s} step {ours.step}: allreduce #{i} carried {numel * elem_size} B "
                             f"in the profile, ddptui says {want} B")
                miss(s, COMM)
                continue
            pairs.append(SpanPair(s, COMM, t0 - their_t0, t1 - their_t1, their_t1 - their_t0))
        if len(their_comm) > len(ours.comm):
            notes.append(f"{s} step {ours.step}: {len(their_comm) - len(ours.comm)} profiled allreduce(s) "
                         f"without a ddptui span")
    return pairs, notes


def tolerances(cuda: bool, backend: str) -> tuple[dict, frozenset]:
    """(tolerances, kinds whose start is held only when late) for a run's device and backend."""
    if not cuda:
        return CPU_TOL, LATE_ONLY_START
    return (GLOO_CUDA_TOL if backend == "gloo" else GPU_TOL), GPU_LATE_ONLY


def widen_for_clock(tol: dict, bound_ns: int | None) -> tuple[dict, int | None]:
    """A CUDA run's tolerances against the GPU timer's map to host time: every ddptui span
    on CUDA is an event's GPU time mapped through it, and is no closer to the truth than the
    map's error bound (CudaClock.bound_ns: half its calibration's bracket and 1 µs), the same
    for a span's start and end. Where that bound is wider than a tolerance, the tolerance is
    widened to it, and said (returns the tolerances and the width in µs, None if none was
    widened): a GPU time-sliced with another process's context, e.g. two ranks on one GPU,
    may leave no bracket narrow enough for 5 µs."""
    if bound_ns is None:
        return tol, None
    us = math.ceil(bound_ns / 1000)
    if not any(t is not None and t < us for edge in tol.values() for t in edge):
        return tol, None
    return ({k: tuple(None if t is None else max(t, us) for t in edge) for k, edge in tol.items()}, us)


def _percentile(vals: list[float], q: float) -> float:
    if not vals:
        return float("nan")
    v = sorted(vals)
    i = min(len(v) - 1, max(0, math.ceil(q / 100 * len(v)) - 1))
    return v[i]


def summarize(pairs: list[SpanPair], tol: dict, strategies: list[str], late_only=frozenset()) -> list[dict]:
    """One row per (strategy, kind) that has spans. `late_only`: kinds whose start is held
    to the tolerance only when ddptui's start is later than the profiler's."""
    rows = []
    for s in strategies:
        for kind in (FWD, BWD, COMM, OPT, STEP):
            of_kind = [p for p in pairs if p.strategy == s and p.kind == kind]
            if not of_kind:
                continue
            matched = [p for p in of_kind if p.start_delta is not None]
            tol_start, tol_end = tol[kind]
            start_errs = [abs(p.start_delta) / 1000 for p in matched]
            end_errs = [abs(p.end_delta) / 1000 for p in matched]
            # the start error held to the tolerance (only lateness for late_only kinds)
            held_starts = [max(0, p.start_delta) / 1000 if kind in late_only else abs(p.start_delta) / 1000
                           for p in matched]
            # the error a span is judged by: its worse edge among those held to a tolerance
            err = [max(a if tol_start is not None else 0.0, b if tol_end is not None else 0.0)
                   for a, b in zip(held_starts, end_errs)]
            ok = sum(1 for a, b in zip(held_starts, end_errs)
                     if (tol_start is None or a <= tol_start) and (tol_end is None or b <= tol_end))
            within = 100.0 * ok / len(of_kind)
            short = sum(1 for p in matched if p.dur is not None and p.dur < SHORT_SPAN_US * 1000)
            # the profiled start minus ddptui's, where ddptui's is earlier: on GPU, for an
            # NCCL AllReduce, the wait of the ready collective for its stream and for SMs
            queued = [max(0, -p.start_delta) / 1000 for p in matched]
            rows.append({
                "strategy": s, "kind": KINDS[kind], "n": len(matched), "unmatched": len(of_kind) - len(matched),
                "short": short, "median_early_start_us": _round1(_percentile(queued, 50)),
                "median_abs_err_us": _round1(_percentile(err, 50)), "p95_abs_err_us": _round1(_percentile(err, 95)),
                "within_tol_pct": round(within, 1),
                "tol_us": tol_end if tol_end is not None else tol_start,
                "tol_start_us": tol_start, "tol_end_us": tol_end,
                "median_start_us": _round1(_percentile(start_errs, 50)),
                "p95_start_us": _round1(_percentile(start_errs, 95)),
                "median_end_us": _round1(_percentile(end_errs, 50)),
                "p95_end_us": _round1(_percentile(end_errs, 95)),
                "start_late_only": kind in late_only,
                "ok": len(matched) > 0 and len(matched) == len(of_kind) and within >= PASS_PCT,
            })
    return rows


def _round1(x: float) -> float | None:
    return None if x != x else round(x, 1)


def format_table(rows: list[dict], title: str) -> str:
    head = ("strategy", "kind", "matched", "unmatched", "|Δstart| med", "p95", "|Δend| med", "p95",
            "tol µs", "within", "", "early med", f"<{SHORT_SPAN_US} µs")
    lines = [title, "early: how much earlier than the profiled start ddptui's start is (on GPU, an "
             "NCCL AllReduce's wait for its stream and SMs); <20 µs: spans too short for a 5 µs "
             "tolerance to be small", ""]
    body = []
    for r in rows:
        tol_start, tol_end = r["tol_start_us"], r["tol_end_us"]
        tol = (f"{'+' if r.get('start_late_only') else ''}{tol_start if tol_start is not None else '-'}"
               f"/{tol_end if tol_end is not None else '-'}")
        body.append((r["strategy"], r["kind"], str(r["n"]), str(r["unmatched"]),
                     _cell(r["median_start_us"]), _cell(r["p95_start_us"]),
                     _cell(r["median_end_us"]), _cell(r["p95_end_us"]), tol,
                     f"{r['within_tol_pct']:.0f} %", "ok" if r["ok"] else "FAIL",
                     _cell(r.get("median_early_start_us")), str(r.get("short", 0))))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i])  # noqa: E731
                                  for i, c in enumerate(cells)).rstrip()
    lines.append(fmt(head))
    lines.extend(fmt(b) for b in body)
    return "\n".join(lines)


def _cell(x) -> str:
    return "-" if x is None else f"{x:.1f}"


# -- Kineto traces -----------------------------------------------------------------------------
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def profile_from_kineto(doc: dict, window: tuple[int, int] = (0, 0), offset_ns: int = 0) -> Profile:
    """A torch.profiler (Kineto) JSON trace of one rank as the profile `--profile-steps` writes:
    CPU ops with their thread, sequence number, input shapes and correlation id (Kineto's
    "External id"); kernels, copies and sets linked to the CPU op that launched them by their
    "External id". Times: Kineto's µs minus `offset_ns`, in ns."""
    try:
        rank = int((doc.get("distributedInfo") or {}).get("rank", 0))
        events = []
        cuda = False
        for e in doc["traceEvents"]:
            if e.get("ph") != "X":
                continue
            cat = e.get("cat", "")
            args = e.get("args") or {}
            t0 = int(round(float(e["ts"]) * 1000)) - offset_ns
            t1 = t0 + int(round(float(e.get("dur", 0)) * 1000))
            ext = int(args.get("External id", 0) or 0)
            if cat in ("cpu_op", "user_annotation"):
                dims = args.get("Input Dims")
                events.append(ProfEvent(e["name"], int(e.get("tid", 0)), t0, t1,
                                        int(args.get("Sequence number", -1)), 0, ext, 0,
                                        dims if isinstance(dims, list) else None))
            elif cat in _DEVICE_CATS:
                cuda = True
                events.append(ProfEvent(e["name"], int(e.get("tid", 0)), t0, t1, -1, 1,
                                        int(args.get("correlation", 0) or 0), ext, None))
        return Profile(rank, tuple(window), cuda, 0, sorted(events, key=lambda e: (e.t0, -e.t1)))
    except (KeyError, TypeError, ValueError) as e:
        raise VerifyError(f"not a Kineto trace ({type(e).__name__}: {e})") from None
