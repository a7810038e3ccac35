"""PyTorch's Flight Recorder, read: how long each NCCL collective ran on the GPU, by process
group and sequence number, from PyTorch's own timing (no Python on the collective's path).

With `TORCH_NCCL_ENABLE_TIMING=1` set before a process group is made, ProcessGroupNCCL records
a start event beside its end event for every collective; with a Flight Recorder buffer
(`TORCH_FR_BUFFER_SIZE` > 0) each entry carries, once the watchdog has seen it complete (it
polls every ~100 ms), `duration_ms` (the GPU's time from start to end event), with its
`collective_seq_id`, its group (`process_group`: name, description), `input_sizes` and
`input_dtypes`, `state` and `time_created_ns`. `FlightTimes` dumps the buffer
(`torch._C._distributed_c10d._dump_nccl_trace`, no stack traces) off the training thread, at
most every `interval_s`, and keeps what the steps still need. A dump holds the GIL throughout
(~15-25 ms on an H200's host, hardly more for 2,000 entries than for 256; its JSON form,
`_dump_nccl_trace_json`, took ~3x as long): few dumps of a large buffer.

(ProcessGroupNCCL's on-completion hook, `_register_on_completion_hook`, which handed over the
same durations one by one, is gone from torch's Python bindings: torch 2.11's and 2.13's
ProcessGroupNCCL have neither it nor `_enable_collectives_timing`.)

`load_dump` reads a dump (pickle, as the NCCL watchdog writes it to files too) with an
unpickler that builds plain data only: a dump crafted to run code is refused.
"""
from __future__ import annotations

import io
import os
import pickle
import threading
import time

# what a Flight Recorder dump may hold: plain containers and scalars, nothing else
_SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int",
                                    "float", "bool", "bytes", "complex")}
_SAFE |= {("collections", "OrderedDict")}


class DumpError(ValueError):
    """A dump that is not a Flight Recorder dump of plain data (truncated, corrupt, hostile)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise DumpError(f"refused: the dump asks for {module}.{name} (a Flight Recorder dump holds plain data only)")

    def persistent_load(self, pid):
        raise DumpError("refused: the dump uses persistent ids (not a Flight Recorder dump)")


def load_dump(raw: bytes | dict) -> dict:
    """A Flight Recorder dump (pickle bytes) as plain data; DumpError if it is not one. (A
    dict, the test seam's stand-in's, is taken as it is.) The unpickler reads through a
    buffered reader holding the whole dump: from a bare BytesIO it reads opcode by opcode
    through Python calls, 2.6x slower (9.3 against 3.6 ms for 2,000 entries here; pickle.loads,
    which would run code, 3.5)."""
    if isinstance(raw, dict):
        d = raw
        if not isinstance(d.get("entries", []), list):
            raise DumpError("not a Flight Recorder dump (no 'entries' list)")
        return d
    try:
        d = _PlainUnpickler(io.BufferedReader(io.BytesIO(raw), buffer_size=len(raw) + 1)).load()
    except DumpError:
        raise
    except Exception as e:  # noqa: BLE001 (whatever a damaged pickle raises)
        raise DumpError(f"not a readable Flight Recorder dump ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("entries", []), list):
        raise DumpError("not a Flight Recorder dump (no 'entries' list)")
    return d


_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1,
                "Char": 1, "Short": 2, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def entry_bytes(e: dict) -> int:
    """The bytes an entry's inputs hold (0 where its sizes or dtypes are unknown)."""
    total = 0
    for shape, dt in zip(e.get("input_sizes") or (), e.get("input_dtypes") or ()):
        n = 1
        for s in shape or ():
            n *= int(s)
        total += n * _DTYPE_BYTES.get(str(dt), 0)
    return total


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def buffer_size() -> int:
    """The Flight Recorder's buffer as this process's environment sets it (0: off)."""
    for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        v = os.environ.get(k)
        if v:
            try:
                return max(0, int(v))
            except ValueError:
                return 0
    return 0


def nccl_dump_fn():
    """torch's NCCL Flight Recorder dump (pickle bytes), or None where this build has none."""
    try:
        import torch
        fn = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    except Exception:  # noqa: BLE001
        return None
    if fn is None:
        return None
    return lambda: fn(True, False, False)  # (collectives, no stack traces, every entry)


def gloo_standin_dump(ms: float):
    """The test seam's stand-in for NCCL's dump (seams.fr_standin): gloo's real Flight Recorder,
    its entries as torch records them, each given what NCCL's watchdog gives a finished one
    (state "completed", `duration_ms`) once the collective's own Work finished; as the plain
    data `load_dump` makes of NCCL's bytes (read once, as NCCL's are: not pickled again)."""
    import torch
    fn = torch._C._distributed_c10d._dump_fr_trace

    def dump() -> dict:
        d = load_dump(fn(True, False, False))
        for e in d.get("entries") or ():
            e["state"] = "completed"
            e["duration_ms"] = ms
        return d
    return dump


