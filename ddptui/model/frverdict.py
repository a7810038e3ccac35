"""A hang named from PyTorch's Flight Recorder dumps: for each process group, the first
collective its ranks disagree on, and where each rank is.

A dump (one per rank, plain data: ranks/core/flightrec.load_dump, or its JSON form) holds a
ring buffer of `entries`, every collective of every process group the rank issued (its group
`process_group` (name, description), its `collective_seq_id` in that group, `profiling_name`
such as "nccl:all_reduce", sizes and dtypes, `state`, times), and `pg_status` (per group id:
the last collective enqueued, started, completed), `pg_config` (per group: its ranks; gloo
leaves it empty) and its `version`. `rank_dump` reads one, tolerant of the format versions
torch 2.11 to 2.15 write (fields missing, numbers as text in the JSON form).

`verdict(dumps, world)` then, per group (its ranks from pg_config, else the ranks whose dumps
name it, the default group: every rank), walks its sequence numbers upward and stops at the
first one where its ranks disagree, as PyTorch's analyzer (`fr_trace`) does: the ranks that
never issued it (their last collective of the group is before it), the ranks that issued
another op, other sizes (inputs, except an all_to_all's or a scatter's; outputs, except an
all_to_all's or a gather's) or other dtypes, and last, the ranks whose entry is in another
state. The reference is what most ranks issued (a tie: the lowest rank's). A rank whose
buffer wrapped before a sequence number knows nothing of it (never counted as missing).
Each rank's last completed collective and the ones in flight are said beside it; an entry
"completed" is one its state says so, or, where the backend keeps no state (gloo: every entry
"scheduled"), one it retired or pg_status counts as completed: a collective that ended
without all its group's ranks having issued it ended by an error (gloo: its timeout). gloo's
pg_status counts every op by its op_id (sends and recvs too), NCCL's a send or recv by its
p2p_seq_id: both read as the collectives' numbers (`_status_seq`).

Point-to-point entries (send, recv; NCCL names them 'send 0->1' and 'recv 1<-0', by the ranks'
places in the group) are paired per group as fr_trace's `match_one_event` pairs them, but not
by number: p2p_seq_id counts a group's sends and recvs together, every peer's. For each
(src, dst), src's sends to dst and dst's recvs from src are paired in the order each rank
issued them (where a buffer wrapped, from the last that ended on both sides); the first that
does not match is the pair's issue (`P2PIssue`): a recv that no send answers (`no_send`), a
send that no recv answers (`no_recv`), or a send and its recv of other sizes or dtypes. Where
the rank that never answered itself waits in a send or recv no one answers, the issue is
behind another (a stuck stage stops every stage after it); the root is said first, with what
that rank is doing (a cycle of ranks waiting on each other: said). `Verdict.lead()` picks what
the headline names: the point-to-point issue where it is a mismatch or where the ranks that
never issued the group's first disagreeing collective wait in one, else the collective.

Pure: plain data in, a `Verdict` out (`doc()` for JSON, `lines()` and `headline()` for text).
"""
from __future__ import annotations

from collections import Counter

import msgspec
from dataclasses import dataclass, field

from ranks.core.flightrec import entry_bytes

DEFAULT_DESC = "default_pg"
NO_STATE_BACKENDS = ("gloo",)  # backends whose entries stay "scheduled" (no start or end seen)
SHOWN = 8  # ranks named in a line before "and N more"
DUMP_SLACK_NS = 60 * 1_000_000_000  # a dump's file written this long after its timeout: still its moment


class DumpFormatError(ValueError):
    """Plain data that is not a Flight Recorder dump (no entries list, entries of no shape)."""


@dataclass(frozen=True)
class FrEntry:
    """One entry of a rank's buffer, as read (times: the host's wall clock, ns)."""
    rank: int
    record_id: int
    group: str  # the process group's name (`process_group`[0])
    desc: str  # its description ("default_pg", "undefined", a user's)
    pg_id: int | None
    seq: int  # collective_seq_id; a point-to-point entry's: p2p_seq_id
    p2p: bool
    op: str  # "all_reduce", "send 0->1": profiling_name less its backend
    backend: str  # "nccl", "gloo", ...
    in_sizes: tuple = ()
    in_dtypes: tuple = ()
    out_sizes: tuple = ()
    out_dtypes: tuple = ()
    state: str = ""  # "scheduled", "started", "completed" as recorded
    retired: bool | None = None
    created_ns: int | None = None
    started_ns: int | None = None  # as the watchdog discovered it (it polls)
    completed_ns: int | None = None
    duration_ms: float | None = None  # the GPU's time (TORCH_NCCL_ENABLE_TIMING)
    timeout_ms: int | None = None
    where: str = ""  # the innermost frame outside torch.distributed: "train.py:42 (step)"
    op_id: int | None = None  # the group's count of every op (gloo: pg_status counts by it)
    coll_seq: int | None = None  # a point-to-point entry's collective_seq_id: the collectives before it

    @property
    def name(self) -> str:
        """'all_reduce #4'."""
        return f"{self.op} #{self.seq}"

    @property
    def nbytes(self) -> int:
        """The larger of its inputs' and outputs' bytes (an all-gather's gathered output)."""
        return max(entry_bytes({"input_sizes": self.in_sizes, "input_dtypes": self.in_dtypes}),
                   entry_bytes({"input_sizes": self.out_sizes, "input_dtypes": self.out_dtypes}))


@dataclass
class RankDump:
    """One rank's dump, read: its entries by record_id, what it says of its groups."""
    rank: int
    version: str = ""
    entries: list[FrEntry] = field(default_factory=list)
    group_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg_config's, where given
    group_desc: dict[str, str] = field(default_factory=dict)
    status: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # group -> (enqueued, started, completed)
    skipped: int = 0  # entries of no readable shape
    dumped_ns: int | None = None  # when the dump was written (its file's time), if known
    cut: int | None = None  # only its entries from this record_id on were read (rank_dump_json's tail)

    @property
    def wrapped(self) -> bool:
        """The buffer wrapped: its first entries are gone (the first record_id is not 0)."""
        return bool(self.entries) and self.entries[0].record_id > 0

    @property
    def backend(self) -> str:
        got = Counter(e.backend for e in self.entries)
        return got.most_common(1)[0][0] if got else ""

    def latest_ns(self) -> int | None:
        """The latest time its entries hold."""
        got = [t for e in self.entries for t in (e.created_ns, e.started_ns, e.completed_ns) if t]
        return max(got, default=None)

    def moment(self) -> int | None:
        """When the dump was written, where that can be told: its file's time, when at or after
        its latest entry and within its longest timeout (and a minute) of it (a file copied
        later, or checked out, has a later time); else None."""
        latest = self.latest_ns()
        if latest is None or self.dumped_ns is None:
            return None
        slack = max([e.timeout_ms or 0 for e in self.entries] + [0]) * 1_000_000 + DUMP_SLACK_NS
        return self.dumped_ns if latest <= self.dumped_ns <= latest + slack else None

    def done(self, e: FrEntry) -> bool:
        """Whether an entry ended (module docstring: state, else retired or pg_status)."""
        if e.state == "completed":
            return True
        if e.state == "started" or e.backend not in NO_STATE_BACKENDS and e.state:
            return False
        st = self.status.get(e.group)
        return bool(e.retired) or (not e.p2p and st is not None and e.seq <= st[2])


