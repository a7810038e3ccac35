"""A recording as a Chrome trace (Trace Event Format JSON).

Perfetto (ui.perfetto.dev, trace_processor), chrome://tracing and HTA-style tools open it:

- a JSON object with a ``traceEvents`` list (``displayTimeUnit``: ms, ``otherData``: the
  run's metadata);
- a process per rank: ``pid`` = rank + 1 (pid 0 is the idle process in some viewers), named
  by a ``process_name`` metadata event "rank N (device)", ordered by ``process_sort_index``;
- a thread per lane: "step", "compute" (forward and backward per layer), "communication"
  (one slice per collective: an AllReduce of a parameter or bucket, or any other collective,
  named by its op, its device mesh dimension if any, and issuing layer, "all_gather h.3",
  "all_reduce@tp layers.0"), "optimizer" (``thread_name``/``thread_sort_index`` metadata;
  ``tid`` = pid * 100 + lane, unique across processes). A slice that would partly overlap
  the one before it on its lane goes on an extra lane ("communication 2"), so slices on a
  thread always nest properly;
- complete events (``ph: "X"``) with ``ts``/``dur`` in µs on one time axis for all ranks
  (the host's CLOCK_MONOTONIC, 0 = the first span of the recording) and ``args``: rank,
  strategy, step, and layer (compute), parameter or bucket with its parameter names and
  bytes (communication; any other collective: op, bytes, group, group_size, layer, phase,
  async, from its rank's collectives table, and on a device mesh mesh_dim and
  group_first_rank, which of the dimension's groups), queued_us (ready to start of an AllReduce), last_arriver (the rank
  ready last), wait_us (last arriver's ready - this rank's), transfer_us (end - last ready);
- instant events (``ph: "i"``, thread scope, on a "ddp events" lane, at the start of the DDP
  step they apply to) for bucket-cap changes and for each new DDP bucket assignment.

Events are written in recording order: on every thread, start times never decrease.
The file is written to a temporary name and renamed, so a failed export leaves nothing.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from ranks import frames, spec, wire
from ranks.wire import (BWD, COLL, COMM, FWD, MB, MB_PARTS, OPT, OTHER, PASS, PASS_NAMES, PIPE, STEP, WAIT,
                        mb_of)

from ddptui import __version__
from ddptui.model.clocksync import HostClocks
from ddptui.model.collectives import group_label, group_parts, with_group
from ddptui.model.runinfo import simulated_label
from ddptui.recording.loader import load
from ddptui.recording.rankset import open_reader
from ranks.recfile import FORMAT_VERSION, RecordingError
from ddptui.model.store import in_force
from ddptui.model.stragglers import comm_spans, rank_arrival_keys

# lane: (tid offset, thread name); "waits": where the compute stood waiting for a collective
# (a WAIT), its own track under the compute one (sorted by SORT_OF)
LANES = {"step": (1, "step"), "compute": (2, "compute"), "communication": (3, "communication"),
         "optimizer": (4, "optimizer"), "events": (5, "ddp events"), "waits": (6, "compute waits"),
         "microbatches": (7, "pipeline microbatches")}
SORT_OF = {"waits": 2}  # (a lane sorted elsewhere than its tid offset: beside compute, after it)
# (OTHER: a rank's own work that synchronises nothing, an evaluation: on its compute lane)
LANE_OF_KIND = {STEP: "step", FWD: "compute", BWD: "compute", COMM: "communication", OPT: "optimizer",
                OTHER: "compute", COLL: "communication", PASS: "compute",
                # a pipeline's: each microbatch's forward / backward a slice ("F3" as pipeline
                # diagrams write it), inside its schedule's step, on a track of their own
                MB: "microbatches", PIPE: "microbatches"}
MB_PART_NAMES = ("forward", "backward", "backward input-grad", "backward weight-grad")
SUBLANE_STRIDE = 10  # extra lanes for partly overlapping slices: tid offset + 10 * j


def pid_of(rank: int) -> int:
    return rank + 1


def tid_of(rank: int, lane: str, sub: int = 0) -> int:
    return pid_of(rank) * 100 + LANES[lane][0] + SUBLANE_STRIDE * sub


class Scan:
    """Pass 1, fed by recording.load(store=scan.store, on_frame=scan): the Store that load()
    fills keeps the run (clocks, devices, bucket assignments, events); this keeps what the Store
    keeps only for its last steps but a trace needs for every step: where its time starts,
    each rank's lanes, the start of each DDP step, and who was ready last for each collective."""

    def __init__(self, store=None):
        from ddptui.model.store import Store
        self.store = store if store is not None else Store()
        self.origin_ns: int | None = None
        self.lanes: dict[int, set[str]] = {}
        self.ddp_base: dict[tuple[int, int], int] = {}  # (rank, step) -> start of a DDP step
        # (strategy, step, kind, idx, n-th time[, its group's lowest rank]) -> (last ready ns, the
        # rank ready last): who waits (on a device mesh, within each group: stragglers.arrival_key)
        self.arrivals: dict[tuple, tuple[int, int]] = {}
        self._assignments: dict[tuple[int, str], list] = {}

    @property
    def clocks(self):
        """Every host's times on node 0's axis (multi-node), as the Store maps them."""
        return self.store.host_clocks

    @property
    def devices(self) -> dict[int, str]:
        return {r: str(info.device) for r, info in self.store.rank_snapshot().items()}

    @property
    def events(self) -> set[int]:
        """Ranks with bucket events: a bucket assignment, or (rank 0) a bucket-cap change."""
        ranks = self.store.bucket_reporters()
        if self.store.cap_history():
            ranks.add(0)
        return ranks

    def _arrivals(self, f: frames.Spans) -> None:
        b = wire.decode_spans(f)
        base = self.clocks.to_common(b.rank, b.base_ns)
        spans = list(comm_spans(b))
        ckeys = rank_arrival_keys([c for _, _, c in spans], self.store.rank_coll_groups(b.strategy, b.rank))
        for (_, ready_us, _), ckey in zip(spans, ckeys):
            ready = base + ready_us * 1000
            key = (b.strategy, b.step, *ckey)
            got = self.arrivals.get(key)
            if got is None or ready > got[0]:
                self.arrivals[key] = (ready, b.rank)

    def __call__(self, f: frames.Frame) -> None:
        if type(f) is not frames.Spans:
            return
        self._arrivals(f)
        r, b = f.rank, self.clocks.to_common(f.rank, f.base_ns)
        if self.origin_ns is None or b < self.origin_ns:
            self.origin_ns = b
        lanes = self.lanes.setdefault(r, set())
        for k in set(f.kind):
            lanes.add(LANE_OF_KIND[k])
        if f.wait:
            lanes.add("waits")
        if f.strategy == "ddp":  # (the STEP span's start: OTHER spans may come before it)
            i = f.kind.find(STEP)
            self.ddp_base[(r, f.step)] = b if i < 0 else b + 1000 * int.from_bytes(f.t0[4 * i:4 * i + 4], "little")

    def buckets_at(self, rank: int, strategy: str, step: int) -> dict[int, list] | None:
        """The bucket assignment in force on `rank` at `step`, from the Store, as
        {bucket: [parameter indices, bytes]}."""
        got = self._assignments.get((rank, strategy))
        if got is None:
            got = self._assignments[(rank, strategy)] = [
                (k, {b[0]: [b[1], b[2]] for b in assignment})
                for k, assignment in self.store.bucket_history(strategy, rank)]
        return in_force(got, step, first=True) if got else None


