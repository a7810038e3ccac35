"""A recording written as one torch.profiler (Kineto) JSON trace per rank (`ddptui export
--format kineto`): what Holistic Trace Analysis and Perfetto read. The reading side, traces
opened as a recording, is ddptui.recording.kineto."""
from __future__ import annotations

import json
import os

from ranks import frames, spec, wire

from ddptui.model import figures
from ddptui.model.clocksync import HostClocks
from ddptui.model.collectives import group_label, group_parts, with_group
from ddptui.model.runinfo import simulated_label
from ranks.recfile import RecordingError


COMPUTE_STREAM, COMM_STREAM, EXTRA_STREAMS = 7, 13, 20
CPU_PID, DEVICE_PID, MAIN_TID = 1, 0, 1
KINETO_KINDS = {wire.FWD: "forward", wire.BWD: "backward", wire.OPT: "optimizer"}
# (wire.OTHER, a rank's evaluation that synchronises nothing, is left out: no kernel of a step)


def comm_kernel_name(label: str) -> str:
    """A collective named as NCCL names its kernels, so HTA counts it as communication."""
    return f"ncclDevKernel_AllReduce_Sum_f32(ddptui: {label})"


# every other collective (COLL spans): op -> (NCCL's kernel for it, torch's "Collective name"
# as record_param_comms writes it). HTA takes any kernel named ^nccl.*Kernel as communication
# (hta.utils.utils.is_comm_kernel): its comm/comp overlap counts them. NCCL runs all_to_all,
# gather, scatter, send and recv as SendRecv, and a barrier as a one-byte AllReduce.
COLL_KERNELS = {
    "all_reduce": ("ncclDevKernel_AllReduce_Sum_f32", "allreduce"),
    "all_gather": ("ncclDevKernel_AllGather_RING_LL", "_allgather_base"),
    "reduce_scatter": ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "_reduce_scatter_base"),
    "all_to_all": ("ncclDevKernel_SendRecv", "all_to_all"),
    "broadcast": ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    "barrier": ("ncclDevKernel_AllReduce_Sum_u8", "barrier"),
    "reduce": ("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce"),
    "gather": ("ncclDevKernel_SendRecv", "gather"),
    "scatter": ("ncclDevKernel_SendRecv", "scatter"),
    "send": ("ncclDevKernel_SendRecv", "send"),
    "recv": ("ncclDevKernel_SendRecv", "recv"),
}


def coll_kernel(row, label_of) -> tuple[str, dict]:
    """A COLL span's kernel name and args from its collectives table row (None: unknown)."""
    if row is None:
        return "ncclDevKernel_Generic(ddptui: unknown collective)", {"Collective name": "unknown"}
    _id, op, nbytes, group, gname, layer, phase, is_async = row
    kernel, cname = COLL_KERNELS.get(op, ("ncclDevKernel_Generic", op))
    gname, dim = group_parts(gname)[0], group_label(gname)
    what = with_group(op, dim)
    label = f"{what} {label_of(layer)}" if layer >= 0 else what
    full = nbytes // 4
    shard = full // group if group > 0 else full
    n_in, n_out = (shard, full) if op == "all_gather" else (full, shard) if op == "reduce_scatter" else (full, full)
    args = {"Collective name": cname, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": group,
            "dtype": "Float", "bytes": nbytes, "Process Group Name": gname,
            "Process Group Description": gname, "op": op, "phase": phase, "async": is_async}
    if dim != gname:  # (a device mesh's dimension, by its name)
        args["mesh_dim"] = dim
    if layer >= 0:
        args["layer"] = label_of(layer)
    return f"{kernel}(ddptui: {label})", args


