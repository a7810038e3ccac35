"""torch.profiler (Kineto) traces read as a ddptui recording: a directory of one JSON trace
per rank (``*.json`` or ``*.json.gz``, as ``tensorboard_trace_handler`` writes them).

`recording.rankset.open_reader(DIR)` is a KinetoReader when DIR holds such traces (and no
``rank<r>.ddptui``), so summary, replay and export read them through the same Feed into the
same Store as a recording. What becomes what (strategy ``ddp`` or ``fsdp``, times in the trace's own
clock, ns):

- step k: ``ProfilerStep#k`` (the training thread is the thread of those records). On GPU the
  step is the device work its ops launched (first kernel start to last kernel end).
- communication: NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``) on GPU; ``gloo:*``
  records on CPU, each paired with the ``c10d::`` op that issued it by their order (gloo's
  worker threads take the work in issue order). A step's collectives are numbered in issue
  order; the i-th collective of step k of every rank is one collective (matched by order).
  Its bytes: the kernel's ``In msg nelems`` and ``dtype``, or the record's input dims.
  An all_reduce is a gradient AllReduce (a COMM span, one "bucket" each); any other op (the
  kernel's or record_param_comms' ``Collective name``, else the kernel's, c10d op's or gloo
  record's name) is a COLL span with a row of the rank's collectives table (a ``colls``
  frame; one row per distinct row, in first-seen order): its op, its buffer's bytes (the
  larger of in and out: an all-gather's gathered output), its group (the args', else the
  run's one group), the layer whose forward range or backward node issued it (else -1), and
  the pass (``_Where``). A trace with FSDP's ``FSDP::`` annotations is strategy ``fsdp``.
- compute, per layer: the layers are module records (``nn.Module: X``, ``with_modules=True``
  with Python stacks) or ``record_function`` ranges on the training thread inside the
  forward (``DistributedDataParallel.forward`` when present), at the shallowest level with at
  least two of them; without any, one layer ``model``. Forward of a layer: its range (CPU) or
  the kernels its ops launched (GPU, by the kernel's ``External id``). Backward: the
  autograd engine's ``evaluate_function`` nodes (any thread), given to the layer of the
  forward op with the same sequence number (``AccumulateGrad``: the layer of the node before
  it). Optimizer: ``Optimizer.step#*``.

The JSON is read in a stream, one rank at a time (memory: what is kept, not the file): JSON
formatted as torch writes it (one event per ``\\n  {`` block) is cut into pieces decoded by msgspec
into typed records that keep only the fields used here; any other formatting is read by ijson.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from array import array
from bisect import bisect_left, bisect_right
from typing import Any

import msgspec

from ranks import frames, spec, wire

from ranks.recfile import RecordingError

STRATEGY = spec.USER_STRATEGY
NCCL_KERNELS = ("ncclKernel_", "ncclDevKernel_")
EVAL = "autograd::engine::evaluate_function: "
TORCH_RANGES = ("ProfilerStep#", "Optimizer.", "DistributedDataParallel.", "nccl:", "gloo:",
                "c10d::", "record_param_comms", "## ", "FSDP::")
# the Python calls of a backward (with_stack=True): a collective issued inside one is in the backward
_BACKWARD_CALL = re.compile(r".*torch/autograd/(__init__|graph)\.py\(\d+\): (backward|_engine_run_backward)$")
# a collective's name (an NCCL kernel's, a c10d op's, a gloo record's, record_param_comms'
# `Collective name`), lower case without '_', to its op (spec.COLL_OPS); the first match wins
_OP_KEYS = (("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
            ("allgather", "all_gather"), ("alltoall", "all_to_all"), ("sendrecv", "all_to_all"),
            ("broadcast", "broadcast"), ("barrier", "barrier"), ("reduce", "reduce"),
            ("gather", "gather"), ("scatter", "scatter"), ("send", "send"), ("recv", "recv"))
DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
               "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8, "byte": 1, "char": 1,
               "bool": 1, "uint8": 1, "int8": 1, "short": 2, "int16": 2}
PIECE = 8 << 20  # bytes of JSON decoded at a time
_TRACE_FILE = re.compile(r".+\.json(\.gz)?$")


class _Args(msgspec.Struct):
    ext: Any = msgspec.field(name="External id", default=None)
    seq: Any = msgspec.field(name="Sequence number", default=None)
    fwd_tid: Any = msgspec.field(name="Fwd thread id", default=None)
    stream: Any = None
    nelems: Any = msgspec.field(name="In msg nelems", default=None)
    dtype: Any = None
    dims: Any = msgspec.field(name="Input Dims", default=None)
    types: Any = msgspec.field(name="Input type", default=None)
    coll: Any = msgspec.field(name="Collective name", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)


class _Ev(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None  # _Args, decoded lazily below


_PIECE_DEC = msgspec.json.Decoder(list[msgspec.Raw])
_EV_DEC = msgspec.json.Decoder(_Ev)
_ARGS_DEC = msgspec.json.Decoder(_Args)


class _EvA(_Ev):
    """An event with its args decoded at once (a small file: no use deferring them)."""
    args: _Args | None = None


_EVS_DEC = msgspec.json.Decoder(list[_EvA])


def trace_files(path: str) -> list[str]:
    """The Kineto traces of a directory (sorted by name); [] when there are none."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [os.path.join(path, n) for n in names
            if _TRACE_FILE.fullmatch(n) and os.path.isfile(os.path.join(path, n))]


