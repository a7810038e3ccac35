"""The five training modes of the seeds, each instrumented through the same Recorder.

naive        full backward, then a blocking all_reduce per parameter (not from hooks)
interleaved  async all_reduce per parameter from post-accumulate-grad hooks, all waited
             on before the optimizer step
ddp          DistributedDataParallel, bucketed; on NCCL with PyTorch's own timing on (the
             launcher's TORCH_NCCL_ENABLE_TIMING and Flight Recorder buffer) DDP keeps its C++
             AllReduce and each bucket is timed from the Flight Recorder (`comm_timing`
             "flight-recorder"); elsewhere a comm hook times each bucket ("comm-hook")
single       one device, whole batch, no communication (runs on rank 0 only)
fsdp         FSDP2 (fully_shard per block): all-gathers before each block's forward and
             backward, reduce-scatters after its backward, timed by the collective tap
"""
from __future__ import annotations

import copy
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ranks.core import flightrec
from ranks import seams, spec, wire
from ranks.core.recorder import Recorder

def comm_timing_for(device) -> tuple[str, str | None]:
    """("flight-recorder", None) where DDP's buckets can be timed by PyTorch itself (CUDA,
    NCCL, timing and a Flight Recorder buffer on), else ("comm-hook", why not).
    DDPTUI_COMM_TIMING=comm-hook|flight-recorder asks for one (the A/B of benchmarks)."""
    want = os.environ.get("DDPTUI_COMM_TIMING", "auto")
    if want == "comm-hook":
        return "comm-hook", "DDPTUI_COMM_TIMING=comm-hook"
    if device.type != "cuda":
        if seams.fr_standin() is not None and flightrec.buffer_size() > 0:
            return "flight-recorder", None  # (gloo's Flight Recorder standing in for NCCL's)
        return "comm-hook", "not CUDA"
    try:
        backend = dist.get_backend()
    except Exception:  # noqa: BLE001
        backend = None
    if backend != "nccl":
        return "comm-hook", f"backend {backend}"
    why = flightrec.why_not_nccl_timing()
    return ("comm-hook", why) if why else ("flight-recorder", None)