def _int(v, default=None):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return default
    return default


def _float(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def _sizes(v) -> tuple:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple(tuple(x for x in (_int(d, 0) for d in s)) if isinstance(s, (list, tuple)) else ()
                 for s in v)


def _strs(v) -> tuple:
    return tuple(str(x) for x in v) if isinstance(v, (list, tuple)) else ()


def _ranks_of(v) -> tuple[int, ...]:
    """pg_config's `ranks`: '[0, 1]' (text), or a list."""
    if isinstance(v, str):
        v = [x for x in v.strip().strip("[]").replace(",", " ").split() if x]
    if not isinstance(v, (list, tuple)):
        return ()
    got = [_int(x) for x in v]
    return tuple(sorted({x for x in got if x is not None and x >= 0}))


def _where(frames) -> str:
    """The innermost frame outside torch.distributed (the caller's code): 'train.py:42 (step)'."""
    if not isinstance(frames, (list, tuple)):
        return ""
    for f in frames:
        if not isinstance(f, dict):
            continue
        path = str(f.get("filename") or "")
        if "torch/distributed/" in path or "c10d_logger" in path or path.endswith("typing_extensions.py"):
            continue
        base = path.rsplit("/", 1)[-1]
        return f"{base}:{_int(f.get('line'), '?')} ({f.get('name') or '?'})"[:200]
    return ""


def _entry(rank: int, e) -> FrEntry | None:
    if not isinstance(e, dict):
        return None
    name = e.get("profiling_name")
    if not isinstance(name, str) or not name:
        return None
    backend, _, op = name.partition(":")
    if not op:
        backend, op = "", backend
    pg = e.get("process_group")
    gname, desc = (str(pg[0]), str(pg[1])) if isinstance(pg, (list, tuple)) and len(pg) >= 2 else \
        (str(_int(e.get("pg_id"), "?")), "")
    p2p = e.get("is_p2p")
    p2p = bool(p2p) if isinstance(p2p, bool) else op.split(" ")[0] in ("send", "recv")
    seq = _int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id"))
    rid = _int(e.get("record_id"))
    if seq is None or rid is None:
        return None
    ret = e.get("retired")
    return FrEntry(rank=rank, record_id=rid, group=gname, desc=desc, pg_id=_int(e.get("pg_id")), seq=seq,
                   p2p=p2p, op=op.strip(), backend=backend.strip(), in_sizes=_sizes(e.get("input_sizes")),
                   in_dtypes=_strs(e.get("input_dtypes")), out_sizes=_sizes(e.get("output_sizes")),
                   out_dtypes=_strs(e.get("output_dtypes")), state=str(e.get("state") or ""),
                   retired=ret if isinstance(ret, bool) else None, created_ns=_int(e.get("time_created_ns")),
                   started_ns=_int(e.get("time_discovered_started_ns")),
                   completed_ns=_int(e.get("time_discovered_completed_ns")),
                   duration_ms=_float(e.get("duration_ms")), timeout_ms=_int(e.get("timeout_ms")),
                   where=_where(e.get("frames")), op_id=_int(e.get("op_id")),
                   coll_seq=_int(e.get("collective_seq_id")) if p2p else None)


# the fields of an entry that change while it is in the buffer (and what it is): an entry read
# before with the same values is the same FrEntry (rank_dump's `cache`)
_CHANGING = ("record_id", "state", "retired", "time_discovered_started_ns", "time_discovered_completed_ns",
             "duration_ms", "collective_seq_id", "p2p_seq_id", "profiling_name", "time_created_ns")


class _JEntry(msgspec.Struct, gc=False):
    """An entry of the JSON form as torch 2.11-2.15 write it, typed (rank_dump_json); a field of
    another type fails the whole decode, which then takes the tolerant path."""
    record_id: int
    profiling_name: str = ""
    process_group: tuple[str, str] | None = None
    pg_id: int | None = None
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op_id: int | None = None
    is_p2p: bool | None = None
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()
    state: str = ""
    retired: bool | None = None
    time_created_ns: int | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    duration_ms: float | None = None
    timeout_ms: int | None = None
    frames: list | None = None


class _JDump(msgspec.Struct, gc=False):
    entries: list[_JEntry] = []
    version: str | int | float | None = None
    pg_config: dict | None = None
    pg_status: dict | None = None


_JSON_DUMP = msgspec.json.Decoder(_JDump)


def _jentry(rank: int, e: _JEntry) -> FrEntry | None:
    """`_entry` of a typed entry (the same reading, without the tolerant conversions)."""
    name = e.profiling_name
    if not name:
        return None
    backend, _, op = name.partition(":")
    if not op:
        backend, op = "", backend
    pg = e.process_group
    gname, desc = pg if pg is not None else (str(e.pg_id if e.pg_id is not None else "?"), "")
    p2p = e.is_p2p if e.is_p2p is not None else op.split(" ")[0] in ("send", "recv")
    seq = e.p2p_seq_id if p2p else e.collective_seq_id
    if seq is None:
        return None
    return FrEntry(rank=rank, record_id=e.record_id, group=gname, desc=desc, pg_id=e.pg_id, seq=seq, p2p=p2p,
                   op=op.strip(), backend=backend.strip(), in_sizes=e.input_sizes, in_dtypes=e.input_dtypes,
                   out_sizes=e.output_sizes, out_dtypes=e.output_dtypes, state=e.state, retired=e.retired,
                   created_ns=e.time_created_ns, started_ns=e.time_discovered_started_ns,
                   completed_ns=e.time_discovered_completed_ns,
                   duration_ms=e.duration_ms if e.duration_ms == e.duration_ms else None,
                   timeout_ms=e.timeout_ms, where=_where(e.frames), op_id=e.op_id,
                   coll_seq=e.collective_seq_id if p2p else None)


# where an entry of the JSON form starts: its keys come sorted (torch writes them so), and
# collective_seq_id is the first of them in torch 2.11-2.15 (`_tail_body`)
_ENTRY_START = b'{"collective_seq_id":'
_ENTRIES_KEY = b'"entries":['


def _tail_body(body: bytes, n: int) -> bytes | None:
    """The dump's JSON with only its last `n` entries (the newest: torch writes them in
    record_id order), cut without decoding the others; None where it has no more than `n` or
    its entries do not start as `_ENTRY_START` says (the caller then reads the whole)."""
    arr = body.find(_ENTRIES_KEY)
    if arr < 0 or n <= 0:
        return None
    arr += len(_ENTRIES_KEY)
    pos = len(body)
    for _ in range(n):
        pos = body.rfind(_ENTRY_START, arr, pos)
        if pos < 0:
            return None
    if pos == arr or body[pos - 1:pos] != b",":  # (no more than n, or not between two entries)
        return None
    return body[:arr] + body[pos:]


def _open_behind(d: "_JDump") -> bool:
    """A group whose pg_status says a collective is in flight (enqueued past completed) where
    the tail may not reach back to it: that one is older than the tail (a rank stuck in a
    side group's collective while another group goes on), so the whole is read. gloo counts
    its ops there: the tail must hold the number after the last completed; NCCL's entries
    carry their state: the tail must hold one of the group's not completed (its numbers mix
    point-to-point and collective counts). A group the tail does not hold at all: the whole."""
    if not isinstance(d.pg_status, dict):
        return False
    lowest: dict[str, int] = {}  # gloo: pg_id -> the lowest op_id of its entries in the tail
    held: set[str] = set()  # pg_ids the tail holds
    flying: set[str] = set()  # pg_ids with an entry in the tail not completed (NCCL)
    for e in d.entries:
        if e.pg_id is None:
            continue
        k = str(e.pg_id)
        held.add(k)
        if e.profiling_name.startswith("gloo:"):
            if e.op_id is not None and (k not in lowest or e.op_id < lowest[k]):
                lowest[k] = e.op_id
        elif e.state != "completed":
            flying.add(k)
    for key, st in d.pg_status.items():
        if not isinstance(st, dict):
            continue
        enq, done = _int(st.get("last_enqueued_collective"), -1), _int(st.get("last_completed_collective"), -1)
        if enq is None or done is None or enq <= done:
            continue
        k = str(key)
        if k not in held:
            return True
        if k in lowest:
            if lowest[k] > done + 1:
                return True
        elif k not in flying:
            return True
    return False


def rank_dump_json(body: bytes, rank: int, dumped_ns: int | None = None, cache: dict | None = None,
                   tail: int | None = None, known: dict | None = None) -> RankDump:
    """`rank_dump` of a dump's JSON form (the debug server's ``fr_trace_json``), decoded straight
    into typed entries: an entry read at the last poll with the same state is not read again,
    a new one without a dict or a conversion a field (a poll's most work, `ddptui attach`).
    `tail`: only the newest `tail` entries are read, the others not even decoded (`RankDump.cut`
    says from which record_id; `ddptui attach` once it has read a whole buffer), where the JSON
    can be cut so (else the whole). JSON of another shape (older versions' numbers as text)
    takes `rank_dump`'s tolerant path; msgspec.DecodeError where it is not JSON at all.
    `known`: pg_id -> the rank's last entries of that group read before (a tail that holds
    none of a group's still reads its pg_status through them)."""
    cut = _tail_body(body, tail) if tail else None
    if cut is not None:
        try:
            d = _JSON_DUMP.decode(cut)
            if len(d.entries) != tail:
                raise ValueError("cut elsewhere than between entries")
            if _open_behind(d):
                raise ValueError("a collective in flight older than the tail")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            cut = None
    try:
        if cut is None:
            d = _JSON_DUMP.decode(body)
    except msgspec.ValidationError:
        raw = msgspec.json.decode(body)
        if isinstance(raw, dict) and "entries" not in raw:
            raw["entries"] = []  # (an empty buffer: the handler leaves the key out)
        return rank_dump(raw, rank, dumped_ns, cache)
    out = RankDump(rank=rank, version=str(d.version or ""), dumped_ns=dumped_ns)
    kept: dict = {}
    for e in d.entries:
        sig = (e.record_id, e.state, e.retired, e.time_discovered_started_ns, e.time_discovered_completed_ns,
               e.duration_ms, e.collective_seq_id, e.p2p_seq_id, e.profiling_name, e.time_created_ns)  # (_CHANGING)
        hit = cache.get(sig[0]) if cache is not None else None
        got = hit[1] if hit is not None and hit[0] == sig else _jentry(rank, e)
        if got is None:
            out.skipped += 1
            continue
        kept[sig[0]] = (sig, got)
        out.entries.append(got)
    if cache is not None:
        cache.clear()
        cache.update(kept)
    if d.entries and not out.entries:
        raise DumpFormatError(f"none of its {len(d.entries)} entries has a Flight Recorder entry's shape")
    out.entries.sort(key=lambda x: x.record_id)
    if cut is not None and d.entries:
        out.cut = min(e.record_id for e in d.entries)
    _groups(out, d.pg_config, d.pg_status, partial=cut is not None, known=known)
    return out


def rank_dump(raw, rank: int, dumped_ns: int | None = None, cache: dict | None = None) -> RankDump:
    """One rank's dump (plain data: the pickle's or the JSON's) read; DumpFormatError when it
    is not a Flight Recorder dump. Entries of no readable shape are skipped (counted).
    `cache` (a dict kept between reads of one rank's successive dumps, as `ddptui attach`
    polls them): an entry unchanged since the last read is not read again; the cache then
    holds this dump's entries only."""
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", None), list):
        raise DumpFormatError("not a Flight Recorder dump (no 'entries' list)")
    out = RankDump(rank=rank, version=str(raw.get("version") or ""), dumped_ns=dumped_ns)
    kept: dict = {}
    for e in raw["entries"]:
        if cache is not None and isinstance(e, dict):
            sig = tuple(e.get(k) for k in _CHANGING)
            try:
                hit = cache.get(sig[0])
            except TypeError:  # (a record_id of no hashable kind: read it, keep nothing)
                hit, sig = None, None
            got = hit[1] if hit is not None and hit[0] == sig else _entry(rank, e)
            if got is not None and sig is not None:
                kept[sig[0]] = (sig, got)
        else:
            got = _entry(rank, e)
        if got is None:
            out.skipped += 1
        else:
            out.entries.append(got)
    if cache is not None:
        cache.clear()
        cache.update(kept)
    if raw["entries"] and not out.entries:
        raise DumpFormatError(f"none of its {len(raw['entries'])} entries has a Flight Recorder entry's shape")
    out.entries.sort(key=lambda x: x.record_id)
    _groups(out, raw.get("pg_config"), raw.get("pg_status"))
    return out


def _groups(out: RankDump, cfg, st, partial: bool = False, known: dict | None = None) -> None:
    """A dump's pg_config and pg_status read into `out` (its entries read already). `partial`:
    only the buffer's newest entries were read; a group none of them holds has its status read
    through its entries read before (`known`: pg_id -> entries), else gets none but where it
    says nothing was ever issued in it (its numbers, NCCL's point-to-point ones among them,
    are read through the group's entries: without them, unknown rather than misread)."""
    known = known if partial and known else {}
    if isinstance(cfg, dict):
        for key, c in cfg.items():
            if not isinstance(c, dict):
                continue
            name = str(c.get("name") or key)
            ranks = _ranks_of(c.get("ranks"))
            if name and ranks:
                out.group_ranks[name] = ranks
            if name and c.get("desc"):
                out.group_desc[name] = str(c["desc"])
    names = {e.pg_id: e.group for e in out.entries if e.pg_id is not None}
    for pid, es in known.items():
        if es:
            names.setdefault(pid, es[0].group)
    if isinstance(st, dict):
        gloo = out.backend in NO_STATE_BACKENDS
        for key, s in st.items():
            if not isinstance(s, dict):
                continue
            k = _int(key)
            name = names.get(k, str(key))
            mine = [e for e in out.entries if e.group == name] or list(known.get(k, ()))
            if partial and not mine and any(_int(s.get(f), -1) >= 0 for f in (
                    "last_enqueued_collective", "last_started_collective", "last_completed_collective")):
                continue  # (nothing issued in it at all, -1: as it is)
            out.status[name] = tuple(_status_seq(mine, _int(s.get(f), -1), gloo, f.endswith("completed"))  # type: ignore[assignment]
                                     for f in ("last_enqueued_collective", "last_started_collective",
                                               "last_completed_collective"))


def _status_seq(mine: list[FrEntry], v: int, gloo: bool, completed: bool) -> int:
    """A number of pg_status as the group's collective sequence number. gloo counts there every
    op it enqueued by its op_id (sends and recvs count in it too, though gloo records none), so
    it is the collective whose op_id it is; NCCL counts a point-to-point op by its p2p_seq_id,
    so where no collective but a point-to-point op has that number, the collectives issued
    before it (its collective_seq_id). Unknown (no entry of that number): as it is."""
    if v < 0 or not mine:
        return v
    if gloo:
        colls = [e for e in mine if not e.p2p and e.op_id is not None]
        hit = [e for e in colls if e.op_id == v]
        if hit:
            return hit[-1].seq
        below = [e for e in colls if e.op_id < v]
        return below[-1].seq if below and any(e.op_id != e.seq for e in colls) else v
    if any(not e.p2p and e.seq == v for e in mine):  # (a collective of that number: it)
        return v
    hit = [e for e in mine if e.p2p and e.seq == v and e.coll_seq is not None]
    done = [e for e in hit if e.state == "completed"] if completed else []
    return (done or hit)[-1].coll_seq if hit else v


# -- the verdict -----------------------------------------------------------------------------
@dataclass
class RankAt:
    """Where one rank is in one group."""
    rank: int
    last_issued: int | None  # the group's last sequence number it issued (entries or pg_status)
    last_done: FrEntry | None  # its last collective of the group that completed
    in_flight: list[FrEntry] = field(default_factory=list)  # issued, not ended (point-to-point too)
    failed: list[FrEntry] = field(default_factory=list)  # ended without every rank of the group
    known_from: int = 1  # its buffer holds the group's sequence numbers from this one on


@dataclass
class Disagreement:
    """The first collective of a group its ranks disagree on."""
    seq: int
    ref: FrEntry  # what most ranks issued
    issued: list[int]
    agree: list[int] = field(default_factory=list)  # the ranks that issued `ref` as it is
    never: list[int] = field(default_factory=list)
    other_op: dict[int, FrEntry] = field(default_factory=dict)
    other_sizes: dict[int, FrEntry] = field(default_factory=dict)
    other_dtypes: dict[int, FrEntry] = field(default_factory=dict)
    other_state: dict[int, FrEntry] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)  # no dump, or its buffer wrapped past it

    @property
    def kinds(self) -> list[str]:
        """'never', 'op', 'sizes', 'dtypes', 'state': what disagrees."""
        return [k for k, v in (("never", self.never), ("op", self.other_op), ("sizes", self.other_sizes),
                               ("dtypes", self.other_dtypes), ("state", self.other_state)) if v]