def why_not_nccl_timing() -> str | None:
    """None when the NCCL collectives of this process are timed by PyTorch itself (timing on
    before the groups were made, a Flight Recorder buffer, a build that can dump it), else why."""
    if not _truthy(os.environ.get("TORCH_NCCL_ENABLE_TIMING")):
        return "TORCH_NCCL_ENABLE_TIMING is not set"
    if buffer_size() <= 0:
        return "no Flight Recorder buffer (TORCH_FR_BUFFER_SIZE)"
    if nccl_dump_fn() is None:
        return "this torch has no NCCL Flight Recorder dump"
    return None


class FlightTimes:
    """Durations of finished collectives, by (group name, sequence number), from the Flight
    Recorder's dumps; `dump` is the function that returns one (bytes). Thread-safe: asked from
    the sender thread; `refresh` dumps at most every `interval_s`."""

    def __init__(self, dump, interval_s: float = 0.25, keep: int = 8192, clock=time.monotonic,
                 buffer: int = 0, wait_s: float | None = None):
        self._dump = dump
        self.wait_s = wait_s  # wait_for's deadline (None: two intervals and a second)
        self.interval_s = interval_s
        self.min_interval_s = interval_s
        # the buffer's entries (0: unknown): the interval then follows the collectives' rate,
        # so that each dump reads mostly new entries
        self._buffer = buffer
        self._rate_at: tuple | None = None  # (clock, top record_id) at the last dump
        self._keep = keep
        self._clock = clock
        self._lock = threading.Lock()
        self._by_key: dict = {}  # (group name, seq) -> (duration_ns, bytes)
        self._last_dump = -1e18
        self._last_record = -1  # the next dump reads the entries after this record_id
        self._seen_top = -1  # the highest record_id any dump held
        self._top: dict = {}  # group name -> the highest sequence number seen finished
        # group name -> the process group's own last completed sequence number (its pg_status,
        # NCCL's watchdog's or gloo's: a hang's report drops the collectives it finished)
        self.completed: dict = {}
        self._broken = False  # the last dump failed: no step waits for the next
        self.dumps = 0
        self.dump_ns = 0  # time spent dumping and reading (the GIL held)
        self.entries_read = 0
        self.missed = 0  # entries overwritten before a dump saw them (record_id gaps)
        self.failed: str | None = None  # the first dump that failed, in a line

    def refresh(self, force: bool = False) -> bool:
        """Dump now if `interval_s` has passed since the last (or `force`); True if it dumped."""
        with self._lock:
            now = self._clock()
            if not force and now - self._last_dump < self.interval_s:
                return False
            self._last_dump = now
            # the host's time this thread spent (its CPU time: the GIL held, not waited for)
            t0 = time.thread_time_ns()
            try:
                d = load_dump(self._dump())
            except Exception as e:  # noqa: BLE001 (said once; the spans stay untimed)
                if self.failed is None:
                    self.failed = f"{type(e).__name__}: {e}"[:200]
                self._broken = True  # (nothing waits for it: settled() says so)
                return False
            self._broken = False
            self._take(d.get("entries") or ())
            self._status(d)
            self.dumps += 1
            self.dump_ns += time.thread_time_ns() - t0
            self._adapt(now)
            return True

    def _adapt(self, now: float) -> None:
        """The next interval: the time the buffer takes to fill to three quarters at the rate
        entries came since the last dump (at least the interval asked for, at most 1 s: the
        spans wait for it)."""
        top = self._seen_top
        if self._buffer > 0 and self._rate_at is not None:
            t_was, top_was = self._rate_at
            if now > t_was and top > top_was:
                rate = (top - top_was) / (now - t_was)
                self.interval_s = min(1.0, max(self.min_interval_s, 0.75 * self._buffer / rate))
        self._rate_at = (now, top)

    def _take(self, entries) -> None:
        """Every finished entry past the resume point; the next dump resumes before the first
        one still running (it may finish in between), or after the last seen."""
        by_key, resume = self._by_key, self._last_record
        top, unfinished, first = resume, None, None
        for e in entries:
            rid = e.get("record_id", -1)
            if rid <= resume:
                continue
            if first is None:
                first = rid
            top = max(top, rid)
            seq = e.get("collective_seq_id")
            if seq is None or e.get("is_p2p"):
                continue
            dur = e.get("duration_ms")
            if e.get("state") != "completed" or dur is None:
                if unfinished is None:
                    unfinished = rid
                continue
            pg = e.get("process_group") or ("",)
            key = (str(pg[0]), int(seq))
            if key not in by_key:
                self.entries_read += 1
            by_key[key] = (int(float(dur) * 1e6), entry_bytes(e))
            if key[1] > self._top.get(key[0], -1):
                self._top[key[0]] = key[1]
        if first is not None and self._seen_top >= 0 and first > self._seen_top + 1:
            self.missed += first - self._seen_top - 1  # (overwritten before any dump saw them)
        self._seen_top = max(self._seen_top, top)
        self._last_record = top if unfinished is None else unfinished - 1
        self._prune()

    def _status(self, d: dict) -> None:
        """pg_status (by process group id) read by group name, the entries' (pg_id, name)."""
        st = d.get("pg_status")
        if not isinstance(st, dict):
            return
        names = {}
        for e in d.get("entries") or ():
            pg = e.get("process_group") or ("",)
            names.setdefault(str(e.get("pg_id")), str(pg[0]))
        for pid, v in st.items():
            name = names.get(str(pid))
            if name is not None and isinstance(v, dict):
                try:
                    self.completed[name] = int(v.get("last_completed_collective", -1))
                except (TypeError, ValueError):
                    pass

    def _prune(self) -> None:
        by_key = self._by_key
        if len(by_key) > self._keep:
            for k in list(by_key)[: len(by_key) - self._keep // 2]:
                del by_key[k]

    def get(self, group: str, seq: int):
        """(duration_ns, bytes) of a finished collective, or None (not seen finished yet)."""
        return self._by_key.get((group, seq))

    def forget(self, group: str, seq: int) -> None:
        self._by_key.pop((group, seq), None)

    def settled(self, group: str, seq: int) -> bool:
        """Seen finished, or never will be: a later collective of its group (one NCCL stream:
        they finish in order) was seen finished without it (overwritten in the buffer, or
        timed by nothing), or the last dump failed."""
        return ((group, seq) in self._by_key or self._top.get(group, -1) > seq
                or self._broken)

    def wait_for(self, keys, deadline_s: float | None = None, sleep=time.sleep) -> bool:
        """Until every (group, seq) in `keys` is settled, dumping at the interval, up to
        `deadline_s` (default: two intervals and a second, the watchdog's retiring included);
        True when all were seen finished."""
        if deadline_s is None:
            deadline_s = self.wait_s if self.wait_s is not None else 2 * self.interval_s + 1.0
        t_end = self._clock() + deadline_s
        while True:
            if all(self.settled(g, q) for g, q in keys):
                return all(k in self._by_key for k in keys)
            if self._clock() >= t_end:
                return False
            if not self.refresh():
                sleep(max(0.001, min(self.interval_s / 4, t_end - self._clock())))

    def stats(self) -> dict:
        return {"dumps": self.dumps, "dump_ms": self.dump_ns / 1e6, "entries": self.entries_read,
                "missed": self.missed, "failed": self.failed, "interval_s": self.interval_s}


def flight_times_for(device_type: str) -> "FlightTimes":
    """The FlightTimes a rank reads DDP's buckets from: NCCL's dump, or on a CPU the test
    seam's stand-in (seams.fr_standin: gloo's real Flight Recorder); its interval
    DDPTUI_FR_INTERVAL_S (0.25 s by default), its buffer TORCH_FR_BUFFER_SIZE's."""
    from ranks import seams
    standin = seams.fr_standin() if device_type != "cuda" else None
    dump = nccl_dump_fn() if standin is None else gloo_standin_dump(standin)
    # (the stand-in: gloo's collectives on a CPU shared with the training, whose threads a loaded
    # machine can hold for seconds before an entry reads completed: a longer wait before a
    # bucket is given up as untimed; NCCL's keep the default)
    return FlightTimes(dump, interval_s=float(os.environ.get("DDPTUI_FR_INTERVAL_S", "0.25")),
                       buffer=buffer_size(), wait_s=None if standin is None else 10.0)


DUMP_PREFIX = "fr_rank"  # a rank's dump in the run's directory: fr_rank<r> (frdump reads them)


def dump_to_dir(rank: int, directory: str | None = None) -> str | None:
    """This process's Flight Recorder (NCCL's where this torch has it and it holds entries,
    else gloo's) written as `<directory>/fr_rank<rank>` (the pickle the NCCL watchdog writes,
    no stack traces), atomically; `directory`: DDPTUI_FR_DIR's. The path, or None where there
    is no directory or nothing to dump (the Flight Recorder off)."""
    directory = directory or os.environ.get("DDPTUI_FR_DIR")
    if not directory or buffer_size() <= 0:
        return None
    import torch
    c10d = torch._C._distributed_c10d
    raw = None
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            got = fn(True, False, False)
        except Exception:  # noqa: BLE001 (no such recorder in this build or run)
            continue
        try:
            if load_dump(got).get("entries"):
                raw = got
                break
        except DumpError:
            continue
        raw = raw or got
    if raw is None:
        return None
    path = os.path.join(directory, f"{DUMP_PREFIX}{rank}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)
    return path