class BucketReady:
    """Each DDP bucket's ready moment without a comm hook, where the layers are not marked on
    every step (sampled: a step may have no block boundaries to read it from): a post hook on
    the AccumulateGrad node of the bucket's last parameter (the last whose gradient arrives:
    DDP's rebuilt buckets hold them in arrival order), registered after DDP's reducer's own
    hook on that node, so it runs once the reducer has handed the bucket's AllReduce to NCCL.
    One hook and one mark a bucket (`Recorder.comm_issue_fr`); re-registered when DDP rebuilds
    its buckets. While every step's layers are marked (`active` false) no hook at all: each
    bucket is ready at the backward end of its last gradient's block (`Recorder.comm_seal`'s
    `ready_at`), a mark the step makes anyway."""

    __slots__ = ("rec", "group", "handles", "keys", "buckets", "active")

    def __init__(self, rec: Recorder, group: str, active: bool = True):
        self.rec, self.group = rec, group
        self.handles: list = []
        self.keys: list = []
        self.buckets: list = []
        self.active = active

    def set(self, buckets: list) -> None:
        """buckets: [(bucket index, last parameter)] of the layout in force."""
        keys = [(b, id(p)) for b, p in buckets]
        if keys == self.keys:
            return
        self.clear()
        self.keys, self.buckets = keys, list(buckets)
        if self.active:
            self._register()

    def enable(self, active: bool) -> None:
        """The hooks on (active) or off (every step marked: ready moments from the marks)."""
        if active == self.active:
            return
        self.active = active
        for h in self.handles:
            h.remove()
        self.handles = []
        if active:
            self._register()

    def _register(self) -> None:
        rec, group = self.rec, self.group
        for b, p in self.buckets:
            node = p.view_as(p).grad_fn.next_functions[0][0]  # (as DDP's reducer finds it)

            def ready(gi, go, b=b):
                if rec.cur is not None:
                    rec.comm_issue_fr(b, group)
            self.handles.append(node.register_hook(ready))

    def clear(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.keys, self.buckets = [], [], []


class LayerMarks:
    """The weights' backward marks of one model (attach_layer_hooks).

    Registered once (`on`): a post-accumulate hook on each weight (or, once moved, a post
    hook of its AccumulateGrad node after DDP's reducer's: `move_after`) — the cheapest for
    a model whose every step is marked. A hook once registered on a tensor or a node is called
    by PyTorch for every accumulation even after it is removed (an empty dict, ~0.5 µs a
    layer), so where layers are marked on a sample of steps (Recorder.begin, short steps) the
    hooks are not registered at all: a marked step then marks each block's backward end with a
    pre-hook on the node of the block's output, registered in its forward (the same moment:
    the engine runs that node right after the block above's weight is accumulated and its
    post hooks have run; ~4 µs a layer, on the marked steps only). The first block's mark (the
    backward's end) is registered once in both ways. `set(on)` switches (Recorder.begin: on
    while every step is marked and the steps are timed)."""

    __slots__ = ("entries", "handles", "nodes", "on")

    def __init__(self, on: bool = True):
        self.entries: list = []  # (weight, mark) per block, in block order
        self.handles: list = []  # each block's hook handle (None: not registered)
        self.nodes: list | None = None  # each weight's AccumulateGrad node, once moved
        self.on = on

    def _register(self, i: int):
        weight, done = self.entries[i]
        if self.nodes is None:
            return weight.register_post_accumulate_grad_hook(done)
        return self.nodes[i].register_hook(done)  # (done(grad_inputs, grad_outputs): one frame)

    def add(self, weight, done) -> None:
        i = len(self.entries)
        self.entries.append((weight, done))
        self.handles.append(None)
        if i == 0 or self.on:
            self.handles[i] = self._register(i)

    def retarget(self, i: int, param) -> None:
        """Block i's mark moved to `param`'s accumulation: the block's last gradient to arrive
        where that is not its weight's (each block compiled: the engine accumulates the
        gradients a compiled backward node gives in its own order; Strategy.warm_up finds it)."""
        weight, done = self.entries[i]
        if param is weight:
            return
        h = self.handles[i]
        if h is not None:
            h.remove()
        self.entries[i] = (param, done)
        if self.nodes is not None:
            self.nodes[i] = param.view_as(param).grad_fn.next_functions[0][0]
        self.handles[i] = self._register(i) if h is not None else None

    def set(self, on: bool) -> None:
        """Every block's mark registered once (on), or the first block's alone (off)."""
        if on == self.on:
            return
        self.on = on
        for i in range(1, len(self.entries)):
            if on:
                self.handles[i] = self._register(i)
            else:
                h, self.handles[i] = self.handles[i], None
                if h is not None:
                    h.remove()

    def release_nodes(self) -> None:
        """Remove the node hooks and let go of the nodes (before a re-wrap: `move_after`)."""
        for i, h in enumerate(self.handles):
            if h is not None:
                h.remove()
            self.handles[i] = None
        self.nodes = None

    def move_after(self) -> None:
        """Move each weight's mark to a post hook of its AccumulateGrad node registered now: it
        runs after the node's post hooks registered before it (DDP's reducer copies the
        gradient into its bucket there, and may issue the bucket's AllReduce), where a
        post-accumulate hook runs inside the node, before them. Called again for a re-wrapped
        DDP (a new reducer, whose hooks come after those)."""
        self.release_nodes()
        self.nodes = [w.view_as(w).grad_fn.next_functions[0][0] for w, _ in self.entries]  # as DDP's reducer finds it
        self.handles = [self._register(i) if (i == 0 or self.on) else None
                        for i in range(len(self.entries))]


def attach_layer_hooks(model: nn.Sequential, rec: Recorder, strategy: str | None = None) -> LayerMarks:
    """Forward/backward start and end for every block fcN of the model, one mark per moment
    and, but for one, hooks registered once rather than every step.

    Forward: the model's forward is the loop over its blocks (as nn.Sequential's), marking
    between blocks: block i's end is block i+1's start (`Recorder.fwd_between`). No module
    hooks: a module with hooks takes the slow call path every step.
    Backward: a block (Linear, then ReLU) is done when its weight gradient is accumulated, and
    the next block down starts then (`Recorder.bwd_between`): the engine's ready queue takes an
    AccumulateGrad first (the largest sequence number; engine.cpp, CompareNodeTaskTime), so
    after AddmmBackward it runs the bias's AccumulateGrad, then TBackward (the transposed
    weight's node, made after the ReLU below in forward), then the weight's AccumulateGrad,
    and only then the next block's first node (tests/test_instrument.py checks this order).
    A post-accumulate-grad hook on each weight, registered once, marks it. The last block's
    start (the loss's gradient) is a pre-hook on its output's node, the one hook registered
    each step. An injected delay of block i (`--slow-rank`) runs right after the mark that
    starts block i: inside it.
    A strategy's own work on a gradient once it is accumulated (interleaved's division and
    AllReduce issue, DDP's copy into its bucket) belongs to the block: such hooks are
    registered before these (Strategy.own_hooks), and DDP's, a post hook of the accumulation's
    node that runs after every post-accumulate hook, moves the mark after it
    (`LayerMarks.move_after`).
    Layer marks on a sample of steps (`strategy` names the steps whose marks Recorder.begin
    switches; LayerMarks): a step whose layers are not marked (`StepRecord.layers` false)
    marks the forward's start and end, the backward's start (Recorder.backward_starts, right
    before the step calls backward(): no hook) and end (the first block's weight's hook); a
    marked step marks its blocks' backward ends with pre-hooks registered in its forward.
    Returns the weights' marks."""
    blocks = list(model.children())
    last = len(blocks) - 1

    def delay(i: int) -> None:
        s = rec.straggle
        if s is not None and s.layer == i:
            s.delay()

    def start_last(grad_outputs):
        rec.bwd_begin(last)
        c = rec.cur
        if c is not None:
            c.bwd_at = last
        delay(last)

    def forward(x):
        # Recorder.fwd_between inlined: a method call per layer is a good part of the cost
        c = rec.cur
        if c is None:
            for block in blocks:
                x = block(x)
            return x
        mark = rec.clock.mark
        fs, fe = c.fwd_s, c.fwd_e
        # the step starts where its forward does, as the profiler sees it (its first
        # aten::linear; the strategies zero their gradients before the step: Strategy.prepare),
        # one event for both, marked here (Recorder.late_start: begin marks nothing): what
        # runs before the model's forward is not the step's: the strategy's own Python (~0.1
        # ms on a CPU host, before the first layer's start moved with it), DDP's preparation
        # and buffers' broadcast (~0.3 ms)
        if c.fwd_first and c.step_start is None:  # (marked here, once)
            c.step_start = fs[0] = mark()
        else:
            fs[0] = c.step_start if c.fwd_first else mark()
        c.fwd_first = False
        if c.layers:
            # the backward marks: registered once, or (a sampled model) for this step only
            this_step = not marks.on
            for i, block in enumerate(blocks):
                x = block(x)
                fe[i] = t = mark()
                if i < last:
                    fs[i + 1] = t
                    if this_step and x.grad_fn is not None:
                        x.grad_fn.register_prehook(dones[i + 1])
        else:  # the forward as one: its start and end (the backward's: Recorder.backward_starts,
            # called by the step right before backward(), and the first block's weight's hook)
            for block in blocks:
                x = block(x)
            fe[-1] = mark()  # (the step's one slot: StepRecord)
            return x
        gf = x.grad_fn
        if gf is not None:
            gf.register_prehook(start_last)
        return x

    model.forward = forward
    host, recycle = rec.host_ns, rec._recycle
    if strategy is not None:  # the step starts at the model's forward (see forward())
        rec.late_start.add(strategy)
    marks = LayerMarks(on=strategy is None)  # (switched: off until the steps are timed)
    dones = []
    for i, block in enumerate(blocks):
        weight = next(block.parameters())
        if i > 0:
            def done(*_, i=i):  # Recorder.bwd_between(i - 1), inlined (called with the weight,
                # the gradients of block i - 1's output (a pre-hook), or a node's gradients (a
                # post hook): whichever, None is returned)
                c = rec.cur
                if c is not None:
                    c.bwd_h[i] = host()  # (CUDA: is the stream idle at the mark? idle_end)
                    c.bwd_s[i - 1] = c.bwd_e[i] = t = rec.clock.mark()
                    c.bwd_at = i - 1
                    d = c.defer
                    if d is not None:  # (collectives issued since the last boundary: ready here)
                        ready = c.comm_ready
                        for j in d:
                            ready[j] = t
                        c.defer = None
                    s = rec.straggle
                    if s is not None and s.layer == i - 1:
                        s.delay()
        else:
            def done(*_):
                c = rec.cur
                if c is None:
                    return
                if c.layers:
                    rec.bwd_end(0)
                else:  # (the backward's end, once a step: Recorder.bwd_end's mark, inlined)
                    c.bwd_h[0] = host()
                    old, c.bwd_e[0] = c.bwd_e[0], rec.clock.mark()
                    if old is not None and recycle is not None:
                        recycle(old)
        marks.add(weight, done)
        dones.append(done)
    if strategy is not None:
        rec.switches[strategy] = marks.set
    return marks


def sleep_cycles_per_ms(tc, device, trials: int = 5, cycles: int = 2_000_000) -> int:
    """How many cycles of `torch.cuda._sleep` take a millisecond on this GPU now, timed with
    CUDA events (median of a few trials, after a warm-up). The device's `clock_rate` is its
    maximum clock: under a power or thermal limit the SMs run slower (a delay sized from it
    runs long), and builds without the attribute would have to guess. `tc` is torch.cuda (a
    stand-in in tests)."""
    stream = tc.current_stream(device)
    tc._sleep(cycles // 10)  # warm-up: clocks ramp up from idle
    got = []
    for _ in range(trials):
        a, b = tc.Event(enable_timing=True), tc.Event(enable_timing=True)
        a.record(stream)
        tc._sleep(cycles)
        b.record(stream)
        b.synchronize()
        ms = a.elapsed_time(b)
        if ms > 0:
            got.append(cycles / ms)
    if not got:
        raise RuntimeError("torch.cuda._sleep could not be timed")
    got.sort()
    return int(got[len(got) // 2])


class Straggle:
    """A straggler on demand: this rank's backward of one layer takes `ms` longer, every step.
    On GPU it is device work on the training stream (torch.cuda._sleep: the GPU timeline shows
    the layer's kernels later), sized by timing `_sleep` against CUDA events once, at start
    (`sleep_cycles_per_ms`); on CPU a busy wait (the core is taken, as by slow compute)."""

    def __init__(self, device, ms: float = 0.0, layer: int = -1, torch_cuda=None):
        self.device = device
        self.ms, self.layer = 0.0, -1
        self.cycles_per_ms = 0
        self.tc = torch_cuda or (torch.cuda if device.type == "cuda" else None)
        if device.type == "cuda":
            self.cycles_per_ms = sleep_cycles_per_ms(self.tc, device)
        self.set(ms, layer)

    def set(self, ms: float, layer: int) -> None:
        self.ms = float(ms) if ms > 0 else 0.0
        self.layer = layer if self.ms > 0 else -1

    def delay(self) -> None:
        if self.cycles_per_ms:
            self.tc._sleep(int(self.ms * self.cycles_per_ms))
            return
        end = time.perf_counter_ns() + int(self.ms * 1e6)
        while time.perf_counter_ns() < end:
            pass


class PlainSGD:
    """SGD with the defaults the seeds use (no momentum, no weight decay): p -= lr * grad,
    as torch.optim.SGD's foreach path does it. torch.optim imports torch._dynamo on first
    use, ~1.7 s of CPU per rank at start-up, for nothing this update needs."""

    def __init__(self, params, lr: float):
        self.params = list(params)
        self.lr = lr

    def zero_grad(self, set_to_none: bool = False) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    @torch.no_grad()
    def step(self, begin=None) -> None:
        """`begin`: called right before the update's one op (the optimizer's start mark: what
        comes before it is Python, ~0.1-0.2 ms on a slow CPU host, not the profiler's optimizer)."""
        ps = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in ps]
        if begin is not None:
            begin()
        if ps:
            torch._foreach_add_(ps, grads, alpha=-self.lr)


class Strategy:
    name = "?"
    communicates = True

    # torch.compile's backend for each block (`--compile`), or None: eager. A block compiled
    # alone, as torchtitan compiles its blocks: the marks between blocks stay outside the
    # compiled code (no graph break), its backward is one compiled node per block
    compile_backend: str | None = None

    def __init__(self, base: nn.Module, rec: Recorder, device, lr: float, world: int):
        self.module = copy.deepcopy(base).to(device)
        if self.compile_backend:
            for name, block in list(self.module.named_children()):
                setattr(self.module, name, torch.compile(block, backend=self.compile_backend))
        self.rec = rec
        self.world = world
        self.device = device
        self.params = list(self.module.parameters())
        self.own_hooks()  # before the layer marks: their work on a gradient is the layer's
        self.marks = attach_layer_hooks(self.module, rec, self.name)
        self.opt = PlainSGD(self.params, lr=lr)

    def own_hooks(self) -> None:
        """The strategy's own post-accumulate hooks (registered before the layer marks)."""

    def warm_up(self, x, y) -> None:
        """A forward and backward of the bare module (no step, no collective: the Recorder has
        no step open, so nothing is marked), its gradients zeroed after: where the blocks are
        compiled, they compile here (the wrapper a strategy adds later calls the same ones)."""
        order: list[int] = []  # the parameters in the order their gradients are accumulated
        hooks = [p.register_post_accumulate_grad_hook(lambda p, j=j: order.append(j))
                 for j, p in enumerate(self.params)]
        F.cross_entropy(self.module(x), y).backward()
        for h in hooks:
            h.remove()
        self.opt.zero_grad(set_to_none=False)
        if self.compile_backend:  # each block's mark where its last gradient arrives
            pos = {j: k for k, j in enumerate(order)}
            index = {id(p): j for j, p in enumerate(self.params)}
            for i, block in enumerate(self.module.children()):
                last = max(block.parameters(), key=lambda p: pos.get(index[id(p)], -1))
                self.marks.retarget(i, last)

    def prepare(self) -> None:
        """Called on every rank before each of this strategy's steps, outside measurement: the
        gradients zeroed here, so that the step's first mark is its forward's start too (one
        event for both: Recorder.begin, attach_layer_hooks' forward)."""
        self.opt.zero_grad(set_to_none=False)

    @property
    def model(self) -> nn.Module:
        return self.module

    def runs_on(self, rank: int) -> bool:
        return rank < spec.strategy_ranks(self.name, self.world)

    def step(self, x, y) -> None:
        rec = self.rec
        loss = F.cross_entropy(self.model(x), y)
        rec.backward_starts()
        loss.backward()
        self.after_backward()
        self.opt.step(rec.opt_begin)  # (its start marked right before the update's op)
        rec.opt_end(last=True)  # (the step's end too: one event for both)

    def after_backward(self) -> None:
        pass


class Single(Strategy):
    name = "single"
    communicates = False


class Naive(Strategy):
    name = "naive"

    def after_backward(self) -> None:
        rec = self.rec
        cur = rec.cur
        for i, p in enumerate(self.params):
            p.grad.div_(self.world)
            slot = rec.comm_issue(i)
            with rec.issuing(slot):
                work = dist.all_reduce(p.grad, async_op=True)
            # the end is marked by the completion callback, on the thread that completes it
            # (gloo's worker, as soon as it is done; NCCL's at issue, on a stream that waits
            # for the kernel), not after this thread wakes from the wait (10-50 µs later)
            fut = work.get_future().then(lambda f, s=slot: _done(rec, cur, s, f))
            work.wait()
            fut.wait()


def _done(rec: Recorder, cur, slot: int, f):
    """Completion callback of an interleaved AllReduce. It returns the reduced tensors so
    that the child future carries their CUDA events (NCCL): waiting on it then makes the
    optimizer's stream wait for the AllReduce. Returning None would let the optimizer race
    the NCCL kernel."""
    rec.comm_done(cur, slot)
    return f.value()


class Interleaved(Strategy):
    name = "interleaved"

    def own_hooks(self) -> None:
        self.futs: list = []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._reduce(i, p))

    def _reduce(self, i: int, p) -> None:
        rec = self.rec
        cur = rec.cur
        if cur is None:  # (a backward outside the steps: Strategy.warm_up's)
            return
        p.grad.div_(self.world)
        slot = rec.comm_issue(i)
        with rec.issuing(slot):
            fut = dist.all_reduce(p.grad, async_op=True).get_future()
        self.futs.append(fut.then(lambda f: _done(rec, cur, slot, f)))

    def after_backward(self) -> None:
        torch.futures.wait_all(self.futs)
        self.futs = []


def _ddp_hook(state: "DDPStrategy", bucket):  # DDP requires the name `bucket`
    rec = state.rec
    cur = rec.cur
    buf = bucket.buffer()
    if state.track_buckets:
        state.seen.append((bucket.index(), [state.pindex[id(p)] for p in bucket.parameters()],
                           buf.numel() * buf.element_size()))
    # no division here: DDPStrategy.step scales the loss by 1/world, so the SUM is the mean
    slot = rec.comm_issue(bucket.index())

    def done(f):
        rec.comm_done(cur, slot)
        return f.value()[0]

    with rec.issuing(slot):
        fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(done)


class _NoRuntimeStats:
    """DDP's logger, less `set_runtime_stats_and_log`: DDP calls it from its forward on its
    first 10 iterations and periodically after, and on CUDA it synchronizes the reducer's
    timing events there — a hidden sync inside measured steps (again after every re-wrap).
    Everything else (the logging data ddptui reads bucket sizes from) is the real logger's."""

    def __init__(self, real):
        self._real = real

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._real, name)


def ddp_reported_sizes(ddp) -> list[int]:
    """Bucket sizes in bytes as DDP reports them (rebuilt ones once rebuilt), for a DDP whose
    logger is quieted (quiet_runtime_stats): its runtime stats are taken here, between steps."""
    ddp.logger._real.set_runtime_stats_and_log()
    data = ddp._get_ddp_logging_data()
    text = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(x) for x in str(text).replace(" ", "").split(",") if x]