@dataclass
class P2PIssue:
    """A send and its recv that do not match (module docstring): data from rank `src` to rank
    `dst` (global ranks) in one group."""
    kind: str  # "no_send" (a recv no send answers), "no_recv" (a send no recv answers), "sizes", "dtypes"
    src: int
    dst: int
    send: FrEntry | None
    recv: FrEntry | None
    index: int | None  # its place among the pair's transfers (1: the first), where both buffers hold them all
    sent: int  # src's sends to dst in its buffer
    posted: int  # dst's recvs from src in its buffer
    peer_at: str = ""  # what the rank that never answered is doing
    root: bool = True  # that rank waits in no unanswered send or recv itself
    cycle: list[int] = field(default_factory=list)  # ranks that wait on each other round (none sends)

    @property
    def waiting(self) -> int | None:
        """The rank whose send or recv waits for its peer (None: a mismatch, both issued)."""
        return self.dst if self.kind == "no_send" else self.src if self.kind == "no_recv" else None

    @property
    def culprit(self) -> int | None:
        """The rank that never issued its side."""
        return self.src if self.kind == "no_send" else self.dst if self.kind == "no_recv" else None

    @property
    def entry(self) -> FrEntry:
        """The entry issued: the recv that waits, the send that waits, or the send."""
        return self.recv if self.kind == "no_send" else self.send  # type: ignore[return-value]

    @property
    def pair(self) -> str:
        return f"{self.src}->{self.dst}"


