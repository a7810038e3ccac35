"""GPU steps of ddptui's MLP in the exact shape of a real torch.profiler (Kineto) trace of a
CUDA run, with ddptui's own spans of the same steps from the real Recorder and CudaClock on
the CUDA stand-in (tests/cuda_sim.py), so that `ddptui verify`'s GPU path can be tested
without a GPU.

The shape follows the public A100 trace of HTA's test data (tests/data/hta_nccl_a100.json.gz):
CPU ops (`cat: cpu_op`) with "External id", "Sequence number"; `cudaLaunchKernel` runtime events
with "correlation"; kernels on streams (`pid` 0, `tid` = stream) whose "External id" is that of
the innermost CPU op that launched them; backward nodes (`autograd::engine::evaluate_function:`)
on the autograd engine's device thread, not the training thread; an NCCL AllReduce as
`c10d::allreduce_` > `record_param_comms` > an NCCL kernel on its own stream (named
`ncclKernel_AllReduce_RING_LL_Sum_float(...)` as NCCL 2.17 does, or `ncclDevKernel_...` as
newer NCCL does).

Timeline rules (the stand-in's): a kernel starts when its stream is free and 4 µs after the
host launched it; an NCCL kernel's stream first waits for the compute stream at the issue; a
`then` callback runs on the next pool stream, made to wait for the collective; a blocking
AllReduce makes the compute stream wait for it.
"""
from __future__ import annotations

from contextlib import contextmanager

from ranks import frames, spec, wire
from ranks.core.instrument import CudaClock, Recorder
from tests.cuda_sim import SimCuda, SimStream

MAIN, AUTOGRAD = 1000, 2000
COMPUTE_SID, NCCL_SID = 7, 40
LAUNCH_NS, LATENCY_NS, OP_NS = 5_000, 4_000, 3_000
NCCL_2_17 = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


