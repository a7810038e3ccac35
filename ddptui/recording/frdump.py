"""PyTorch Flight Recorder dumps read as a ddptui recording: a directory of one dump per rank,
as the NCCL watchdog writes them on a timeout (pickle, to `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`
+ rank: ``nccl_trace_rank_0``, ...), or their JSON form (`_dump_fr_trace_json`, the debug
server's ``fr_trace_json``; ``....json``).

`recording.rankset.open_reader(DIR)` is an FrDumpReader when DIR holds such dumps (and no
``rank<r>.ddptui``), so summary, replay and export read them through the same Feed into the
same Store as a recording. A file is a dump when its name ends in its rank (the digits
fr_trace reads) and it reads as a pickle or as JSON with `entries` (the first bytes tell),
or is named as NCCL names them; of several name prefixes, the one most files have. Each is
read whole (at most MAX_BYTES), a pickle by ranks/core/flightrec's plain-data unpickler (a
dump crafted to run code runs nothing and is refused); a file that cannot be read is said in
a line (`damage`, `unreadable`), the others are read. None readable: RecordingError.

What becomes what (strategy ``ddp``, as a torch.profiler trace's; times: the hosts' wall
clocks, so every rank is on one axis, from the first collective's creation): each rank a lane, each entry a COLL span of its
rank's collectives table (op, bytes: the larger of its inputs and outputs, group size, and,
as its "layer", its process group: the lanes say 'AR group 1', the groups are the run's
layers). It is drawn from its creation (`time_created_ns`: issued), started where the
backend records it (NCCL's watchdog, `time_discovered_started_ns`), to its end
(`time_discovered_completed_ns`, or its start plus `duration_ms`); a collective still in
flight, to the dump's moment (its file's time: model/frverdict.RankDump.moment; not known, the
latest time of any dump); one that ended by an error, to its timeout; one that ended where the
backend records no times (gloo), a moment. Steps:
the collectives (every rank's entries of one group's sequence number are one) in the order
they were first issued, cut into the job's own steps where they repeat (`job_steps`; else
STEP_COLLS a step), and the ones from the first that went wrong
(in flight, or at a group's first disagreement) on in a last step of their own: the hang.
The verdict (model/frverdict.py) is the header's ``flight_recorder`` (summary's text and
JSON, the replay's headline) and the recording's first status lines.
"""
from __future__ import annotations

import os
import re
from collections import Counter

import msgspec

from ranks import frames, spec, wire
from ranks.core.flightrec import DumpError, load_dump
from ranks.recfile import RecordingError

from ddptui.model import frverdict
from ddptui.model.runinfo import FLIGHT_RECORDER
from .kineto import coll_op

STRATEGY = spec.USER_STRATEGY
MODEL = FLIGHT_RECORDER
MAX_BYTES = 1 << 30  # a dump larger than this is not read (a 2,000-entry buffer: a few MB)
STEP_COLLS = 32  # collectives a step (the last step, the hang's: all from the first that went wrong)
MAX_SPAN_NS = 4_000 * 1_000_000_000  # a span's length at most (spans are µs in 32 bits)
_DUMP_NAME = re.compile(r"(.*?)(\d+)(\.json|\.pkl|\.pickle)?")
_NCCL_NAME = re.compile(r".*nccl_trace_rank_\d+(\.json)?")
SNIFF = 1 << 16