@dataclass
class GroupVerdict:
    """One process group: its ranks, its first disagreement (None: none), where each rank is."""
    name: str
    desc: str
    ranks: list[int]
    ranks_from: str  # "pg_config", "world" (the default group), "entries" (whose dumps name it)
    first: Disagreement | None
    at: dict[int, RankAt]
    last_agreed: int | None  # the last sequence number every rank issued alike, before `first`
    no_dump: list[int] = field(default_factory=list)
    ends: dict[int, int | None] = field(default_factory=dict)  # rank -> its dump's moment (RankDump.moment)
    p2p: list[P2PIssue] = field(default_factory=list)  # its sends and recvs that do not match, the root first
    p2p_pairs: int = 0  # (src, dst) pairs with a send or recv in the buffers
    p2p_matched: int = 0  # sends matched with their recvs

    @property
    def label(self) -> str:
        """'default_pg', 'group 1', 'tp (group 3)'."""
        if self.desc == DEFAULT_DESC:
            return DEFAULT_DESC
        if self.desc and self.desc != "undefined":
            return f"{self.desc} (group {self.name})"
        return f"group {self.name}"

    @property
    def in_flight(self) -> dict[int, list[FrEntry]]:
        return {r: a.in_flight for r, a in self.at.items() if a.in_flight}