def _open(path: str):
    try:
        f = open(path, "rb")
    except OSError as e:
        raise RecordingError(f"{path}: cannot open ({e.strerror})") from None
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        return gzip.GzipFile(fileobj=f, mode="rb")
    f.seek(0)
    return f


def read_events(path: str, info: dict):
    """Yield a trace's events (_EvA) in a stream; fills `info` with its top-level fields
    (distributedInfo, ...). RecordingError for a file that is not a Kineto JSON trace."""
    name = os.path.basename(path)
    try:
        f = _open(path)
        with f:
            buf = f.read(PIECE)
            at = buf.find(b'"traceEvents": [')
            if at < 0 or buf.find(b"\n  {", at) < 0:
                yield from _read_ijson(path, info)
                return
            head = buf[:at]
            buf = buf[at + len(b'"traceEvents": ['):]
            tail = b""
            while True:
                end = buf.find(b"\n  ]")
                if end >= 0:
                    tail, buf = buf[end + 4:], buf[:end]
                    cut = len(buf)
                else:
                    cut = buf.rfind(b"\n  {")
                if cut > 0:
                    piece = buf[:cut].strip().rstrip(b",")
                    if piece:
                        yield from _EVS_DEC.decode(b"[" + piece + b"]")
                    buf = buf[cut:]
                if end >= 0:
                    break
                more = f.read(PIECE)
                if not more:
                    raise RecordingError(f"{name}: the trace ends inside its events (a cut file?)")
                buf += more
            tail += f.read()
        doc = json.loads(head + b'"traceEvents": []' + tail)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        info.update((k, v) for k, v in doc.items() if k != "traceEvents")
    except RecordingError:
        raise
    except (msgspec.DecodeError, ValueError, EOFError, OSError) as e:
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise RecordingError(f"{name}: not a readable torch.profiler JSON trace ({why})") from None


def _read_ijson(path: str, info: dict):
    """Any other JSON formatting: ijson's streaming parser (slower, same events)."""
    import ijson
    name = os.path.basename(path)
    try:
        with _open(path) as f:
            n = 0
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                n += 1
                if isinstance(e, dict):
                    yield msgspec.convert(e, _EvA, strict=False)
        with _open(path) as f:
            for k, v in ijson.kvitems(f, "", use_float=True):
                if k != "traceEvents":
                    info[k] = v
    except (ijson.JSONError, ValueError, EOFError, OSError, msgspec.ValidationError) as e:
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise RecordingError(f"{name}: not a readable torch.profiler JSON trace ({why})") from None
    if not n:
        raise RecordingError(f"{name}: not a torch.profiler trace (no events in traceEvents)")