def _sniff(path: str) -> bool:
    """Whether a file's first bytes read as a pickle (protocol 2 to 5) or as JSON with entries."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF)
    except OSError:
        return False
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return True
    text = head.lstrip()
    return text[:1] == b"{" and b'"entries"' in text and b'"traceEvents"' not in text


def job_steps(keys: list, sig, when, limit: int = STEP_COLLS, hold_tail: bool = False) -> tuple[list, list]:
    """Collectives' keys in the order they were issued, cut into the job's own steps:
    (steps, held). A training job issues the same collectives every step (DDP's buckets, FSDP's
    gathers and scatters, a tensor-parallel layer's): where the run's last ones repeat with a
    period of p (p at most `limit`, seen at least twice: `sig(key)` the op, group and bytes),
    each p of them in turn is a step, cut where the time between two (`when(key)`: first issued)
    is longest across the repetitions (the forward and the optimizer lie between steps; a
    step's collectives come close together in its backward). What comes before the repeating
    part, and a run with no period, are cut `limit` a step. `hold_tail`: a last step not yet
    whole (fewer than p of its collectives so far) is held, not cut (returned in `held`: the
    next poll draws it whole)."""
    n = len(keys)
    if n == 0:
        return [], []
    s = [sig(k) for k in keys]
    period = None
    for p in range(1, min(limit, n // 2) + 1):
        # the tail periodic over its last four periods (at least two: n >= 2p)
        span = min(n, 4 * p)
        if all(s[i] == s[i + p] for i in range(n - span, n - p)):
            period = p
            break
    if period is None:
        return [keys[i:i + limit] for i in range(0, n, limit)], []
    p = period
    start = n - p  # the periodic region: as far back as the pattern holds
    while start - 1 >= 0 and s[start - 1] == s[start - 1 + p]:
        start -= 1
    # the phase: the boundary offset (within the region) whose gaps before it are longest
    t = [when(k) or 0 for k in keys]
    best, phase = -1, start
    for o in range(start, min(start + p, n)):
        gap = sum(t[i] - t[i - 1] for i in range(o, n, p) if i > 0)
        if gap > best:
            best, phase = gap, o
    steps = [keys[i:min(i + limit, phase)] for i in range(0, phase, limit)]
    i = phase
    while i + p <= n:
        steps.append(keys[i:i + p])
        i += p
    held = keys[i:]
    if held and not hold_tail:
        steps.append(held)
        held = []
    return steps, held


class DumpFiles:
    """A directory's dumps: rank -> file, their common prefix, the files of other prefixes."""

    def __init__(self, path: str, prefix: str, files: dict[int, list[str]], others: list[str]):
        self.path, self.prefix, self.files, self.others = path, prefix, files, others


def dump_files(path: str) -> DumpFiles | None:
    """The Flight Recorder dumps of a directory (module docstring), or None when it holds none."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    by_prefix: dict[str, dict[int, list[str]]] = {}
    sniffed: Counter = Counter()
    for n in names:
        m = _DUMP_NAME.fullmatch(n)
        full = os.path.join(path, n)
        if m is None or n.endswith(".ddptui") or not os.path.isfile(full):
            continue
        looks = _sniff(full)
        if not looks and not _NCCL_NAME.fullmatch(n):
            continue
        sniffed[m.group(1)] += 1
        by_prefix.setdefault(m.group(1), {}).setdefault(int(m.group(2)), []).append(n)
    if not sniffed:
        return None
    prefix = max(sniffed, key=lambda p: (sniffed[p], p))
    others = sorted(n for p, got in by_prefix.items() if p != prefix for ns in got.values() for n in ns)
    return DumpFiles(path, prefix, by_prefix[prefix], others)


def read_dump(path: str) -> dict:
    """A dump file as plain data: JSON, or a pickle read by the plain-data unpickler.
    DumpError with the reason in a phrase."""
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise DumpError(f"{size / 1e9:.1f} GB: larger than a Flight Recorder dump ({MAX_BYTES >> 30} GB at most)")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DumpError(f"cannot read ({e.strerror or e})") from None
    if not raw:
        raise DumpError("empty file")
    if raw.lstrip()[:1] == b"{":
        try:
            d = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise DumpError(f"not readable JSON ({str(e).splitlines()[0][:120]})") from None
        if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
            raise DumpError("JSON, but not a Flight Recorder dump (no 'entries' list)")
        return d
    return load_dump(raw)


def _instances(dumps: dict[int, frverdict.RankDump]) -> list[tuple[int, tuple]]:
    """Every collective once (all ranks' entries of one group's number), by when it was first
    issued: [(time, key)]."""
    first: dict[tuple, int] = {}
    for d in dumps.values():
        for e in d.entries:
            key = (e.group, e.p2p, e.seq)
            t = e.created_ns or 0
            if key not in first or t < first[key]:
                first[key] = t
    return sorted((t, k) for k, t in first.items())


class FrDumpReader:
    """A directory of per-rank Flight Recorder dumps read as one recording (Reader's interface:
    path, name, meta, damage, frames; iterating yields (body, frame) like a Reader's)."""

    def __init__(self, path: str, chunk: int = 0):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.damage: str | None = None
        self.frames = 0
        found = dump_files(path)
        if found is None:
            raise RecordingError(f"{path}: no Flight Recorder dumps (files named <prefix><rank>)")
        self.unreadable: dict[int, str] = {}  # rank -> 'file: why'
        self.notes: list[str] = []
        dumps: dict[int, frverdict.RankDump] = {}
        for r, names in sorted(found.files.items()):
            if len(names) > 1:
                self.notes.append(f"rank {r}: {len(names)} dumps ({', '.join(names)}); {names[0]} read")
            f = os.path.join(path, names[0])
            if r > frames.MAX_RANK:
                self.unreadable[r] = f"{names[0]}: rank {r} is beyond {frames.MAX_RANK}"
                continue
            try:
                dumps[r] = frverdict.rank_dump(read_dump(f), r, _mtime_ns(f))
            except (DumpError, frverdict.DumpFormatError) as e:
                self.unreadable[r] = f"{names[0]}: {e}"
        if found.others:
            self.notes.append(f"other files not read as dumps of this job (another prefix than "
                              f"{found.prefix!r}): {', '.join(found.others[:4])}" + (" ..." if len(found.others) > 4 else ""))
        if not dumps:
            raise RecordingError(f"{path}: no readable Flight Recorder dump (" + "; ".join(self.unreadable.values()) + ")")
        if not any(d.entries for d in dumps.values()):
            raise RecordingError(f"{path}: the dumps hold no collective (was the Flight Recorder on? "
                                 f"TORCH_FR_BUFFER_SIZE, e.g. 2000, before the job starts)")
        self.dumps = dumps
        self.verdict = frverdict.verdict(dumps, no_dump={r: w.split(": ", 1)[-1] for r, w in self.unreadable.items()
                                                         if r <= frames.MAX_RANK})
        self.world = min(self.verdict.world, frames.MAX_RANK + 1)
        self.damage = "; ".join(self.unreadable.values()) or None
        self.groups = self.verdict.groups
        self.group_index = {g.name: i for i, g in enumerate(self.groups)}
        self.layers = [g.label[:64] for g in self.groups]
        backends = Counter(d.backend for d in dumps.values() if d.backend)
        self.backend = backends.most_common(1)[0][0] if backends else ""
        gpu = self.backend not in frverdict.NO_STATE_BACKENDS and self.backend != ""
        doc = self.verdict.doc()
        # (times from the first collective's creation: the hosts' wall clocks, in ns since the
        # epoch, would read as a start-up of decades to the replay)
        origin = min((e.created_ns for d in dumps.values() for e in d.entries if e.created_ns), default=0)
        doc.update(time_origin_ns=origin, prefix=found.prefix, backend=self.backend, notes=self.notes,
                   unreadable={str(r): w for r, w in sorted(self.unreadable.items())},
                   dumps={str(r): {"file": found.files[r][0], "version": d.version, "entries": len(d.entries),
                                   "p2p_entries": sum(1 for e in d.entries if e.p2p),
                                   "skipped_entries": d.skipped, "first_record": d.entries[0].record_id if d.entries else None}
                          for r, d in sorted(dumps.items())})
        self.meta = {"ddptui": "0.1.0", "model": MODEL, "strategies": [STRATEGY], "world": self.world,
                     "layers": self.layers, "params": [], "steps": 0, "batch": 0, "backend": self.backend,
                     "user": True, "source": "flight-recorder", "device": "cuda" if gpu else "cpu",
                     "devices": {str(r): ("cuda" if gpu else "cpu") for r in range(self.world)},
                     "flight_recorder": doc}

    # -- spans ---------------------------------------------------------------------------
    def _steps(self) -> list[list[tuple]]:
        """The collectives' keys, step by step (module docstring)."""
        inst = _instances(self.dumps)
        flying, _ = self.verdict.states()
        bad = {(e.group, e.p2p, e.seq) for d in self.dumps.values() for e in d.entries if id(e) in flying}
        for g in self.groups:
            if g.first is not None:
                bad.add((g.name, False, g.first.seq))
        cut = next((i for i, (_, k) in enumerate(inst) if k in bad), len(inst))
        sigs: dict[tuple, tuple] = {}
        for d in self.dumps.values():
            for e in d.entries:
                sigs.setdefault((e.group, e.p2p, e.seq), (e.group, e.p2p, e.op, e.in_sizes, e.in_dtypes))
        when = {k: t for t, k in inst}
        steps, _ = job_steps([k for _, k in inst[:cut]], sigs.get, when.get, STEP_COLLS)
        if cut < len(inst):
            steps.append([k for _, k in inst[cut:]])
        return steps

    def _frames(self):
        world, layers = self.world, self.layers
        yield frames.Status(text=f"Flight Recorder dumps of {len(self.dumps)} rank(s) in {self.name}: "
                                 f"{self.verdict.headline()}"[:4000], level="error" if self.verdict.lead() else "info")
        for line in self.verdict.lines()[1:] + self.notes:
            yield frames.Status(text=line[:4000], level="info")
        for r in range(world):
            note = "" if r in self.dumps else f"no readable Flight Recorder dump ({self.verdict.no_dump.get(r, '?')})"
            yield frames.Hello(rank=r, world=world, device=self.meta["devices"][str(r)], backend=self.backend[:16],
                               model=MODEL, layers=layers, params=[], strategies=[STRATEGY], steps=0, note=note[:4000])
            yield frames.Phase(rank=r, phase="dumped" if r in self.dumps else "no dump")
        flying, failed = self.verdict.states()
        size = {g.name: max(1, min(len(g.ranks), world)) for g in self.groups}
        # a collective in flight: to its rank's dump, or, where its moment is not known, to the
        # latest time of any dump (every dump was written after it)
        latest = max((t for d in self.dumps.values() if (t := d.latest_ns()) is not None), default=0)
        moments = {r: d.moment() for r, d in self.dumps.items()}
        origin = self.meta["flight_recorder"]["time_origin_ns"]
        by_key: dict[int, dict[tuple, list]] = {r: {} for r in self.dumps}
        for r, d in self.dumps.items():
            for e in d.entries:
                by_key[r].setdefault((e.group, e.p2p, e.seq), []).append(e)
        tables: dict[int, dict] = {r: {} for r in range(world)}
        for k, keys in enumerate(self._steps()):
            per: dict[int, list] = {}
            for r, d in self.dumps.items():
                got = []
                for key in keys:
                    for e in by_key[r].get(key, ()):
                        gi = self.group_index[e.group]
                        row = coll_row(e, size.get(e.group, world), layers[gi], gi)
                        if row is None:
                            continue
                        got.append((row, *(t - origin for t in span_of(e, flying, failed, moments[r], latest))))
                per[r] = got
            yield from step_frames(k, world, tables, per)

    def __iter__(self):
        for f in self._frames():  # checked as a recording's are: decoded from their bodies
            self.frames += 1
            body = frames.encode(f)
            yield body, frames.decode_or_invalid(body)

    def close(self) -> None:
        pass


def step_frames(k: int, world: int, tables: dict, per: dict) -> list:
    """One step's frames: per rank, its collectives-table rows not sent yet (`tables`, rank ->
    row -> id, grown here), then its spans (a STEP over every rank's collectives, a COLL each);
    `per`: rank -> [(row, issue, start, end)]. None where no rank has a collective."""
    spans = [s for got in per.values() for s in got]
    if not spans:
        return []
    s0 = min(s[1] for s in spans)
    s1 = max(s[3] for s in spans)
    out: list = []
    for r in range(world):
        table, new = tables[r], []
        sp = [(wire.STEP, 0, s0, s1, 0)]
        for row, iss, t0, t1 in per.get(r, ()):
            rid = table.get(row)
            if rid is None:
                if len(table) >= 0xFFFF:
                    continue
                rid = table[row] = len(table)
                new.append((rid, *row))
            sp.append((wire.COLL, rid, t0, t1, iss))
        if new:
            out.append(frames.Colls(rank=r, strategy=STRATEGY, rows=new))
        sp.sort(key=lambda x: (x[2], x[0]))
        base = min(x[4] if x[0] == wire.COLL else x[2] for x in sp)
        out.append(frames.spans_frame(r, STRATEGY, k, base, [x[0] for x in sp], [x[1] for x in sp],
                                      [x[2] for x in sp], [x[3] for x in sp],
                                      [x[4] for x in sp if x[0] in wire.COMM_KINDS]))
    return out


def coll_row(e: frverdict.FrEntry, size: int, label: str, index: int) -> tuple | None:
    """An entry's row of its rank's collectives table, less its id (op, bytes, group size,
    its group's label and index as its "layer", phase, async), or None: a coalesced group's
    closing entry, an op of no known kind, no creation time."""
    op = coll_op(e.op)
    if op is None or e.created_ns is None:
        return None
    return (op, 0 if op == "barrier" else e.nbytes, size, label, index, "step", True)


def span_of(e: frverdict.FrEntry, flying: set, failed: set, moment: int | None, latest: int) -> tuple[int, int, int]:
    """(issued, start, end) of an entry, ns (module docstring); flying, failed: the ids of the
    entries in flight and ended by an error (Verdict.states); moment: its dump's, if known."""
    iss = e.created_ns or 0
    t0 = max(iss, e.started_ns or iss)
    if e.completed_ns:
        t1 = max(t0, e.completed_ns)
    elif e.duration_ms is not None and id(e) not in flying and id(e) not in failed:
        t1 = t0 + int(e.duration_ms * 1e6)
    elif id(e) in failed and e.timeout_ms:  # (ended by its timeout)
        t1 = iss + e.timeout_ms * 1_000_000
        t1 = t1 if moment is None else min(moment, t1)
    elif id(e) in flying or id(e) in failed:
        t1 = moment if moment is not None else latest
    else:
        t1 = t0
    return iss, t0, max(t0, min(t1, t0 + MAX_SPAN_NS))


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