@dataclass
class Verdict:
    """A job's dumps judged: every group's verdict (the default group first), what was missing."""
    groups: list[GroupVerdict]
    ranks: list[int]  # the ranks with a dump
    world: int
    no_dump: dict[int, str] = field(default_factory=dict)  # rank -> why (unreadable, absent)
    empty: list[int] = field(default_factory=list)  # ranks whose dump holds no entry
    wrapped: list[int] = field(default_factory=list)

    def states(self) -> tuple[set[int], set[int]]:
        """The ids (id()) of the entries in flight and of those that ended by an error."""
        flying = {id(e) for g in self.groups for a in g.at.values() for e in a.in_flight}
        failed = {id(e) for g in self.groups for a in g.at.values() for e in a.failed}
        return flying, failed

    def culprit(self) -> GroupVerdict | None:
        """The group whose first disagreement came first (its reference entry created first)."""
        bad = [g for g in self.groups if g.first is not None]
        return min(bad, key=lambda g: (g.first.ref.created_ns or 0, g.name)) if bad else None

    def p2p_first(self) -> tuple[GroupVerdict, P2PIssue] | None:
        """The send or recv that does not match to say first, and its group (mismatches, then
        the root of the waits: _p2p_order)."""
        got = [(g, i) for g in self.groups for i in g.p2p[:1]]
        return min(got, key=lambda x: _p2p_order(x[1])) if got else None

    def lead(self) -> tuple[str, GroupVerdict] | None:
        """What the headline names: ("collective", group) or ("p2p", group). Of both, the
        point-to-point one where it is a mismatch, or where a rank that never issued the
        collective (or issued another) waits in a send or recv no one answers: it is why."""
        g, p = self.culprit(), self.p2p_first()
        if p is None:
            return ("collective", g) if g is not None else None
        if g is None or p[1].culprit is None:
            return "p2p", p[0]
        waiting = {i.waiting for x in self.groups for i in x.p2p}
        return ("p2p", p[0]) if waiting & (set(g.first.never) | set(g.first.other_op)) else ("collective", g)

    def headline(self) -> str:
        """The verdict in a sentence."""
        lead = self.lead()
        if lead is not None and lead[0] == "p2p":
            g = lead[1]
            return f"{g.label} {_ranks_text(g.ranks, 'ranks')}: point-to-point: {_p2p_text(g.p2p[0])}"
        g = lead[1] if lead is not None else None
        if g is not None:
            return f"{g.label} {_ranks_text(g.ranks, 'ranks')}: {_disagreement(g.first)}"
        # ranks whose dump could not be read: what holds for the others may not for them
        unknown = sorted(set(self.no_dump) | {r for g in self.groups for r in g.no_dump})
        blind = f"; {_ranks_text(unknown)}: no readable dump, its state unknown" if unknown else ""
        hung = [g for g in self.groups if g.in_flight]
        if hung:
            g = hung[0]
            firsts = {r: es[0] for r, es in g.in_flight.items()}
            seqs = sorted({e.seq for e in firsts.values()})
            e = min(firsts.values(), key=lambda x: x.seq)
            who = _ranks_text(sorted(firsts))
            return (f"{g.label}: no disagreement; {who} inside {e.name}" + (" and later" if len(seqs) > 1 else "")
                    + (", every rank" if len(firsts) == len(g.ranks) else "") + ", not completed" + blind)
        if not any(g.at for g in self.groups):
            return "the dumps hold no collective" + blind
        if unknown:
            return (f"no hang among the ranks whose dumps were read ({_ranks_text(self.ranks)}): they agree and "
                    f"every collective completed{blind} (a hang there cannot be told)")
        return "no hang in the dumps: every group's ranks agree and every collective completed"

    def short(self) -> str:
        """For a status line: 'FR: group 1 all_reduce #4: r1 never issued it'."""
        lead = self.lead()
        if lead is None:
            return "Flight Recorder: " + self.headline()
        g = lead[1]
        if lead[0] == "p2p":
            i = g.p2p[0]
            said = {"no_send": f"r{i.src} never sent it", "no_recv": f"r{i.dst} never posted its recv",
                    "sizes": f"r{i.src} r{i.dst} other sizes", "dtypes": f"r{i.src} r{i.dst} other dtypes"}[i.kind]
            kind = "recv" if i.kind == "no_send" else "send"
            return f"Flight Recorder: {g.label} {kind} {i.pair} #{i.entry.seq}: {said}"
        d = g.first
        bits = []
        if d.never:
            bits.append(f"{_rs(d.never)} never issued it")
        for k, v in (("another op", d.other_op), ("other sizes", d.other_sizes), ("other dtypes", d.other_dtypes),
                     ("another state", d.other_state)):
            if v:
                bits.append(f"{_rs(sorted(v))} {k}")
        return f"Flight Recorder: {g.label} {d.ref.name}: " + " · ".join(bits)

    def lines(self) -> list[str]:
        """The whole verdict, a line each: each group's, then its ranks' (ranks alike merged)."""
        out = [self.headline()]
        for r, why in sorted(self.no_dump.items()):
            out.append(f"rank {r}: no readable dump ({why})")
        if self.empty:
            out.append(f"{_ranks_text(self.empty)}: the dump holds no collective "
                       f"(the Flight Recorder off? TORCH_FR_BUFFER_SIZE)")
        if self.wrapped:
            out.append(f"{_ranks_text(self.wrapped)}: the buffer wrapped (its first entries gone; "
                       f"a larger TORCH_FR_BUFFER_SIZE keeps more)")
        for g in self.groups:
            unread = [r for r in g.ranks if r in self.no_dump or r in g.no_dump]
            out.append(f"{g.label} {_ranks_text(g.ranks, 'ranks')}: " + (
                _disagreement(g.first) if g.first is not None else _agreed(g)
                + (f" (among the ranks with a dump; {_ranks_text(unread)} unknown)" if unread else "")))
            out += ["  " + text for text in _p2p_lines(g)]
            for text in _rank_lines(g):
                out.append("  " + text)
        return out

    def doc(self) -> dict:
        """The verdict as JSON (summary --json's `flight_recorder`)."""
        lead, first = self.lead(), self.p2p_first()
        return {"verdict": self.headline(), "short": self.short(), "lead": lead[0] if lead else None,
                "first_point_to_point": {"group": first[0].name, **_p2p_doc(first[1])} if first else None,
                "world": self.world, "ranks": self.ranks,
                "no_dump": {str(r): w for r, w in sorted(self.no_dump.items())}, "empty": self.empty,
                "wrapped": self.wrapped, "groups": [_group_doc(g) for g in self.groups], "lines": self.lines()}


def of_run(meta) -> dict | None:
    """The verdict a run's description carries (a directory of dumps read: recording/frdump.py),
    as `Verdict.doc()` made it, or None: meta is a RunInfo (its `extra`) or a header's dict."""
    extra = meta.get("flight_recorder") if isinstance(meta, dict) else getattr(meta, "extra", {}).get("flight_recorder")
    return extra if isinstance(extra, dict) and isinstance(extra.get("verdict"), str) else None


def headlines(doc: dict) -> tuple[list[str], bool]:
    """The verdict's sentences for a headline, fullest first, and whether it names a hang."""
    short = str(doc.get("short") or "")
    bad = any(g.get("first_disagreement") or (g.get("point_to_point") or {}).get("issues")
              or any(a.get("in_flight") for a in (g.get("ranks_at") or {}).values())
              for g in doc.get("groups") or ())
    return [f"Flight Recorder: {doc['verdict']}", short, short.split(": ", 1)[-1]], bad


def _rs(ranks) -> str:
    """'r1 r3', 'r0 … r63 (64)'."""
    ranks = list(ranks)
    if len(ranks) <= SHOWN:
        return " ".join(f"r{r}" for r in ranks)
    return f"r{ranks[0]} … r{ranks[-1]} ({len(ranks)})"


def _ranks_text(ranks, word: str = "") -> str:
    """'rank 1', 'ranks 0, 1', 'ranks 0-63' (a run), '[ranks 0, 1]' for a group (word 'ranks')."""
    ranks = sorted(ranks)
    if not ranks:
        return "[no rank]" if word else "no rank"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        body = f"{ranks[0]}-{ranks[-1]}"
    elif len(ranks) <= SHOWN:
        body = ", ".join(map(str, ranks))
    else:
        body = ", ".join(map(str, ranks[:SHOWN])) + f" and {len(ranks) - SHOWN} more"
    if word:
        return f"[{'rank' if len(ranks) == 1 else 'ranks'} {body}]"
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {body}"


def _what(e: FrEntry) -> str:
    """'all_reduce (256 B, Float[64])'."""
    nb = e.nbytes
    size = f"{nb / 1e6:.1f} MB" if nb >= 1e5 else f"{nb:,} B"
    shapes = ", ".join(f"{dt}{list(s)}" for s, dt in zip(e.in_sizes, e.in_dtypes))
    return f"{e.op} ({size}{', ' + shapes if shapes else ''})"