def _int(v, default=-1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _ns(us) -> int:
    return int(round(float(us) * 1000))


def _numel(dims) -> int:
    """Elements of a record's first input (a list of ints, or a list of them)."""
    if not isinstance(dims, list) or not dims:
        return 0
    d = dims[0]
    while isinstance(d, list) and d and isinstance(d[0], list):
        d = d[0]
    if not isinstance(d, list):
        return 0
    n = 1
    for x in d:
        n *= x if isinstance(x, int) and x > 0 else 1
    return n if d else 0


def coll_op(name) -> str | None:
    """The op (spec.COLL_OPS) a collective's name says (``ncclDevKernel_AllGather_...``,
    ``c10d::_reduce_scatter_base_``, ``gloo:all_to_all``, ``allgather_into_tensor_coalesced``),
    or None. A ``SendRecv`` kernel is an all_to_all (point-to-point calls name themselves)."""
    if not isinstance(name, str):
        return None
    n = name.split("(", 1)[0].lower().replace("_", "")
    for key, op in _OP_KEYS:
        if key in n:
            return op
    return None


def _input_bytes(a) -> int:
    """Bytes of a c10d op's buffer: the larger of its first two inputs (the gathered output of
    an all-gather, the input of a reduce-scatter; as ranks/core/colltap.py counts them)."""
    dims = a.dims if a is not None else None
    if not isinstance(dims, list):
        return 0
    types = a.types if isinstance(a.types, list) else []
    best = 0
    for i in range(min(2, len(dims))):
        ty = types[i] if i < len(types) else ""
        best = max(best, _numel(dims[i:i + 1]) * DTYPE_BYTES.get(str(ty).lower(), 4))
    return best


def _msg_group(a) -> tuple[int, str]:
    """(group size, group name) a kernel's or record_param_comms' args say (0, "") if not."""
    size = _int(a.group_size, 0)
    name = a.pg_desc if isinstance(a.pg_desc, str) and a.pg_desc else a.pg_name
    return size, (str(name) if name is not None else "")


class KinetoRankEvents:
    """One rank's Kineto trace file reduced, as it is read, to the events ddptui uses (steps,
    ranges, autograd nodes, kernels, collectives); rank_steps turns them into per-step spans."""

    def __init__(self, path: str):
        self.path = path
        self.info: dict = {}
        self.steps: list = []       # (k, t0, t1, tid)
        self.ranges: list = []      # (t0, t1, tid, name, module?)
        self.evals: list = []       # (t0, t1, tid, seq, accumulate?)
        self.fwd_seq: dict = {}     # sequence number -> forward op start
        self.c10d: list = []        # (t0, name, bytes, tid, buffer bytes, t1) of c10d:: ops (issue; bytes
        #                             from their input dims; the buffer: see _input_bytes)
        self.gloo: list = []        # (t0, t1, name, bytes)
        self.nccl: list = []        # (t0, t1, ext, bytes, (op, buffer bytes, group size, group name))
        self.comms: list = []       # (t0, tid, op, group size, group name) of record_param_comms
        self.bwd_calls: list = []   # (t0, t1) of the Python backward calls (with_stack)
        self.fsdp = False           # FSDP:: ranges seen (FSDP's own annotations)
        self.k_t0, self.k_t1, self.k_ext = array("q"), array("q"), array("q")
        self.ext_t0, self.ext_tid = array("q"), array("q")  # launching op by External id
        self.tids: dict = {}
        self._read()

    def _tid(self, v) -> int:
        return self.tids.setdefault(v, len(self.tids))

    def _read(self) -> None:
        for e in read_events(self.path, self.info):
            if e.ph != "X" or e.ts is None:
                continue
            cat, name, a = e.cat, e.name, e.args
            if not isinstance(name, str):
                continue
            try:
                t0 = _ns(e.ts)
                t1 = t0 + _ns(e.dur or 0)
            except (TypeError, ValueError):
                continue
            if cat == "kernel":
                ext = _int(a.ext) if a is not None else -1
                if name.startswith(NCCL_KERNELS):
                    size = DTYPE_BYTES.get(str(a.dtype).lower(), 4) if a is not None else 4
                    nb = _int(a.nelems, 0) * size if a is not None else 0
                    op = (coll_op(a.coll) if a is not None else None) or coll_op(name[len("nccl"):])
                    g = _msg_group(a) if a is not None else (0, "")
                    full = max(nb, _int(a.out_nelems, 0) * size if a is not None else 0)
                    self.nccl.append((t0, t1, ext, nb, (op or "", full, g[0], g[1])))
                else:
                    self.k_t0.append(t0)
                    self.k_t1.append(t1)
                    self.k_ext.append(ext)
                continue
            if cat not in ("cpu_op", "user_annotation", "python_function"):
                continue
            tid = self._tid(e.tid)
            if a is not None and cat != "python_function":
                ext = _int(a.ext)
                if 0 < ext < 1 << 26:
                    if ext >= len(self.ext_t0):
                        grow = ext + 1 - len(self.ext_t0) + 1024
                        self.ext_t0.extend(array("q", [-1]) * grow)
                        self.ext_tid.extend(array("q", [-1]) * grow)
                    self.ext_t0[ext], self.ext_tid[ext] = t0, tid
            if cat == "python_function":
                if name.startswith("nn.Module: "):
                    self.ranges.append((t0, t1, tid, name[len("nn.Module: "):], True))
                elif name.endswith("backward") and _BACKWARD_CALL.match(name):
                    self.bwd_calls.append((t0, t1))
                continue
            if name.startswith("ProfilerStep#"):
                k = _int(name[len("ProfilerStep#"):])
                if k >= 0:
                    self.steps.append((k, t0, t1, tid))
            elif name.startswith("gloo:"):
                ty = a.types[0] if a is not None and isinstance(a.types, list) and a.types else ""
                self.gloo.append((t0, t1, name, _numel(a.dims if a else None)
                                  * DTYPE_BYTES.get(str(ty).lower(), 4)))
            elif name.startswith("c10d::"):
                ty = a.types[0] if a is not None and isinstance(a.types, list) and a.types else ""
                self.c10d.append((t0, name, _numel(a.dims if a else None) * DTYPE_BYTES.get(str(ty).lower(), 4),
                                  tid, _input_bytes(a), t1))
            elif name == "record_param_comms":
                if a is not None:
                    self.comms.append((t0, tid, coll_op(a.coll) or "", *_msg_group(a)))
            elif name.startswith(EVAL):
                self.evals.append((t0, t1, tid, _int(a.seq) if a is not None else -1,
                                   "AccumulateGrad" in name))
            elif cat == "user_annotation" or name.startswith(("Optimizer.", "DistributedDataParallel.")):
                self.ranges.append((t0, t1, tid, name, False))
                if name.startswith("FSDP::"):
                    self.fsdp = True
            elif a is not None and not a.fwd_tid:  # forward ops: no (or 0) "Fwd thread id"
                seq = _int(a.seq)
                if seq >= 0:
                    self.fwd_seq.setdefault(seq, t0)

    # -- what the trace says about the run -------------------------------------------------
    def dist(self) -> tuple[int, int, str]:
        d = self.info.get("distributedInfo")
        name = os.path.basename(self.path)
        if not isinstance(d, dict):
            raise RecordingError(f"{name}: no distributedInfo (record it with torch.distributed "
                                 f"initialised, one trace per rank)")
        rank, world = _int(d.get("rank")), _int(d.get("world_size"))
        if not 0 <= rank < world <= 4096:
            raise RecordingError(f"{name}: distributedInfo has rank {d.get('rank')!r} of world "
                                 f"size {d.get('world_size')!r}")
        return rank, world, str(d.get("backend") or "")

    def layers(self) -> tuple[list[str], list]:
        """(layer names, per step [(t0, t1, layer)] sorted) of the training thread."""
        if not self.steps:
            return ["model"], [[] for _ in self.steps]
        main = self.steps[0][3]
        rs = sorted(((t0, t1, n, m) for t0, t1, tid, n, m in self.ranges if tid == main),
                    key=lambda r: (r[0], -r[1]))
        fwd = [r for r in rs if r[2].startswith("DistributedDataParallel.forward")]
        cand = [r for r in rs if not r[2].startswith(TORCH_RANGES)]
        if fwd:
            cand = [r for r in cand if any(f[0] <= r[0] and r[1] <= f[1] for f in fwd)]
        mods = [r for r in cand if r[3]]
        cand = mods or cand
        # nesting depth of each candidate; the shallowest level with two or more names
        depth, stack = [], []
        for r in cand:
            while stack and stack[-1][1] <= r[0]:
                stack.pop()
            depth.append(len(stack))
            stack.append(r)
        names: list[str] = []
        per_step = []
        for d in sorted(set(depth)):
            lv = [r for r, dd in zip(cand, depth) if dd == d]
            names = list(dict.fromkeys(r[2] for r in lv))
            if len(names) >= 2:
                break
        else:
            return ["model"], None
        index = {n: i for i, n in enumerate(names)}
        lv_all = [(r[0], r[1], index[r[2]]) for r, dd in zip(cand, depth) if dd == d]
        for _k, s0, s1, _ in self.steps:
            per_step.append([x for x in lv_all if s0 <= x[0] < s1])
        return names, per_step


def _assign(t: int, spans: list, starts: list):
    """The span of a sorted list [(t0, t1, value)] holding t, or None."""
    i = bisect_right(starts, t) - 1
    if i >= 0 and spans[i][0] <= t <= spans[i][1]:
        return spans[i][2]
    return None


def rank_steps(tr: KinetoRankEvents, names: list[str], per_step) -> dict:
    """{k: {"spans": [(kind, idx, t0, t1)], "iss": [...], "bytes": [...]}} of one rank."""
    if not tr.steps:
        return {}
    main = tr.steps[0][3]
    steps = sorted(tr.steps, key=lambda s: s[1])
    s_starts = [s[1] for s in steps]
    out: dict = {}
    acc: dict = {}  # (k, kind, idx) -> [t0, t1]

    def add(k, kind, idx, t0, t1):
        v = acc.get((k, kind, idx))
        if v is None:
            acc[(k, kind, idx)] = [t0, t1]
        else:
            v[0], v[1] = min(v[0], t0), max(v[1], t1)

    def step_of(t):
        i = bisect_right(s_starts, t) - 1
        return steps[i][0] if i >= 0 and steps[i][1] <= t <= steps[i][2] else None

    opt = sorted((t0, t1, 0) for t0, t1, tid, n, _ in tr.ranges
                 if tid == main and n.startswith("Optimizer.step"))
    opt_starts = [o[0] for o in opt]
    fwd_of: dict = {}
    fwd_lists: dict = {}
    for i, (k, s0, s1, _) in enumerate(tr.steps):
        lv = sorted(per_step[i]) if per_step is not None else []
        if not lv:  # one layer: the DDP forward, else the step up to its first backward node
            ddpf = [(t0, t1, 0) for t0, t1, tid, n, _m in tr.ranges if tid == main
                    and n.startswith("DistributedDataParallel.forward") and s0 <= t0 < s1]
            first_bwd = min((e[0] for e in tr.evals if s0 <= e[0] < s1), default=s1)
            lv = ddpf or [(s0, first_bwd, 0)]
        fwd_lists[k] = (lv, [x[0] for x in lv])
        for t0, t1, j in lv:
            fwd_of[(k, j, t0)] = t1
    # backward nodes -> layers, by the forward op of the same sequence number
    by_tid: dict = {}
    for ev in sorted(tr.evals):
        t0, t1, tid, seq, is_acc = ev
        k = step_of(t0)
        if k is None:
            continue
        layer = None
        prev = by_tid.get(tid)
        if is_acc:
            layer = prev[-1][2] if prev else None
        elif seq in tr.fwd_seq and k in fwd_lists:
            lv, starts = fwd_lists[k]
            layer = _assign(tr.fwd_seq[seq], lv, starts)
            if layer is None and len(names) == 1:
                layer = 0
        if layer is None:
            layer = prev[-1][2] if prev else len(names) - 1
        by_tid.setdefault(tid, []).append((t0, t1, layer, k))
    gpu = len(tr.k_t0) > 0 or len(tr.nccl) > 0
    node_lists = {tid: (ns, [n[0] for n in ns]) for tid, ns in by_tid.items()}
    if not gpu:
        for k, (lv, _) in fwd_lists.items():
            for t0, t1, j in lv:
                add(k, wire.FWD, j, t0, t1)
        for nodes in by_tid.values():
            for t0, t1, j, k in nodes:
                add(k, wire.BWD, j, t0, t1)
        for t0, t1, _ in opt:
            k = step_of(t0)
            if k is not None:
                add(k, wire.OPT, 0, t0, t1)
        for k, s0, s1, _ in tr.steps:
            add(k, wire.STEP, 0, s0, s1)
    else:
        ext_t0, ext_tid, n_ext = tr.ext_t0, tr.ext_tid, len(tr.ext_t0)
        for kt0, kt1, ext in zip(tr.k_t0, tr.k_t1, tr.k_ext):
            if not 0 < ext < n_ext or ext_t0[ext] < 0:
                continue
            lt, ltid = ext_t0[ext], ext_tid[ext]
            k = step_of(lt)
            if k is None:
                continue
            add(k, wire.STEP, 0, kt0, kt1)
            lv, starts = fwd_lists[k]
            j = _assign(lt, lv, starts) if ltid == main else None
            if j is not None:
                add(k, wire.FWD, j, kt0, kt1)
                continue
            if _assign(lt, opt, opt_starts) is not None:
                add(k, wire.OPT, 0, kt0, kt1)
                continue
            nl = node_lists.get(ltid)
            node = None
            if nl is not None:
                i = bisect_right(nl[1], lt) - 1
                if i >= 0 and nl[0][i][0] <= lt <= nl[0][i][1]:
                    node = nl[0][i][2]
            if node is not None:
                add(k, wire.BWD, node, kt0, kt1)
    where = _Where(tr, main, fwd_lists, node_lists, opt, opt_starts, len(names))
    # collectives in issue order per step: (t0, t1, issued, bytes, what): what is None for an
    # all_reduce (a gradient AllReduce, a COMM span) or a collective of no known op, else
    # (op, bytes, group size, group, layer, phase) of a COLL span
    colls: dict = {}
    if tr.nccl:
        launched = []  # issue order: when the launching op started (then the kernel)
        for t0, t1, ext, nb, (op, full, gsize, gname) in tr.nccl:
            ok = 0 < ext < len(tr.ext_t0) and tr.ext_t0[ext] >= 0
            lt, ltid = (tr.ext_t0[ext], tr.ext_tid[ext]) if ok else (t0, -1)
            launched.append((lt, t0, t1, nb, ltid, op, full, gsize, gname))
        for lt, t0, t1, nb, ltid, op, full, gsize, gname in sorted(launched, key=lambda x: x[:4]):
            k = step_of(lt)
            if k is not None:
                what = None
                if op and op != "all_reduce":
                    what = (op, 0 if op == "barrier" else full, gsize, gname, *where(lt, ltid, k))
                colls.setdefault(k, []).append((t0, t1, t0, nb, what))
                add(k, wire.STEP, 0, t0, t1)
    else:
        issued = sorted(tr.c10d)
        work = sorted(tr.gloo)
        paired = len(issued) == len(work)
        comms = sorted(tr.comms)
        c_starts = [c[0] for c in comms]
        for i, (t0, t1, name, nb) in enumerate(work):
            iss = issued[i][0] if paired else t0
            if not nb and paired:  # a record still open when the profiler stopped (torch 2.11
                nb = issued[i][2]  # writes it without its input dims): its c10d op's size
            k = step_of(iss) if paired else step_of(t0)
            if k is not None:
                op = (coll_op(issued[i][1]) if paired else None) or coll_op(name)
                what = None
                if op and op != "all_reduce":
                    full = issued[i][4] if paired else nb
                    tid = issued[i][3] if paired else main
                    gsize, gname = 0, ""
                    j = bisect_left(c_starts, iss)  # its record_param_comms (inside it), if any
                    if paired and j < len(comms) and comms[j][0] <= issued[i][5] and comms[j][1] == tid:
                        gsize, gname = comms[j][3], comms[j][4]
                    what = (op, 0 if op == "barrier" else full, gsize, gname, *where(iss, tid, k))
                colls.setdefault(k, []).append((t0, t1, min(iss, t0), nb, what))
    for k, _s0, _s1, _ in tr.steps:
        spans = [(kind, idx, v[0], v[1]) for (kk, kind, idx), v in acc.items() if kk == k]
        if not any(s[0] == wire.STEP for s in spans):
            continue
        cs = colls.get(k, [])
        ar = [c for c in cs if c[4] is None]
        spans += [(wire.COMM, i, c[0], c[1]) for i, c in enumerate(ar)]
        out[k] = {"spans": spans, "iss": [c[2] for c in ar], "bytes": [c[3] for c in ar],
                  "colls": [(c[0], c[1], c[2], c[4]) for c in cs if c[4] is not None]}
    return out


class _Where:
    """(phase, layer) of a collective issued at t on thread tid in step k: inside an autograd
    node, the backward and the node's layer; inside Optimizer.step, the optimizer; inside a
    layer's forward range, the forward and that layer; inside a Python backward call (or
    between a step's first and last autograd node), the backward; inside any module's forward
    (the whole model's: FSDP's root), the forward; else the step. Layer -1 where no layer's
    range holds it."""

    def __init__(self, tr, main, fwd_lists, node_lists, opt, opt_starts, n_layers):
        self.main, self.fwd_lists, self.node_lists = main, fwd_lists, node_lists
        self.opt, self.opt_starts = opt, opt_starts
        self.one = n_layers == 1 and not any(m for *_, m in tr.ranges)
        wins = list(tr.bwd_calls)
        for tid, (ns, _) in node_lists.items():  # a step's nodes, first to last
            per: dict = {}
            for t0, t1, _j, k in ns:
                w = per.get(k)
                per[k] = (t0, t1) if w is None else (min(w[0], t0), max(w[1], t1))
            wins += per.values()
        self.bwd = _union(wins)
        self.fwd = _union([(t0, t1) for t0, t1, tid, n, m in tr.ranges if tid == main and
                           (m or n.startswith("DistributedDataParallel.forward"))])

    def __call__(self, t: int, tid: int, k: int) -> tuple[int, str]:
        nl = self.node_lists.get(tid)
        if nl is not None:
            i = bisect_right(nl[1], t) - 1
            if i >= 0 and nl[0][i][0] <= t <= nl[0][i][1]:
                return nl[0][i][2], "backward"
        if _assign(t, self.opt, self.opt_starts) is not None:
            return -1, "optimizer"
        if tid == self.main and k in self.fwd_lists and not self.one:
            lv, starts = self.fwd_lists[k]
            j = _assign(t, lv, starts)
            if j is not None:
                return j, "forward"
        if _inside(t, self.bwd):
            return -1, "backward"
        if _inside(t, self.fwd):
            return -1, "forward"
        return -1, "step"


def _union(spans: list) -> tuple[list, list]:
    """Sorted, merged (t0, t1) intervals, and their starts."""
    out: list = []
    for t0, t1 in sorted(spans):
        if out and t0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], t1))
        else:
            out.append((t0, t1))
    return out, [o[0] for o in out]