def quiet_runtime_stats(ddp) -> None:
    ddp.logger = _NoRuntimeStats(ddp.logger)
    ddp._set_ddp_runtime_logging_sample_rate(1 << 30)  # the reducer's own periodic timing


class DDPStrategy(Strategy):
    name = "ddp"

    def __init__(self, base, rec, device, lr, world, bucket_cap_mb: float | None = None):
        super().__init__(base, rec, device, lr, world)
        self.pindex = {id(p): i for i, p in enumerate(self.params)}
        self.cap_mb = bucket_cap_mb
        self.layout: list | None = None  # last reported [(bucket, [param idx], bytes)]
        self.seen: list = []
        self.track_buckets = True
        self.ddp = None  # wrapped at the first DDP step (all ranks reach it together): other
        # strategies' first steps do not wait for DDP's construction
        # how the buckets are timed (comm_timing_for): a comm hook, or NCCL's own timing
        self.timing, self.timing_why = comm_timing_for(device)
        self.ready: BucketReady | None = None
        self.ready_at: list[int] | None = None  # each bucket's block (NCCL's own timing)
        # each parameter's block (the model's parameters are its blocks' in order)
        self.pblock = [i for i, block in enumerate(self.module.children()) for _ in block.parameters()]
        self.group = self.pg_backend = None
        if self.timing == "flight-recorder":  # (the layer marks' switch drives the ready hooks)
            rec.switches[self.name] = self._switch

    def _switch(self, on: bool) -> None:
        """Every step's layers marked (on) or a sample: the layer marks registered once and no
        bucket hooks, or the bucket hooks (Recorder.begin, through `rec.switches`)."""
        self.marks.set(on)
        if self.ready is not None:
            self.ready.enable(not on)

    def prepare(self) -> None:
        if self.ddp is None:
            self.wrap(self.cap_mb)
        super().prepare()

    def wrap(self, cap_mb: float | None) -> None:
        """(Re)wrap in DDP; every rank must call this at the same step."""
        old = getattr(self, "ddp", None)
        self.ddp = None
        if old is not None:
            # A node's Python post hooks are one dict, placed among its hooks where the first
            # was registered: re-registered on the old AccumulateGrad nodes, the marks would
            # stay before the new reducer's hooks. Every reference to those nodes dropped (ours,
            # the old reducer's), the new DDP makes new ones, and the marks go after it.
            self.marks.release_nodes()
            if self.ready is not None:  # (its hooks on the old nodes too)
                self.ready.clear()
            del old
            gc.collect()
        kw = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
        if self.device.type == "cuda":
            kw["device_ids"] = [self.device.index]
        self.ddp = DDP(self.module, **kw)
        # the layer marks after the reducer's hooks (its copy into the bucket is the layer's)
        self.marks.move_after()
        quiet_runtime_stats(self.ddp)
        if self.timing == "flight-recorder":
            if self.rec.fr is None:
                self.rec.fr = flightrec.flight_times_for(self.device.type)
            self.group = self.ddp.process_group.group_name
            self.pg_backend = self.ddp.process_group._get_backend(self.device)
            self.ready = BucketReady(self.rec, self.group, active=not self.marks.on)
            self.ready_at = None
        else:
            self.ddp.register_comm_hook(self, _ddp_hook)
        self.cap_mb = cap_mb
        self.layout = None
        self.reported: list[int] | None = None
        self.stable = 0
        self.track_buckets = True

    @property
    def model(self) -> nn.Module:
        return self.ddp

    def step(self, x, y) -> None:
        self.seen = []
        rec = self.rec
        loss = (F.cross_entropy(self.model(x), y) / self.world)
        rec.backward_starts()
        loss.backward()
        if self.ready is not None:  # (NCCL's own timing: which sequence numbers the buckets have)
            rec.comm_seal(self.group, self.pg_backend._get_sequence_number_for_group(),
                          self.ready_at if self.marks.on else None)
        self.opt.step(rec.opt_begin)  # (its start marked right before the update's op)
        rec.opt_end(last=True)  # (the step's end too)

    def _layout_from_reducer(self) -> None:
        """The buckets as DDP reports them once rebuilt (no comm hook to see them go by; its
        logging data, its runtime stats just taken by reported_sizes: each bucket's parameter
        indices in arrival order, and its bytes), and each bucket's ready hook on its last
        parameter. Before the rebuild (the first step): nothing, the step's buckets untimed."""
        data = self.ddp._get_ddp_logging_data()
        idx = data.get("rebuilt_per_bucket_param_indices") or ""
        sizes = data.get("rebuilt_bucket_sizes") or ""
        if not idx or not sizes:
            return
        try:
            per = [[int(x) for x in part.split()] for part in idx.split(",")]
            nbytes = [int(x) for x in sizes.split(",")]
        except ValueError:
            return
        if len(per) != len(nbytes) or any(not ps or max(ps) >= len(self.params) for ps in per):
            return
        self.seen = [(b, ps, n) for b, (ps, n) in enumerate(zip(per, nbytes))]
        self.ready.set([(b, self.params[ps[-1]]) for b, ps in enumerate(per)])
        # (DDP launches its buckets in order: one is ready once those before it are)
        at, low = [], len(self.pblock)
        for ps in per:
            low = min(low, min(self.pblock[i] for i in ps))
            at.append(low)
        self.ready_at = at

    def reported_sizes(self) -> list[int]:
        """Bucket sizes in bytes as DDP itself reports them (rebuilt ones once rebuilt).
        DDP fills them in where its forward logs runtime stats, which ddptui keeps out of
        measured steps (see _NoRuntimeStats): done here instead, between steps, only while
        the layout is tracked (the first steps after a wrap)."""
        return ddp_reported_sizes(self.ddp)

    def take_layout_change(self) -> tuple[list, list[int]] | None:
        """(bucket layout seen in the last step, sizes DDP reports) when either changed
        since last reported. DDP rebuilds buckets once; after a few stable steps stop looking."""
        if not self.track_buckets:
            return None
        reported = self.reported_sizes()
        if self.ready is not None:  # (NCCL's own timing: the layout from DDP, between steps)
            self._layout_from_reducer()
        if not self.seen:  # (none before DDP's rebuild)
            return None
        seen = sorted(self.seen)
        if seen == self.layout and reported == self.reported:
            self.stable += 1
            if self.stable >= 3:
                self.track_buckets = False
            return None
        self.layout, self.reported, self.stable = seen, reported, 0
        return seen, reported