def _disagreement(d: Disagreement) -> str:
    bits = []
    if d.never:
        bits.append(f"{_ranks_text(d.never)} never issued it")
    if d.other_op:
        bits += [f"rank {r} issued {e.op} instead" for r, e in sorted(d.other_op.items())][:SHOWN]
    if d.other_sizes:
        bits += [f"rank {r} other sizes ({_sizes_text(e)})" for r, e in sorted(d.other_sizes.items())][:SHOWN]
    if d.other_dtypes:
        bits += [f"rank {r} other dtypes ({_dtypes_text(e)})" for r, e in sorted(d.other_dtypes.items())][:SHOWN]
    if d.other_state:
        bits += [f"rank {r} has it {e.state or 'in no state'}" for r, e in sorted(d.other_state.items())][:SHOWN]
    state = f", {d.ref.state}" if d.other_state else ""
    said = f"first disagreement at {d.ref.name}: {_ranks_text(d.agree)} issued {_what(d.ref)}{state}; "
    tail = f"; {_ranks_text(d.unknown)}: unknown (no dump, or its buffer wrapped past it)" if d.unknown else ""
    return said + "; ".join(bits) + tail


def _sizes_text(e: FrEntry) -> str:
    return f"in {[list(s) for s in e.in_sizes]}, out {[list(s) for s in e.out_sizes]}"


def _dtypes_text(e: FrEntry) -> str:
    return f"in {list(e.in_dtypes)}, out {list(e.out_dtypes)}"


def _agreed(g: GroupVerdict) -> str:
    if not g.at:
        return "no collective in the dumps"
    tops = [a.last_issued for a in g.at.values() if a.last_issued is not None]
    top = max(tops, default=None)
    flying = g.in_flight
    if flying:
        kinds = {e.p2p for es in flying.values() for e in es}
        what = "a send or recv" if kinds == {True} else "a collective" if kinds == {False} else "ops"
        return f"no disagreement up to #{top}; {_ranks_text(sorted(flying))} with {what} in flight"
    return f"no disagreement; every collective completed (last #{top})" if top is not None else "no disagreement"


def _rank_lines(g: GroupVerdict) -> list[str]:
    """Each rank's last completed and in-flight collective of the group, ranks alike merged."""
    said: dict[str, list[int]] = {}
    for r, a in sorted(g.at.items()):
        end = g.ends.get(r)
        done = f"last completed {a.last_done.name}" if a.last_done is not None else "none completed in the buffer"
        bits = [done]
        for e in a.failed[:2]:
            bits.append(f"{e.name} ended, not on every rank (by an error: its timeout?)" + _at(e))
        for e in a.in_flight[:2]:
            state = "" if e.backend in NO_STATE_BACKENDS or not e.state else f", {e.state}"
            since = f" {(end - e.created_ns) / 1e9:.1f} s at the dump" if end and e.created_ns and \
                end - e.created_ns >= 100_000_000 else ""
            bits.append(f"{e.name} in flight{since}{state}" + _at(e))
        if len(a.in_flight) > 2:
            bits.append(f"{len(a.in_flight) - 2} more in flight")
        if not a.in_flight and not a.failed:
            bits.append("nothing in flight")
        said.setdefault("; ".join(bits), []).append(r)
    out = [f"{_ranks_text(rs)}: {text}" for text, rs in said.items()]
    if g.no_dump:
        out.append(f"{_ranks_text(g.no_dump)}: no dump")
    return out


P2P_SHOWN = 4  # a group's point-to-point issues said, a line each


def _p2p_lines(g: GroupVerdict) -> list[str]:
    """'point-to-point: ...' a line per issue (the root first), or that every send met its recv."""
    if g.p2p:
        out = [f"point-to-point: {_p2p_text(i)}" for i in g.p2p[:P2P_SHOWN]]
        if len(g.p2p) > P2P_SHOWN:
            out.append(f"point-to-point: {len(g.p2p) - P2P_SHOWN} more pairs that do not match")
        return out
    if g.p2p_matched:
        return [f"point-to-point: every send met its recv ({g.p2p_matched} in {g.p2p_pairs} "
                f"pair{'s' if g.p2p_pairs > 1 else ''})"]
    return []


def _p2p_doc(i: P2PIssue) -> dict:
    return {"kind": i.kind, "src": i.src, "dst": i.dst, "index": i.index, "sent": i.sent, "posted": i.posted,
            "waiting": i.waiting, "culprit": i.culprit, "culprit_at": i.peer_at or None, "root": i.root,
            "cycle": i.cycle, "send": _entry_doc(i.send), "recv": _entry_doc(i.recv), "text": _p2p_text(i)}


def _at(e: FrEntry) -> str:
    return f", issued at {e.where}" if e.where else ""


def _entry_doc(e: FrEntry | None) -> dict | None:
    if e is None:
        return None
    return {"seq": e.seq, "op": e.op, "record_id": e.record_id, "state": e.state, "bytes": e.nbytes,
            "input_sizes": [list(s) for s in e.in_sizes], "input_dtypes": list(e.in_dtypes),
            "output_sizes": [list(s) for s in e.out_sizes], "output_dtypes": list(e.out_dtypes),
            "time_created_ns": e.created_ns, "where": e.where or None}


def _group_doc(g: GroupVerdict) -> dict:
    d = g.first
    first = None
    if d is not None:
        first = {"seq": d.seq, "op": d.ref.op, "kinds": d.kinds, "expected": _entry_doc(d.ref), "issued_by": d.issued, "agree": d.agree,
                 "never_issued": d.never, "unknown": d.unknown,
                 **{k: {str(r): _entry_doc(e) for r, e in sorted(v.items())}
                    for k, v in (("other_op", d.other_op), ("other_sizes", d.other_sizes),
                                 ("other_dtypes", d.other_dtypes), ("other_state", d.other_state))}}
    return {"group": g.name, "desc": g.desc, "label": g.label, "ranks": g.ranks, "ranks_from": g.ranks_from,
            "point_to_point": {"pairs": g.p2p_pairs, "matched": g.p2p_matched, "issues": [_p2p_doc(i) for i in g.p2p]},
            "first_disagreement": first, "last_agreed": g.last_agreed, "no_dump": g.no_dump,
            "ranks_at": {str(r): {"last_issued": a.last_issued, "last_completed": _entry_doc(a.last_done),
                                  "in_flight": [_entry_doc(e) for e in a.in_flight],
                                  "failed": [_entry_doc(e) for e in a.failed], "known_from": a.known_from}
                         for r, a in sorted(g.at.items())}}


def _signature(entries: list[FrEntry]) -> tuple:
    return tuple((e.op, e.in_sizes, e.out_sizes, e.in_dtypes, e.out_dtypes) for e in entries)


def _sizes_differ(a: FrEntry, b: FrEntry) -> bool:
    """As fr_trace's match: inputs (not an all_to_all's or a scatter's), outputs (not an
    all_to_all's or a gather's)."""
    op = a.op.split(" ")[0]
    a2a = op.startswith(("all_to_all", "alltoall"))
    return ((not a2a and op != "scatter" and a.in_sizes != b.in_sizes)
            or (not a2a and op != "gather" and a.out_sizes != b.out_sizes))


def _dtypes_differ(a: FrEntry, b: FrEntry) -> bool:
    op = a.op.split(" ")[0]
    return ((op not in ("scatter", "broadcast") and set(a.in_dtypes) != set(b.in_dtypes) and a.in_sizes and b.in_sizes)
            or (op != "gather" and set(a.out_dtypes) != set(b.out_dtypes) and a.out_sizes and b.out_sizes))