class _RankOut:
    """One rank's trace being written: events streamed to a temporary file in DIR."""

    def __init__(self, path: str, rank: int, device: str):
        import tempfile
        self.path = path
        d = os.path.dirname(path)
        fd, self.tmp = tempfile.mkstemp(prefix=".ddptui-kineto-", suffix=".tmp", dir=d)
        self.f = os.fdopen(fd, "w", encoding="utf-8")
        self.rank = rank
        self.device = device
        self.first = True
        self.corr = 0
        self.steps = 0
        self.kernels = 0
        self.streams: dict[tuple[str, int], int] = {}  # (lane, sublane) -> stream
        self.ends: dict[tuple[str, int], int] = {}     # last end on that stream (ns)
        self.f.write('{\n  "schemaVersion": 1,\n  "traceEvents": [\n')

    def emit(self, ev: dict) -> None:
        self.f.write(("" if self.first else ",\n") + "  " + json.dumps(ev, separators=(",", ":")))
        self.first = False

    def stream(self, lane: str, a: int, z: int) -> int:
        """The stream of a kernel [a, z]: its lane's first stream it does not overlap on."""
        j = 0
        while self.ends.get((lane, j), a) > a:
            j += 1
        self.ends[(lane, j)] = z
        s = self.streams.get((lane, j))
        if s is None:
            s = (COMPUTE_STREAM if lane == "compute" else COMM_STREAM) if j == 0 else \
                EXTRA_STREAMS + len(self.streams)
            self.streams[(lane, j)] = s
        return s

    def kernel(self, name: str, lane: str, a: int, z: int, launch: int, args: dict) -> None:
        """A kernel event on its stream and its cudaLaunchKernel on the training thread,
        linked by a correlation id (HTA keeps only kernels whose launch it finds)."""
        self.corr += 1
        s = self.stream(lane, a, z)
        self.emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID,
                   "tid": MAIN_TID, "ts": launch / 1000, "dur": 0,
                   "args": {"External id": self.corr, "correlation": self.corr}})
        self.emit({"ph": "X", "cat": "kernel", "name": name, "pid": DEVICE_PID, "tid": s,
                   "ts": a / 1000, "dur": (z - a) / 1000,
                   "args": {"External id": self.corr, "device": 0, "stream": s,
                            "correlation": self.corr, **args}})
        self.kernels += 1

    def finish(self, top: dict) -> None:
        dev = "GPU" if self.device == "cuda" else "CPU"
        meta = [("process_name", CPU_PID, 0, {"name": f"rank {self.rank} host"}),
                ("process_labels", CPU_PID, 0, {"labels": "CPU"}),
                ("thread_name", CPU_PID, MAIN_TID, {"name": "training thread (ddptui steps)"}),
                ("process_name", DEVICE_PID, 0, {"name": f"rank {self.rank} ddptui spans"}),
                ("process_labels", DEVICE_PID, 0, {"labels": f"{dev} {self.rank} (ddptui spans)"})]
        for (lane, j), s in sorted(self.streams.items(), key=lambda x: x[1]):
            meta.append(("thread_name", DEVICE_PID, s,
                         {"name": f"stream {s} {lane}" + (f" {j + 1}" if j else "")}))
            meta.append(("thread_sort_index", DEVICE_PID, s, {"sort_index": s}))
        for name, pid, tid, args in meta:
            self.emit({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args})
        self.f.write("\n  ],\n")
        self.f.write(",\n".join(f"  {json.dumps(k)}: {json.dumps(v, default=str)}"
                                for k, v in top.items()))
        self.f.write("\n}\n")
        self.f.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        try:
            self.f.close()
            os.unlink(self.tmp)
        except OSError:
            pass