class KinetoRank:
    def __init__(self, model: str = "small", world: int = 2, rank: int = 0,
                 nccl_name: str = NCCL_2_17):
        self.sim = sim = SimCuda(read_ns=100)
        self.model, self.world, self.rank, self.nccl_name = model, world, rank, nccl_name
        self.widths = spec.MODEL_WIDTHS[model]
        self.n_layers = len(self.widths) - 1
        self.nccl = SimStream(sim, "nccl")
        self.events: list[dict] = []
        self._ids = 0
        self._stack: dict[int, list[int]] = {MAIN: [], AUTOGRAD: []}
        self._seq = 100
        self.clock = CudaClock("cuda:0", torch_cuda=sim, host_ns=sim.host_ns)
        self.rec = Recorder(self.clock, self.n_layers)
        self.items: list[tuple] = []

    # -- trace building ----------------------------------------------------------------
    def _id(self) -> int:
        self._ids += 1
        return self._ids

    def _x(self, cat, name, pid, tid, t0, t1, args) -> dict:
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
             "ts": t0 / 1000, "dur": (t1 - t0) / 1000, "args": args}
        self.events.append(e)
        return e

    @contextmanager
    def op(self, name: str, tid: int, seq: int | None = None, dims=None):
        """A CPU op; `seq` -1 gives it a new sequence number (an op that makes an autograd
        node), another number that one (a backward node, linked to its forward op)."""
        ext = self._id()
        args = {"External id": ext, "Record function id": ext}
        if seq == -1:
            self._seq += 1
            seq = self._seq
        if seq is not None:
            args["Sequence number"] = seq
        if dims is not None:
            args["Input Dims"] = dims
        t0 = self.sim.now
        self._stack[tid].append(ext)
        self.sim.host_work(OP_NS)
        try:
            yield seq
        finally:
            self.sim.host_work(OP_NS)
            self._stack[tid].pop()
            self._x("cpu_op", name, 1, tid, t0, self.sim.now, args)

    def kernel(self, name: str, tid: int, dur_ns: int, stream=None, sid=COMPUTE_SID, extra=None):
        stream = stream or self.sim.default
        ext = self._stack[tid][-1]
        corr = self._id()
        t0 = self.sim.now
        self.sim.host_work(LAUNCH_NS)
        self._x("cuda_runtime", "cudaLaunchKernel", 1, tid, t0, self.sim.now,
                {"External id": ext, "correlation": corr, "cbid": 211})
        start = max(stream.tail, self.sim.now + LATENCY_NS)
        stream.tail = start + dur_ns
        self._x("kernel", name, 0, sid, start, stream.tail,
                {"External id": ext, "correlation": corr, "device": 0, "stream": sid,
                 **(extra or {})})
        return stream.tail

    def allreduce(self, tid: int, numel: int, slot: int, cur, blocking: bool) -> None:
        """c10d::allreduce_ > record_param_comms > NCCL kernel; then the completion."""
        rec, sim = self.rec, self.sim
        with self.op("c10d::allreduce_", tid, dims=[[numel]]):
            with self.op("record_param_comms", tid):
                self.nccl.tail = max(self.nccl.tail, sim.default.tail)  # waits for compute
                end = self.kernel(self.nccl_name, tid, 20_000 + numel // 50, self.nccl, NCCL_SID,
                                  {"Collective name": "allreduce", "In msg nelems": numel,
                                   "Group size": self.world, "dtype": "Float"})
        if blocking:  # work.wait(): the compute stream waits for the collective
            sim.default.tail = max(sim.default.tail, end)
            rec.comm_done(cur, slot)
        else:  # fut.then(done): on the next pool stream, made to wait for the collective
            cb = sim.pool_stream()
            cb.tail = max(cb.tail, end)
            sim.set_stream(cb)
            try:
                rec.comm_done(cur, slot)
            finally:
                sim.set_stream(None)

    def node(self, name: str, seq: int | None = None):
        return self.op(f"autograd::engine::evaluate_function: {name}", AUTOGRAD, seq=seq)

    # -- one step, as ranks/builtin/strategies.py runs it ---------------------------------------
    def step(self, strategy: str, k: int) -> None:
        rec, sim, L = self.rec, self.sim, self.n_layers
        batch = 512
        with self.op("aten::_foreach_zero_", MAIN):  # Strategy.prepare: before the step
            self.kernel("multi_tensor_apply_kernel<zero>", MAIN, 30_000)
        self.clock.maybe_calibrate()
        rec.begin(strategy, k)
        seqs = []
        rec.fwd_between(-1)
        for j in range(L):
            fi, fo = self.widths[j], self.widths[j + 1]
            s = {}
            with self.op("aten::linear", MAIN):
                with self.op("aten::t", MAIN, seq=-1) as s["t"]:
                    pass
                with self.op("aten::addmm", MAIN, seq=-1, dims=[[fo], [batch, fi], [fi, fo]]) as s["addmm"]:
                    self.kernel("ampere_sgemm_128x64_tn", MAIN, 40_000 + fi * fo // 40)
            if j < L - 1:
                with self.op("aten::relu", MAIN, seq=-1) as s["relu"]:
                    self.kernel("vectorized_elementwise_kernel<4, relu>", MAIN, 15_000)
            rec.fwd_between(j)
            seqs.append(s)
        with self.op("aten::cross_entropy_loss", MAIN, seq=-1) as loss_seq:
            self.kernel("cunn_SoftMaxForward<4, float>", MAIN, 12_000)
        # backward: on the autograd engine's device thread
        with self.node("NllLossBackward0", loss_seq):
            with self.op("aten::nll_loss_backward", AUTOGRAD):
                self.kernel("nll_loss_backward_reduce_cuda_kernel_2d", AUTOGRAD, 8_000)
        bucket = 0
        for j in reversed(range(L)):
            fi, fo = self.widths[j], self.widths[j + 1]
            s = seqs[j]
            if j == L - 1:
                rec.bwd_begin(j)  # the pre-hook on the model output's node
            if j < L - 1:
                with self.node("ReluBackward0", s["relu"]):
                    with self.op("aten::threshold_backward", AUTOGRAD):
                        self.kernel("vectorized_elementwise_kernel<4, threshold_backward>", AUTOGRAD, 15_000)
            with self.node("AddmmBackward0", s["addmm"]):
                with self.op("aten::mm", AUTOGRAD):
                    if j > 0:
                        self.kernel("ampere_sgemm_64x64_nn", AUTOGRAD, 40_000 + fi * fo // 40)
                    self.kernel("ampere_sgemm_64x64_nt", AUTOGRAD, 40_000 + fi * fo // 40)
                with self.op("aten::sum", AUTOGRAD):
                    self.kernel("reduce_kernel<sum>", AUTOGRAD, 10_000)
            # the engine's order: the bias's AccumulateGrad, TBackward, the weight's
            for pname in ("bias", "T", "weight"):
                if pname == "T":
                    with self.node("TBackward0", s["t"]):
                        pass
                    continue
                with self.node("torch::autograd::AccumulateGrad"):
                    with self.op("aten::add_", AUTOGRAD):
                        self.kernel("vectorized_elementwise_kernel<4, add>", AUTOGRAD, 10_000)
                    if pname == "weight":  # the weight's post-accumulate-grad hook
                        if j > 0:
                            rec.bwd_between(j - 1)
                        else:
                            rec.bwd_end(0)
                        if strategy == "ddp":  # the reducer's hook: a bucket per layer, ready
                            slot = rec.comm_issue(bucket)
                            bucket += 1
                            self.allreduce(AUTOGRAD, fi * fo + fo, slot, rec.cur, blocking=False)
        if strategy == "ddp":  # the reducer's finalize: compute waits for every callback
            sim.default.tail = max([sim.default.tail] + [st.tail for st in sim.low])
        if strategy == "naive":
            cur = rec.cur
            for i, (_, numel, _layer) in enumerate(spec.param_table(self.model)):
                with self.op("aten::div_", MAIN):
                    self.kernel("vectorized_elementwise_kernel<4, div>", MAIN, 8_000)
                slot = rec.comm_issue(i)
                self.allreduce(MAIN, numel, slot, cur, blocking=True)
        rec.opt_begin()
        with self.op("aten::_foreach_add_", MAIN):
            self.kernel("multi_tensor_apply_kernel<add>", MAIN, 60_000)
        rec.opt_end()
        rec.end()
        sim.now = max(sim.now, sim.default.tail, self.nccl.tail) + 50_000  # the control word
        self.items.extend(self.rec.poll())

    # -- outputs -------------------------------------------------------------------------
    def trace(self) -> dict:
        return {"schemaVersion": 1,
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
                "traceEvents": list(self.events)}

    def batches(self, shift: dict | None = None) -> list:
        """ddptui's spans as the app decodes them (µs columns), `shift` {kind: ns} applied."""
        from ranks.builtin.profwin import shift_item
        out = []
        for item in self.items:
            if shift:
                item = shift_item(item, shift)
            s, k, base, kinds, idxs, t0, t1, iss = item
            out.append(wire.decode_spans(frames.spans_frame(self.rank, s, k, base, kinds, idxs,
                                                            t0, t1, iss)))
        return out

    def comm_bytes(self, strategy: str, step: int, idx: int) -> int:
        if strategy == "ddp":
            j = self.n_layers - 1 - idx
            fi, fo = self.widths[j], self.widths[j + 1]
            return 4 * (fi * fo + fo)
        return 4 * spec.param_table(self.model)[idx][1]