def _members(name: str, desc: str, dumps: dict[int, RankDump], world: int) -> tuple[list[int], str]:
    for d in dumps.values():
        got = d.group_ranks.get(name)
        if got:
            return list(got), "pg_config"
    if desc == DEFAULT_DESC or (name == "0" and not desc):
        return list(range(world)), "world"
    named = sorted(r for r, d in dumps.items() if name in d.status or any(e.group == name for e in d.entries))
    return named, "entries"


def _rank_at(d: RankDump, name: str, mine: list[FrEntry], bad_from: int | None, ended: int) -> RankAt:
    """Where a rank is: `bad_from`, the group's first sequence number that cannot have
    succeeded on every rank (its first disagreement, else the first some rank never issued):
    an entry from there on that ended without a state saying "completed" ended by an error.
    `ended`: the group's last collective another rank saw end (before `bad_from`): a backend
    that keeps no state retires an entry just after the call returns, so a dump taken then
    holds it unretired, though it ended on every rank."""
    colls = [e for e in mine if not e.p2p]
    st = d.status.get(name)
    top = max([e.seq for e in colls] + ([st[0]] if st is not None and st[0] >= 0 else []), default=None)
    if d.wrapped:
        known = min((e.seq for e in colls), default=(top + 1 if top is not None else 1))
    else:
        known = 1
    at = RankAt(d.rank, top, None, known_from=known)
    for e in mine:
        if d.done(e) or (e.backend in NO_STATE_BACKENDS and not e.p2p and e.seq <= ended):
            if not e.p2p and bad_from is not None and e.seq >= bad_from and e.state != "completed":
                at.failed.append(e)  # (someone in the group never issued it: it cannot have succeeded)
            else:
                at.last_done = e if at.last_done is None or e.record_id > at.last_done.record_id else at.last_done
        else:
            at.in_flight.append(e)
    return at


def _group(name: str, desc: str, dumps: dict[int, RankDump], world: int) -> GroupVerdict:
    ranks, source = _members(name, desc, dumps, world)
    have = [r for r in ranks if r in dumps]
    by_rank = {r: [e for e in dumps[r].entries if e.group == name] for r in have}
    seqs_of: dict[int, dict[int, list[FrEntry]]] = {}
    tops: dict[int, int | None] = {}
    for r in have:
        m: dict[int, list[FrEntry]] = {}
        for e in by_rank[r]:
            if not e.p2p:  # (a coalesced group: its entries share one number)
                m.setdefault(e.seq, []).append(e)
        seqs_of[r] = m
        st = dumps[r].status.get(name)
        tops[r] = max(list(m) + ([st[0]] if st is not None and st[0] >= 0 else []), default=None)
    g = GroupVerdict(name, desc, ranks, source, None, {}, None, no_dump=[r for r in ranks if r not in dumps])
    for s in sorted({s for m in seqs_of.values() for s in m}):
        present = {r: seqs_of[r][s] for r in have if s in seqs_of[r]}
        # never issued it: beyond its last (a buffer that wrapped and says nothing of the group: unknown)
        never = [r for r in have if s not in seqs_of[r] and (
            s > tops[r] if tops[r] is not None else not dumps[r].wrapped)]
        unknown = sorted(set(ranks) - set(present) - set(never))
        sig_of = {r: _signature(es) for r, es in present.items()}
        sigs = Counter(sig_of.values())
        best = max(sigs.values())
        ref_rank = min(r for r in present if sigs[sig_of[r]] == best)
        ref = present[ref_rank]
        d = Disagreement(s, ref[-1], sorted(present), never=never, unknown=unknown)
        for r, es in sorted(present.items()):
            if r == ref_rank:
                continue
            a, b = ref[-1], es[-1]
            ops_a, ops_b = [e.op for e in ref], [e.op for e in es]
            if ops_a != ops_b:
                d.other_op[r] = b
            elif any(_sizes_differ(x, y) for x, y in zip(ref, es)):
                d.other_sizes[r] = b
            elif any(_dtypes_differ(x, y) for x, y in zip(ref, es)):
                d.other_dtypes[r] = b
            elif a.state != b.state:
                d.other_state[r] = b
        d.agree = sorted(r for r in present if sig_of[r] == sig_of[ref_rank] and r not in d.other_state)
        if d.kinds:
            g.first = d
            break
        g.last_agreed = s
    # (a rank that never issued any and kept all its entries: its last is 0)
    floors = [t if t is not None else 0 for r, t in tops.items() if t is not None or not dumps[r].wrapped]
    bad_from = g.first.seq if g.first is not None else (min(floors) + 1 if floors else None)
    ended = max((e.seq for r in have for e in by_rank[r] if not e.p2p and dumps[r].done(e)
                 and (bad_from is None or e.seq < bad_from)), default=0)
    g.at = {r: _rank_at(dumps[r], name, by_rank[r], bad_from, ended) for r in have if by_rank[r] or tops[r] is not None}
    g.ends = {r: dumps[r].moment() for r in g.at}
    return g


def verdict(dumps: dict[int, RankDump], world: int | None = None,
            no_dump: dict[int, str] | None = None) -> Verdict:
    """The verdict of a job's dumps (module docstring): dumps by rank; world: the job's ranks
    (default: the highest rank with a dump or named by pg_config, plus one); no_dump: the
    ranks whose dump could not be read, and why."""
    no_dump = dict(no_dump or {})
    named = [r for d in dumps.values() for rs in d.group_ranks.values() for r in rs]
    world = max([world or 0, *(r + 1 for r in dumps), *(r + 1 for r in no_dump), *(r + 1 for r in named)])
    groups: dict[str, str] = {}
    for d in dumps.values():
        for e in d.entries:
            groups.setdefault(e.group, e.desc)
        for name, desc in d.group_desc.items():
            if name in groups and not groups[name]:
                groups[name] = desc
    for r in range(world):
        if r not in dumps and r not in no_dump:
            no_dump[r] = "no file of this rank"

    def order(name: str):
        return (groups[name] != DEFAULT_DESC, _int(name, 1 << 62), name)
    out = [_group(n, groups[n], dumps, world) for n in sorted(groups, key=order)]
    for g in out:
        _p2p_group(g, dumps)
    _p2p_roots(out, dumps)
    return Verdict(out, sorted(dumps), world, no_dump, empty=sorted(r for r, d in dumps.items() if not d.entries),
                   wrapped=sorted(r for r, d in dumps.items() if d.wrapped))


# -- point-to-point ------------------------------------------------------------------------------
def _p2p_ends(e: FrEntry, members: list[int]) -> tuple[str, int, int] | None:
    """('send'|'recv', src, dst) in global ranks, of an entry named 'send 0->1' or 'recv 1<-0'
    (the group's ranks, as NCCL names them: this rank first); None: no send or recv."""
    kind, _, meta = e.op.partition(" ")
    try:
        if kind == "send":
            me, peer = (int(x) for x in meta.split("->"))
        elif kind == "recv":
            me, peer = (int(x) for x in meta.split("<-"))
        else:
            return None
    except ValueError:
        return None
    if 0 <= me < len(members) and members[me] == e.rank and 0 <= peer < len(members):
        peer = members[peer]  # (a group's rank: its place among the group's ranks, sorted)
    elif me != e.rank:
        return None  # (the group's ranks not known: its peer cannot be told)
    return (kind, e.rank, peer) if kind == "send" else (kind, peer, e.rank)