def export_kineto(path: str, out_dir: str, strategy: str | None = None) -> dict:
    """Write one Kineto JSON trace per rank of one strategy of a recording into out_dir
    (``rank<r>.json``): what HTA's TraceAnalysis and Perfetto read. Returns what was written:
    {"strategy", "files", "steps", "kernels"}. RecordingError for a bad file or strategy."""
    from ddptui import __version__
    from ddptui.model.stragglers import comm_spans
    from ddptui.recording.loader import load
    from ddptui.recording.rankset import open_reader as Reader
    from ddptui.reports.trace import Scan, run_meta

    scan = Scan()
    got = load(path, store=scan.store, on_frame=scan)
    meta = run_meta(got, scan.store)  # (layer and parameter names: from the hello frames too)
    recorded = [str(s) for s in meta.get("strategies") or []]
    have: dict[str, set] = {}
    r = Reader(path)
    try:
        for n, (_b, f) in enumerate(r):
            if n >= got.frames:
                break
            if type(f) is frames.Spans:
                have.setdefault(f.strategy, set()).add(f.rank)
    finally:
        r.close()
    if not have:
        raise RecordingError(f"{path}: no spans in this recording; nothing to export")
    if strategy is None:
        strategy = "ddp" if "ddp" in have else next(s for s in (recorded + sorted(have)) if s in have)
    if strategy not in have:
        raise RecordingError(f"{path}: no steps of strategy {strategy!r} (recorded: "
                             f"{', '.join(s for s in dict.fromkeys(recorded + sorted(have)) if s in have)})")
    ranks = sorted(have[strategy])
    world = spec.strategy_ranks(strategy, int(meta.get("world") or len(ranks)))
    world = max(world, ranks[-1] + 1)
    backend = str(meta.get("backend") or "")
    devices = {int(k): str(v) for k, v in (meta.get("devices") or {}).items()
               if str(k).isdigit()} | scan.devices
    layers = [str(x) for x in meta.get("layers") or []]
    params = meta.get("params") or []
    pnames = [str(p[0]) for p in params]
    pbytes = spec.grad_bytes(params)
    player = [int(p[2]) for p in params]
    origin = scan.origin_ns or 0
    skip = set(got.rejected)
    tables = scan.store.collective_tables(strategy)  # (COLL spans: what each was)
    os.makedirs(out_dir, exist_ok=True)
    outs = {rk: _RankOut(os.path.join(out_dir, f"rank{rk}.json"), rk, devices.get(rk, ""))
            for rk in ranks}
    clocks = HostClocks()
    lname = lambda i: layers[i] if 0 <= i < len(layers) else f"layer {i}"  # noqa: E731
    pname = lambda i: pnames[i] if 0 <= i < len(pnames) else f"param {i}"  # noqa: E731
    r = Reader(path)
    try:
        for n, (_b, f) in enumerate(r):
            if n >= got.frames:
                break
            if n in skip:
                continue
            cls = type(f)
            if cls is frames.Node or cls is frames.Clock:
                clocks.observe(f)
            if cls is not frames.Spans or f.strategy != strategy:
                continue
            b = wire.decode_spans(f)
            o = outs[b.rank]
            off = clocks.to_common(b.rank, b.base_ns) - origin
            ready = {i: off + us * 1000 for i, us, _key in comm_spans(b)}
            spans = sorted((off + b.t0[i] * 1000, max(off + b.t0[i] * 1000, off + b.t1[i] * 1000),
                            b.kind[i], b.idx[i], i) for i in range(len(b)))
            steps = [(a, z) for a, z, kind, _, _ in spans if kind == wire.STEP]
            s0, s1 = steps[0] if steps else (spans[0][0], max(x[1] for x in spans))
            o.emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{b.step}",
                    "pid": CPU_PID, "tid": MAIN_TID, "ts": s0 / 1000, "dur": (s1 - s0) / 1000,
                    "args": {"ddptui": f"{strategy} step {b.step}"}})
            o.steps += 1
            buckets = scan.buckets_at(b.rank, strategy, b.step) if strategy == "ddp" else None
            # (where its compute stood waiting for a collective (WAIT), a layer's kernel is cut:
            # no compute runs there, as ddptui's figures have it, and HTA counts the same)
            waits = [(off + w0 * 1000, off + w1 * 1000) for w0, w1 in figures.waits_of(b)]
            for a, z, kind, idx, i in spans:
                base = {"rank": b.rank, "strategy": strategy, "step": b.step}
                if kind == wire.PASS:  # a step whose layers were not marked (sampled)
                    name = wire.PASS_NAMES[idx & 1] + " (layers not marked)"
                    for a1, z1 in (figures.difference([(a, z)], waits) if waits else ((a, z),)):
                        o.kernel(name, "compute", a1, z1, min(max(a1, s0), s1), base)
                elif kind in KINETO_KINDS:
                    name = ("optimizer step" if kind == wire.OPT
                            else f"{KINETO_KINDS[kind]} {lname(idx)}")
                    if kind != wire.OPT:
                        base["layer"] = lname(idx)
                    for a1, z1 in (figures.difference([(a, z)], waits) if waits and kind != wire.OPT
                                   else ((a, z),)):
                        o.kernel(name, "compute", a1, z1, min(max(a1, s0), s1), base)
                elif kind == wire.COMM:
                    if buckets is not None:
                        ps, nbytes = buckets.get(idx, [[], 0])
                        label = f"bucket {idx}"
                        base["params"] = [pname(p) for p in ps]
                    else:
                        nbytes = pbytes[idx] if 0 <= idx < len(pbytes) else 0
                        label = pname(idx)
                        if 0 <= idx < len(player):
                            base["layer"] = lname(player[idx])
                    base.update({"Collective name": "allreduce", "In msg nelems": nbytes // 4,
                                 "Out msg nelems": nbytes // 4, "Group size": world,
                                 "dtype": "Float", "bytes": nbytes,
                                 "Process Group Ranks": str(list(range(world)))})
                    o.kernel(comm_kernel_name(label), "communication", a, z,
                             min(max(ready.get(i, a), s0), s1), base)
                elif kind == wire.COLL:
                    name, args = coll_kernel(tables.get(b.rank, {}).get(idx), lname)
                    base.update(args)
                    if base.get("Group size") == world:
                        base["Process Group Ranks"] = str(list(range(world)))
                    o.kernel(name, "communication", a, z, min(max(ready.get(i, a), s0), s1), base)
        label = simulated_label(meta)
        sim = {} if label is None else {
            "SIMULATED": f"{label}: made by ddptui demo's step simulator, not measured"}
        for rk, o in outs.items():
            o.finish({**sim, "distributedInfo": {"backend": backend, "rank": rk, "world_size": world,
                                          "pg_count": 1, "pg_config": [{
                                              "pg_name": "0", "pg_desc": "default_pg",
                                              "backend_config": backend, "pg_size": world,
                                              "ranks": list(range(world))}]},
                      "displayTimeUnit": "ms",
                      "traceName": os.path.basename(o.path),
                      "ddptui": {"version": __version__, "recording": os.path.basename(path),
                                 "strategy": strategy, "model": meta.get("model"),
                                 "device": devices.get(rk, ""),
                                 **({"simulated": meta.get("simulated")} if label else {}),
                                 "events": "each kernel is one ddptui span: a layer's forward or "
                                           "backward, the optimizer, or one collective; not one "
                                           "GPU kernel"}})
    except BaseException:
        for o in outs.values():
            o.discard()
        raise
    finally:
        r.close()
    return {"strategy": strategy, "files": [o.path for o in outs.values()],
            "steps": {rk: o.steps for rk, o in outs.items()},
            "kernels": sum(o.kernels for o in outs.values())}