class TraceWriter:
    """Pass 2: frames in, trace events out (streamed to a file object)."""

    def __init__(self, out, meta: dict, scan: Scan):
        self.out = out
        self.meta = meta
        self.scan = scan
        self.origin = scan.origin_ns or 0
        self.clocks = HostClocks()
        params = meta.get("params") or []
        self.param_names = [str(p[0]) for p in params]
        self.param_bytes = spec.grad_bytes(params)
        layers = meta.get("layers") or []
        self.layer_names = [str(x) for x in layers]
        self.param_layer = [int(p[2]) for p in params]
        self.first = True
        self.slices = 0
        self.instants = 0
        self.per_lane: dict[tuple[int, str], int] = {}
        self.stacks: dict[tuple[int, str], list[list[int]]] = {}
        self.named_tids: set[int] = set()
        self.last_instant: dict[int, int] = {}
        self.last_ts: dict[int, int] = {}
        self._tables: dict[str, dict[int, dict]] = {}  # strategy -> rank -> collectives table

    # -- output --------------------------------------------------------------------------
    def emit(self, ev: dict) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(ev, separators=(",", ":")))
        self.first = False

    def begin(self) -> None:
        self.out.write('{"traceEvents":[\n')
        sc = self.scan
        devices = dict(sc.devices)
        for k, v in (self.meta.get("devices") or {}).items():
            try:
                devices.setdefault(int(k), str(v))
            except (TypeError, ValueError):
                pass
        for r in sorted(set(sc.lanes) | sc.events):
            dev = devices.get(r)
            pid = pid_of(r)
            name = f"rank {r} ({dev})" if dev else f"rank {r}"
            label = simulated_label(self.meta)
            self.emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": name if label is None else f"{name} {label}"}})
            self.emit({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": r}})
            for lane in LANES:
                if lane in sc.lanes.get(r, ()) or (lane == "events" and r in sc.events):
                    self._name_thread(r, lane, 0)

    def _name_thread(self, rank: int, lane: str, sub: int) -> int:
        tid = tid_of(rank, lane, sub)
        if tid not in self.named_tids:
            self.named_tids.add(tid)
            name = LANES[lane][1] + (f" {sub + 1}" if sub else "")
            self.emit({"name": "thread_name", "ph": "M", "pid": pid_of(rank), "tid": tid,
                       "args": {"name": name}})
            self.emit({"name": "thread_sort_index", "ph": "M", "pid": pid_of(rank), "tid": tid,
                       "args": {"sort_index": SORT_OF.get(lane, LANES[lane][0]) + SUBLANE_STRIDE * sub}})
        return tid

    def finish(self, extra: dict) -> None:
        other = {"ddptui": __version__, "recording_format": FORMAT_VERSION}
        for k in ("model", "layers", "world", "batch", "strategies", "backend", "device",
                  "devices", "torch", "host", "bucket_cap_mb", "steps", "seed", "lr", "settings", "simulated"):
            if self.meta.get(k) is not None:
                other[k] = self.meta[k]
        other.update(extra)
        label = simulated_label(self.meta)
        if label is not None:
            other["SIMULATED"] = f"{label}: made by ddptui demo's step simulator, not measured"
        self.out.write('\n],\n"displayTimeUnit":"ms",\n"otherData":'
                       + json.dumps(other, separators=(",", ":"), default=str) + "}\n")

    # -- frames --------------------------------------------------------------------------
    def frame(self, f: frames.Frame) -> None:
        cls = type(f)
        if cls is frames.Node or cls is frames.Clock:  # multi-node: the mapping from here on, as live
            self.clocks.observe(f)
        if cls is frames.Spans:
            self._spans(f)
        elif cls is frames.Event and f.what == "bucket_cap_mb":
            cap, k = float(f.value), f.step
            self._instant(f.rank, k, f"bucket_cap_mb → {cap:g} MB",
                          {"bucket_cap_mb": cap, "step": k, "rank": f.rank})
        elif cls is frames.Buckets:
            assignment = f.buckets
            args = {"strategy": f.strategy, "step": f.step, "rank": f.rank,
                    "bucket_cap_mb": f.cap_mb, "buckets": len(assignment),
                    "bucket_bytes": [b[2] for b in assignment],
                    "bucket_params": [[self._pname(p) for p in b[1]] for b in assignment]}
            self._instant(f.rank, f.step, f"DDP buckets: {len(assignment)}", args)

    def _instant(self, rank: int, step: int, name: str, args: dict) -> None:
        """At the start of DDP step `step` on this rank (known from pass 1), or else at the
        latest time seen on the rank, never before an earlier instant of that rank."""
        base = self.scan.ddp_base.get((rank, step))
        ts_ns = base - self.origin if base is not None else self.last_ts.get(rank, 0)
        ts_ns = max(ts_ns, self.last_instant.get(rank, 0))
        self.last_instant[rank] = ts_ns
        tid = self._name_thread(rank, "events", 0)
        self.emit({"name": name, "cat": "ddp", "ph": "i", "s": "t", "ts": ts_ns / 1000,
                   "pid": pid_of(rank), "tid": tid, "args": args})
        self.instants += 1

    def _pname(self, i: int) -> str:
        return self.param_names[i] if 0 <= i < len(self.param_names) else f"param {i}"

    def _lname(self, i: int) -> str:
        return self.layer_names[i] if 0 <= i < len(self.layer_names) else f"layer {i}"

    def _coll(self, strategy: str, rank: int, idx: int, args: dict) -> str:
        """A COLL span's name ('all_gather h.3') and args, from its rank's collectives table
        (a span no row describes: 'collective (unknown)')."""
        tables = self._tables.get(strategy)
        if tables is None:
            tables = self._tables[strategy] = self.scan.store.collective_tables(strategy)
        row = tables.get(rank, {}).get(idx)
        if row is None:
            args.update(op="unknown", collective=idx)
            return "collective (unknown)"
        _id, op, nbytes, group_size, group, layer, phase, is_async = row
        base, low = group_parts(group)
        label = group_label(group)
        args.update(op=op, bytes=nbytes, group=base, group_size=group_size,
                    layer=self._lname(layer) if layer >= 0 else None, phase=phase, **{"async": is_async})
        if label != base:  # (a device mesh's dimension, by its name: tp, dp, dp_shard)
            args["mesh_dim"] = label
        if low is not None:  # (one of the group's instances: its lowest rank)
            args["group_first_rank"] = low
        where = self._lname(layer) if layer >= 0 else None
        if where != label:  # (the group said once: a Flight Recorder run's lanes are its groups)
            op = with_group(op, label)
        return f"{op} {where}" if where is not None else op

    def _sublane(self, rank: int, lane: str, a: int, z: int) -> int:
        """Lane index where [a, z] nests or follows (slices on one thread must nest)."""
        stacks = self.stacks.setdefault((rank, lane), [])
        for j, st in enumerate(stacks):
            while st and st[-1] <= a:
                st.pop()
            if not st or z <= st[-1]:
                st.append(z)
                return j
        stacks.append([z])
        return len(stacks) - 1

    def _spans(self, f: frames.Spans) -> None:
        b = wire.decode_spans(f)
        r, s, k = b.rank, b.strategy, b.step
        off = self.clocks.to_common(r, b.base_ns) - self.origin
        buckets = self.scan.buckets_at(r, s, k) if s == "ddp" else None
        spans = list(comm_spans(b))
        keys = rank_arrival_keys([c for _, _, c in spans], self.scan.store.rank_coll_groups(s, r))
        comm = {i: (off + ready_us * 1000, self.scan.arrivals.get((s, k, *key)))
                for (i, ready_us, _), key in zip(spans, keys)}
        items = []
        for i in range(len(b)):
            kind = b.kind[i]
            a = off + b.t0[i] * 1000
            z = max(a, off + b.t1[i] * 1000)
            iss, last = comm.get(i, (None, None))
            items.append((a, -(z - a), i, kind, z, iss, last))
        w = b.waits  # (where its compute stood waiting for a collective: a track of its own)
        for j in range(0, len(w), 3):
            a = off + w[j] * 1000
            z = max(a, off + w[j + 1] * 1000)
            items.append((a, -(z - a), -1 - w[j + 2], WAIT, z, None, None))
        items.sort()
        for a, _neg, i, kind, z, iss, last in items:
            lane = "waits" if kind == WAIT else LANE_OF_KIND[kind]
            idx = b.idx[i] if i >= 0 else -1 - i
            args = {"rank": r, "strategy": s, "step": k}
            if kind == WAIT:  # (idx: the COLL span's table row it waited for)
                name = "waiting for " + self._coll(s, r, idx, args)
                args["kind"] = "wait"
                args["note"] = "the compute stood waiting for this collective's result: not compute in ddptui's figures"
            elif kind in (FWD, BWD):
                lname = self._lname(idx)
                name = ("forward " if kind == FWD else "backward ") + lname
                args["layer"] = lname
            elif kind == COMM:
                if buckets is not None:
                    params, nbytes = buckets.get(idx, [[], 0])
                    name = f"allreduce bucket {idx}"
                    args["bucket"] = idx
                    args["params"] = [self._pname(p) for p in params]
                    args["layer"] = sorted({self._lname(self.param_layer[p]) for p in params
                                            if 0 <= p < len(self.param_layer)})
                    args["bytes"] = nbytes
                else:
                    pname = self._pname(idx)
                    name = f"allreduce {pname}"
                    args["param"] = pname
                    if 0 <= idx < len(self.param_layer):
                        args["layer"] = self._lname(self.param_layer[idx])
                    args["bytes"] = self.param_bytes[idx] if 0 <= idx < len(self.param_bytes) else 0
                if iss is not None:
                    args["queued_us"] = max(0, a - iss) / 1000
                if iss is not None and last is not None:  # who waits for whom (ddptui.model.stragglers)
                    last_ready = last[0] - self.origin
                    args["last_arriver"] = last[1]
                    args["wait_us"] = max(0, last_ready - iss) / 1000
                    args["transfer_us"] = max(0, z - max(a, last_ready)) / 1000
            elif kind == COLL:
                name = self._coll(s, r, idx, args)
                if iss is not None:
                    args["queued_us"] = max(0, a - iss) / 1000
                if iss is not None and last is not None:
                    last_ready = last[0] - self.origin
                    args["last_arriver"] = last[1]
                    args["wait_us"] = max(0, last_ready - iss) / 1000
                    args["transfer_us"] = max(0, z - max(a, last_ready)) / 1000
            elif kind == OPT:
                name = "optimizer"
            elif kind == PASS:  # a step whose layers were not marked (sampled)
                name = PASS_NAMES[idx & 1] + " (layers not marked)"
                args["layers"] = "not marked (layer marks on a sample of steps)"
            elif kind == OTHER:
                name = "other (no synchronisation: evaluation)"
                args["kind"] = "other"
            elif kind == MB:
                stage, mb, part = mb_of(idx)
                name = f"{MB_PARTS[part]}{mb}"
                args.update(stage=stage, microbatch=mb, part=MB_PART_NAMES[part])
            elif kind == PIPE:
                name = "schedule step"
                args["kind"] = "pipeline schedule step()"
            else:
                name = f"{s} step {k}"
            sub = self._sublane(r, lane, a, z)
            tid = self._name_thread(r, lane, sub)
            self.emit({"name": name, "cat": lane, "ph": "X", "ts": a / 1000, "dur": (z - a) / 1000,
                       "pid": pid_of(r), "tid": tid, "args": args})
            self.slices += 1
            self.per_lane[(r, lane)] = self.per_lane.get((r, lane), 0) + 1
            self.last_ts[r] = max(self.last_ts.get(r, 0), a)


def run_meta(got, store) -> dict:
    """The recording's header, completed by what the ranks' hello frames said (the Store's
    RunInfo): a user's script under `ddptui run` writes a header without layer or parameter
    names; rank 0's hello has them, and the exports name layers as the JSON and the UI do."""
    meta = dict(got.meta)
    for k, v in store.meta.as_dict().items():
        if meta.get(k) in (None, "", [], {}):
            meta[k] = v
    return meta


def export(path: str, out_path: str) -> tuple[TraceWriter, object]:
    """Export `path` to `out_path` ('-' = stdout). Raises RecordingError for a bad file."""
    scan = Scan()
    got = load(path, store=scan.store, on_frame=scan)  # pass 1: validates everything into the Store
    if got.span_frames == 0:
        raise RecordingError(f"{path}: no spans in this recording; nothing to export")
    r = open_reader(path)
    tmp = None
    try:
        if out_path == "-":
            fobj = sys.stdout
        else:
            d = os.path.dirname(os.path.abspath(out_path))
            fd, tmp = tempfile.mkstemp(prefix=".ddptui-export-", suffix=".tmp", dir=d)
            fobj = os.fdopen(fd, "w", encoding="utf-8")
        w = TraceWriter(fobj, run_meta(got, scan.store), scan)
        w.begin()
        skip = set(got.rejected)
        for n, (_body, frame) in enumerate(r):  # pass 2: the frames pass 1 took
            if n >= got.frames:
                break
            if n not in skip:
                w.frame(frame)
        w.finish({"recording": os.path.basename(path), "damage": got.damage,
                  "skipped_frames": len(got.rejected), "frames": got.frames, "spans": got.spans,
                  **({"clock_offsets": co} if (co := scan.clocks.offsets(got.meta.get("host"))) else {})})
        if tmp is not None:
            fobj.close()
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a trace is an ordinary file
            os.replace(tmp, out_path)
            tmp = None
        else:
            fobj.flush()
    finally:
        r.close()
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return w, got