def colls_rows(tap) -> list | None:
    """A collective tap's rows not reported yet, as a colls frame's rows (id first); None: none."""
    rows = tap.new_rows() if tap is not None else []
    if not rows:
        return None
    first = tap.sent - len(rows)
    return [(first + j, op, nb, size, group, layer, phase, asy)
            for j, (op, nb, size, group, layer, phase, asy) in enumerate(rows)]


class FSDPStrategy(Strategy):
    """FSDP2: fully_shard on every block fcN, then on the model (sharded at the first fsdp
    step, every rank together). Each block's parameters are all-gathered before its forward
    and again before its backward, its gradients reduce-scattered after it (FSDP2's
    defaults: reshard after forward, implicit prefetching); every collective is timed by the
    collective tap (ranks.core.colltap: COLL spans, attributed to the block FSDP2 gathers or
    scatters), on only while this strategy steps. Layers are timed by module hooks (FSDP2
    replaces the parameters, so the other strategies' parameter hooks cannot be used): a
    block's forward from its pre-hook (after FSDP2 waited for its all-gather) to its
    post-hook; its backward from its output's gradient to its input's, and for every block
    (the first's input needs no gradient) to FSDP2's post-backward of its unit, which comes
    when the block's gradients are all there, just before their reduce-scatter."""
    name = "fsdp"

    def __init__(self, base: nn.Module, rec: Recorder, device, lr: float, world: int):
        self.module = copy.deepcopy(base).to(device)
        self.rec, self.world, self.device, self.lr = rec, world, device, lr
        self.tap = None
        self.params: list = []
        self.opt = None

    def prepare(self) -> None:
        if self.tap is None:
            self._shard()
        super().prepare()

    def _shard(self) -> None:
        from torch.distributed.fsdp import fully_shard

        from ranks.core.colltap import CollTap
        blocks = list(self.module.children())
        for b in blocks:
            fully_shard(b)
        fully_shard(self.module)
        self.params = list(self.module.parameters())
        self.opt = PlainSGD(self.params, lr=self.lr)
        index = {id(b): i for i, b in enumerate(blocks)}
        rec = self.rec

        def layer_of(modules) -> int:
            return next((index[id(m)] for m in modules if id(m) in index), -1)

        def unit_done(modules) -> None:  # FSDP2's post-backward of a block: its backward's end
            i = layer_of(modules)
            if i >= 0 and rec.cur is not None:
                rec.bwd_end(i)
        self.tap = CollTap(rec, layer_of, on_reduce=unit_done)
        for i, b in enumerate(blocks):
            self._hook(i, b)

    def _hook(self, i: int, block: nn.Module) -> None:
        rec = self.rec

        def begin(g):
            rec.bwd_begin(i)
            s = rec.straggle
            if s is not None and s.layer == i:
                s.delay()

        def end(g):
            rec.bwd_end(i)

        def pre(m, args):
            if rec.cur is None:
                return
            rec.fwd_begin(i)
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(end)

        def post(m, args, out):
            if rec.cur is None:
                return
            rec.fwd_end(i)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(begin)
        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)

    def step(self, x, y) -> None:
        self.tap.activate()  # (only while FSDP2 steps: the others' collectives are theirs)
        try:
            super().step(x, y)
        finally:
            self.tap.deactivate()

    def take_colls(self) -> list | None:
        """Rows of the collectives table not reported yet, as a colls frame's rows."""
        return colls_rows(self.tap)