def _inside(t: int, merged: tuple[list, list]) -> bool:
    i = bisect_right(merged[1], t) - 1
    return i >= 0 and merged[0][i][0] <= t <= merged[0][i][1]


class KinetoReader:
    """A directory of per-rank Kineto traces read as one recording (Reader's interface:
    path, name, meta, damage, frames; iterating yields (body, frame): the ranks.frames Struct
    decoded and validated from body, or a frames.Invalid)."""

    def __init__(self, path: str, chunk: int = 0):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.damage = None
        self.frames = 0
        files = trace_files(path)
        if not files:
            raise RecordingError(f"{path}: no torch.profiler traces (*.json, *.json.gz)")
        ranks: dict[int, tuple] = {}
        world = backend = None
        names = None
        fsdp = False
        for f in files:
            tr = KinetoRankEvents(f)
            r, w, b = tr.dist()
            if world is not None and w != world:
                raise RecordingError(f"{os.path.basename(f)}: world size {w}, other traces say {world}")
            if r in ranks:
                raise RecordingError(f"{path}: two traces of rank {r} ({os.path.basename(ranks[r][0])}, "
                                     f"{os.path.basename(f)})")
            world, backend = w, b
            if not tr.steps:
                raise RecordingError(f"{os.path.basename(f)}: no ProfilerStep#N records (record with "
                                     f"a profiler schedule and prof.step() each iteration)")
            ln, per_step = tr.layers()
            if names is None:
                names = ln
            ranks[r] = (f, tr.info, rank_steps(tr, names, per_step if ln == names else None),
                        bool(len(tr.k_t0) or tr.nccl))
            fsdp = fsdp or tr.fsdp
            del tr
        missing = sorted(set(range(world)) - set(ranks))
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            raise RecordingError(f"{path}: no trace of rank {shown} (world size {world} in distributedInfo)")
        self.ranks = ranks
        self.layers = names or ["model"]
        n_coll = max((len(s["iss"]) for _, _, st, _ in ranks.values() for s in st.values()), default=0)
        sizes = [0] * n_coll
        for _, _, st, _ in ranks.values():
            for s in st.values():
                for i, nb in enumerate(s["bytes"]):
                    sizes[i] = sizes[i] or nb
        self.params = [[f"collective {i}", nb // 4, len(self.layers) - 1] for i, nb in enumerate(sizes)]
        gpu = any(g for *_, g in ranks.values())
        # an FSDP run (its FSDP:: annotations) is drawn in the fsdp pane, any other as ddp
        self.strategy = spec.USER_FSDP_STRATEGY if fsdp else STRATEGY
        self.meta = {"ddptui": "0.1.0", "model": "trace", "strategies": [self.strategy], "world": world,
                     "layers": self.layers, "params": self.params, "steps": 0, "batch": 0,
                     "backend": backend, "user": True, "source": "torch.profiler",
                     "device": "cuda" if gpu else "cpu",
                     "devices": {str(r): ("cuda" if g else "cpu") for r, (*_, g) in ranks.items()}}

    def _frames(self):
        world = self.meta["world"]
        for r in sorted(self.ranks):
            yield frames.Hello(rank=r, world=world, device=self.meta["devices"][str(r)],
                               backend=self.meta["backend"][:16], model="trace", layers=self.layers,
                               params=[tuple(p) for p in self.params], strategies=[self.strategy], steps=0)
            yield frames.Phase(rank=r, phase="training")
        steps = sorted({k for _, _, st, _ in self.ranks.values() for k in st})
        last: dict = {}
        tables: dict = {r: {} for r in self.ranks}  # rank -> its collectives table: row -> id
        strategy = self.strategy
        for k in steps:
            for r in sorted(self.ranks):
                s = self.ranks[r][2].get(k)
                if s is None:
                    continue
                assignment = [(i, [i], nb) for i, nb in enumerate(s["bytes"])]
                if assignment and assignment != last.get(r):
                    last[r] = assignment
                    yield frames.Buckets(rank=r, strategy=strategy, step=k, buckets=assignment)
                table, new = tables[r], []
                sp = [(kind, idx, t0, t1, s["iss"][idx] if kind == wire.COMM else 0)
                      for kind, idx, t0, t1 in s["spans"]]
                for t0, t1, iss, what in s["colls"]:
                    row = self._row(r, what)
                    rid = table.get(row)
                    if rid is None:
                        rid = table[row] = len(table)
                        new.append((rid, *row))
                    sp.append((wire.COLL, rid, t0, t1, iss))
                if new:  # the rows these spans name, before them
                    yield frames.Colls(rank=r, strategy=strategy, rows=new)
                sp.sort(key=lambda x: (x[2], x[0]))
                base = min(x[2] for x in sp)
                iss = [max(base, x[4]) for x in sp if x[0] in wire.COMM_KINDS]
                yield frames.spans_frame(r, strategy, k, base, [x[0] for x in sp], [x[1] for x in sp],
                                         [x[2] for x in sp], [x[3] for x in sp], iss)
        for r in sorted(self.ranks):
            yield frames.Bye(rank=r, why="end of trace")

    def _row(self, r: int, what: tuple) -> tuple:
        """A collectives-table row (less its id) of rank r: (op, bytes, group size, group,
        layer, phase, async); the group from the trace's args, else the run's one group."""
        op, nb, size, name, layer, phase = what
        world = self.meta["world"]
        pgs = self.ranks[r][1].get("distributedInfo", {}).get("pg_config")
        one = pgs[0] if isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict) else None
        if not size and one is not None:
            size = _int(one.get("pg_size"), 0)
        size = size if 1 <= size <= world else world
        if not name and one is not None:
            name = str(one.get("pg_desc") or one.get("pg_name") or "")
        if name in ("default_pg", "undefined", "0") and size == world:
            name = "world"
        return (op, max(0, int(nb)), size, name[:64], layer, phase, True)

    def __iter__(self):
        for f in self._frames():  # checked as a recording's are: decoded from their bodies
            self.frames += 1
            body = frames.encode(f)
            yield body, frames.decode_or_invalid(body)

    def close(self) -> None:
        pass