def _shape_of(e: FrEntry, out: bool) -> tuple[tuple, tuple]:
    """A send's sizes and dtypes (its inputs), a recv's (its outputs), where recorded."""
    if out:
        return (e.out_sizes or e.in_sizes), (e.out_dtypes or e.in_dtypes)
    return (e.in_sizes or e.out_sizes), (e.in_dtypes or e.out_dtypes)


def _p2p_group(g: GroupVerdict, dumps: dict[int, RankDump]) -> None:
    """A group's sends paired with their recvs (module docstring): per (src, dst), src's sends
    to dst with dst's recvs from src, in the order each rank issued them (p2p_seq_id counts a
    group's sends and recvs together, every peer's: it cannot pair them), the first that does
    not match per pair in `g.p2p`."""
    members = sorted(g.ranks)
    sends: dict[tuple[int, int], list[FrEntry]] = {}
    recvs: dict[tuple[int, int], list[FrEntry]] = {}
    for r in sorted(g.at):
        for e in dumps[r].entries:
            if e.group != g.name or not e.p2p:
                continue
            got = _p2p_ends(e, members)
            if got is not None:
                (sends if got[0] == "send" else recvs).setdefault(got[1:], []).append(e)
    keys = sorted(set(sends) | set(recvs))
    g.p2p_pairs = len(keys)
    for src, dst in keys:
        if src not in dumps or dst not in dumps:
            continue  # (the other side's buffer unknown)
        S, R = sends.get((src, dst), []), recvs.get((src, dst), [])
        ds, dr = dumps[src], dumps[dst]
        whole = not ds.wrapped and not dr.wrapped
        # a buffer that wrapped lost the pair's first transfers: the last ended on each side are one
        off = 0 if whole else (max((i for i, e in enumerate(R) if dr.done(e)), default=-1)
                               - max((i for i, e in enumerate(S) if ds.done(e)), default=-1))
        for k in range(min(0, -off), max(len(S), len(R) - off)):
            s = S[k] if 0 <= k < len(S) else None
            rv = R[k + off] if 0 <= k + off < len(R) else None
            index = k + 1 if whole else None
            if s is not None and rv is not None:
                (ss, sd), (rs, rd) = _shape_of(s, False), _shape_of(rv, True)
                kind = "sizes" if ss != rs else "dtypes" if set(sd) != set(rd) and ss and rs else ""
                if not kind:
                    g.p2p_matched += 1
                    continue
            elif s is not None:
                if k + off < 0:
                    continue  # (dst's buffer wrapped before it)
                kind = "no_recv"
            else:
                if k < 0:
                    continue  # (src's buffer wrapped before it)
                kind = "no_send"
            issue = P2PIssue(kind, src, dst, s, rv, index, len(S), len(R))
            late = dumps[issue.culprit].moment() if issue.culprit is not None else None
            if late is not None and (issue.entry.created_ns or 0) > late:
                break  # (issued after the other rank's dump was written: it cannot say)
            g.p2p.append(issue)
            break  # (past one that does not match, the pairing is not known)


def _doing(r: int, groups: list[GroupVerdict], dumps: dict[int, RankDump]) -> str:
    """What a rank is doing, as its buffer says: its oldest op in flight (of any group), else
    its last completed."""
    if r not in dumps:
        return "no dump"
    flying = [(e, g) for g in groups if r in g.at for e in g.at[r].in_flight]
    if flying:
        e, g = min(flying, key=lambda x: x[0].record_id)
        more = f" (and {len(flying) - 1} more)" if len(flying) > 1 else ""
        return f"{e.name} ({g.label}) in flight{more}" + _at(e)
    done = [(g.at[r].last_done, g) for g in groups if r in g.at and g.at[r].last_done is not None]
    if done:
        e, g = max(done, key=lambda x: x[0].record_id)
        return f"last completed {e.name} ({g.label}), nothing in flight"
    return "nothing in its buffer"


def _p2p_roots(groups: list[GroupVerdict], dumps: dict[int, RankDump]) -> None:
    """Each issue's other rank said (what it is doing), and whether it is itself waiting in a
    send or recv no one answers (then the issue is behind another: a stuck stage stops every
    stage after it); the root ones first in each group."""
    waits: dict[int, P2PIssue] = {}
    for g in groups:
        for i in g.p2p:
            if i.waiting is not None and not dumps[i.waiting].done(i.entry):
                waits.setdefault(i.waiting, i)
    for g in groups:
        for i in g.p2p:
            c = i.culprit
            if c is None:
                continue
            i.peer_at = _doing(c, groups, dumps)
            seen = [i.waiting]
            while c in waits and c not in seen:
                seen.append(c)
                c = waits[c].culprit
            i.root = i.culprit not in waits
            if c in seen:
                i.cycle = sorted(seen[seen.index(c):])
        g.p2p.sort(key=_p2p_order)


def _p2p_order(i: P2PIssue) -> tuple:
    """Mismatches first, then the roots, a cycle, the ones behind another; by when issued."""
    return (0 if i.culprit is None else 1 if i.root else 2 if i.cycle else 3, i.entry.created_ns or 0,
            i.entry.record_id)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _p2p_what(e: FrEntry) -> str:
    """'(#4, 256 B, Float[4, 16])': its p2p_seq_id, bytes and shapes."""
    return f"(#{e.seq}, {_what(e).split(' (', 1)[1]}"


def _p2p_text(i: P2PIssue) -> str:
    """An issue in a sentence ('rank 1 waits in recv 0->1 (#4, 256 B, Float[4, 16]) that rank 0
    never sent (the 4th; rank 0 sent 3); rank 0: last completed all_reduce #3 (default_pg)')."""
    if i.kind in ("sizes", "dtypes"):
        nth = f" (the {_ordinal(i.index)} from rank {i.src} to rank {i.dst})" if i.index else ""
        return (f"send {i.pair} {_p2p_what(i.send)} on rank {i.src} and its recv {_p2p_what(i.recv)} "  # type: ignore[arg-type]
                f"on rank {i.dst}: other {i.kind}{nth}")
    e = i.entry
    if i.kind == "no_send":
        count = f" (the {_ordinal(i.index)}; rank {i.src} sent {i.sent})" if i.index else ""
        said = f"rank {i.dst} waits in recv {i.pair} {_p2p_what(e)} that rank {i.src} never sent{count}"
    else:
        count = f" (the {_ordinal(i.index)}; rank {i.dst} posted {i.posted})" if i.index else ""
        said = f"rank {i.src} waits in send {i.pair} {_p2p_what(e)} that rank {i.dst} never posted a recv for{count}"
    if e.state == "completed" or (e.backend in NO_STATE_BACKENDS and e.retired):
        said = said.replace(" waits in ", "'s ", 1).replace(" that rank", " ended, though rank", 1)
    tail = f"; rank {i.culprit}: {i.peer_at}" if i.peer_at else ""
    if i.cycle:
        tail += f"; a cycle: {_ranks_text(i.cycle)} each wait for another of them"
    return said + tail