class _BuiltinPipeTap:
    """What ranks.core.pipetap's wrappers call, for a built-in pipeline strategy: each
    microbatch an MB span and a PASS span (its compute: the blocks are not marked one by one,
    a microbatch runs them again), the schedule's step a PIPE span, the P2P ops noted by
    direction, peer, stage and microbatch (the collective tap names them)."""

    __slots__ = ("rec", "p2p")

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.p2p: dict[int, tuple] = {}

    def _add(self, kind: int, idx: int, a, z) -> None:
        c = self.rec.cur
        if c is not None:
            if c.extra is None:
                c.extra = []
            c.extra.append((kind, idx, a, z))

    def step_begin(self, sched):
        return self.rec.clock.mark() if self.rec.cur is not None else None

    def step_end(self, token) -> None:
        self.p2p.clear()
        if token is not None:
            self._add(wire.PIPE, 0, token, self.rec.clock.mark())

    def chunk_begin(self, stage, mb: int):
        return self.rec.clock.mark() if self.rec.cur is not None else None

    def chunk_end(self, stage, mb: int, part: int, token) -> None:
        if token is None:
            return
        t = self.rec.clock.mark()
        self._add(wire.MB, wire.mb_idx(stage.stage_index, mb, part), token, t)
        self._add(wire.PASS, wire.PASS_FWD if part == 0 else wire.PASS_BWD, token, t)

    def count_samples(self, inputs) -> None:
        pass

    def note_ops(self, ops, direction: str, stage: int, mb: int) -> None:
        for op in ops:
            t = getattr(op, "tensor", None)
            if t is not None:
                peer = getattr(op, "peer", None)
                self.p2p[id(t)] = (direction, int(peer) if peer is not None else -1, int(stage), int(mb))

    def p2p_of(self, t):
        return self.p2p.get(id(t))


class PipelineStrategy(Strategy):
    """A pipeline of the built-in model (torch.distributed.pipelining): its blocks split in
    order into one stage a rank, the global batch in `microbatches` microbatches a step, run by
    the schedule (GPipe, 1F1B) on the default group; stage 0 takes the whole batch, the last
    stage the targets. Timed as a user's pipeline is (ranks.core.pipetap): each microbatch an
    MB span (with a PASS span: its compute), the schedule's step a PIPE span, the sends and
    receives COLL spans by direction and peer, waited on as WAITs."""
    name = "pipeline"
    schedule = "ScheduleGPipe"
    whole_batch = True  # (every stage sees the whole batch's microbatches: not split by rank)
    microbatches = spec.DEFAULT_MICROBATCHES

    def __init__(self, base: nn.Module, rec: Recorder, device, lr: float, world: int):
        self.module = copy.deepcopy(base).to(device)
        self.rec, self.world, self.device, self.lr = rec, world, device, lr
        blocks = list(self.module.children())
        if len(blocks) < world:
            raise ValueError(f"{self.name}: the model's {len(blocks)} blocks cannot make {world} stages")
        self.sched = None
        self.tap = None
        self.ptap = _BuiltinPipeTap(rec)
        self.params: list = []
        self.opt = None
        self.first = self.last = False

    def _build(self) -> None:
        from torch.distributed import pipelining

        from ranks.core import pipetap
        from ranks.core.colltap import CollTap
        pipetap.install()
        rank = dist.get_rank()
        blocks = list(self.module.children())
        n, w = len(blocks), self.world
        lo, hi = rank * n // w, (rank + 1) * n // w
        stage_mod = nn.Sequential(*blocks[lo:hi])
        self.params = list(stage_mod.parameters())
        self.opt = PlainSGD(self.params, lr=self.lr)
        stage = pipelining.PipelineStage(stage_mod, rank, w, self.device)
        cls = getattr(pipelining, self.schedule)
        self.sched = cls(stage, self.microbatches, loss_fn=F.cross_entropy)
        self.first, self.last = rank == 0, rank == w - 1
        self.tap = CollTap(self.rec, lambda modules: -1)
        self.tap.p2p_of = self.ptap.p2p_of

    def prepare(self) -> None:
        if self.sched is None:
            self._build()
        super().prepare()

    def step(self, x, y) -> None:
        from ranks.core import pipetap
        rec = self.rec
        self.tap.activate()  # (only while the pipeline steps: the others' collectives are theirs)
        pipetap.activate(self.ptap)
        try:
            self.sched.step(*((x,) if self.first else ()), **({"target": y} if self.last else {}))
        finally:
            pipetap.activate(None)
            self.tap.deactivate()
        self.opt.step(rec.opt_begin)
        rec.opt_end(last=True)

    def take_colls(self) -> list | None:
        """Rows of the collectives table not reported yet, as a colls frame's rows."""
        return colls_rows(self.tap)


class GPipeStrategy(PipelineStrategy):
    name = "gpipe"
    schedule = "ScheduleGPipe"


class OneFOneBStrategy(PipelineStrategy):
    name = "1f1b"
    schedule = "Schedule1F1B"


STRATEGY_CLASSES = {c.name: c for c in (Naive, Interleaved, DDPStrategy, Single, FSDPStrategy,
                                         GPipeStrategy, OneFOneBStrategy)}
