"""`ddptui attach HOST:PORT`: a running job that started PyTorch's debug server, watched from
outside; nothing of ddptui runs in it.

`connect()` reads the job's TCPStore at HOST:PORT (its MASTER_ADDR:MASTER_PORT) as a client
only (live/storeclient.py: never a write) for each rank's debug server address; then a
thread (``ddptui-attach``) polls every rank's Flight Recorder about once a second through
that rank's own server (live/debugserver.py, ``fr_trace_json``), all ranks at once:

- the buffers become frames (recording/frstream.py) through the one Feed into the Store, so
  the UI (`Source`: start, poll, stop) or the headless lines draw them, and the recorder
  writes them (a .ddptui that `ddptui replay` opens; its header is rewritten at the end with
  the process groups and what was named, `restamp`);
- their verdict (model/frverdict.py) goes to model/frwatch.Watch, which names a hang or a
  desync that lasts; when it names one, the late ranks' Python stacks are fetched at once
  (``dump_traceback``, model/pystack.py): the file, line and function each is on. What was
  named is a status line (recorded), each late rank's stack its output lines (key `o`), the
  run's ``flight_recorder`` description (the headline, `Store.revise_meta`), and lines on
  `lines` (the headless verb prints them).
- `pull_profile(seconds)` takes a torch.profiler window from every rank (live/profpull.py).

It only reads. A rank that does not answer, answers slowly (`timeout_s`), too much (`cap_mb`)
or not in JSON is said in a line when that starts and when it ends, and the others go on;
ranks that registered no debug server are said once. When no rank has answered for
GONE_POLLS polls in a row the job is taken as ended (`state` "finished"). Memory stays
bounded however long it runs: one buffer per rank at a time, the frames' state bounded by the
buffers (FrStream), the Store keeping `keep_steps` steps and `keep_figures` steps' figures.
"""
from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec
from ranks import frames
from ranks.recfile import HDR, MAGIC, FORMAT_VERSION, RecordingError, RecordingStopped, RecordWriter, read_header

from ddptui import __version__
from ddptui.ingest.feed import Feed
from ddptui.model import frverdict, frwatch, pystack
from ddptui.model.store import Store
from ddptui.recording.frstream import FrStream, run_meta
from . import debugserver, profpull
from .storeclient import PREFIX, StoreClient, StoreError, server_address

GONE_POLLS = 10  # no rank answered this many polls in a row: the job has ended
SHOWN_STACKS = 8  # late ranks whose stacks are fetched and said
STACK_LINES = 40  # frames of a stack said per rank
REPROBE_S = 10.0  # ranks missing from the store looked for again this often
TRAINING_POLLS = 2  # polls in a row with new collectives: the job trains (a profile may be asked)
PENDING_MAX = 1000  # frames kept for the recording until it opens
EMPTY_POLLS = 3  # polls that found every buffer empty before that is said
# Polls apart while the job runs healthy (`idle_s`): a poll makes every rank dump its whole
# buffer (a 2,000-entry one: ~1 MB of JSON a rank) and costs the attach process more to read
# (~30 ms a rank to decode a whole buffer here, and as much again to judge and draw it), so a
# job seen progressing is polled less often; the next poll comes after `interval_s` (or when a
# collective stuck for SUSPECT_S would become a hang) while one is, while a hang is named, a
# rank is silent, and at the start.
IDLE_S = 2.5
SUSPECT_S = 0.25
# Once a rank's whole buffer has been read (its first answer: the job's recent history), a
# healthy poll reads only its newest TAIL entries, the others not even decoded (frverdict.
# rank_dump_json's tail; what the attach costs the cores it shares with the job: a host-bound
# job's poll 52 -> ~20 ms of CPU); the whole buffer where its pg_status says a collective is in
# flight that the tail does not reach back to (never cut away, however many came after it),
# while a collective stands stuck and while a hang is named (never behind what a tail read
# began at, `_floor`: all ended there). A job making more than TAIL collectives a
# rank between two polls is drawn on a sample of them, said (`unread`).
TAIL = 256
NAMED_KEPT = 100  # hangs (and their ends) kept for the report


class AttachError(Exception):
    """Attaching cannot start; the message is one line for the user."""


@dataclass
class AttachOptions:
    host: str
    port: int
    interval_s: float = 1.0
    idle_s: float = IDLE_S
    hang_s: float = frwatch.HANG_S
    timeout_s: float = 3.0
    cap_mb: float = 64.0
    record: str | None = None
    keep_steps: int = 200
    keep_figures: int = 2000

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class AttachRun:
    """A Source over an attached job (module docstring)."""

    def __init__(self, opts: AttachOptions, store: Store | None = None):
        self.opts = opts
        self.store = store or Store(keep_steps=opts.keep_steps, keep_figures=opts.keep_figures)
        self.feed = Feed(self.store, sink=self._sink, on_sink_error=self._recording_failed)
        self.state, self.message = "created", ""
        self.recording_error: str | None = None
        self.recorder: RecordWriter | None = None
        self.lines: queue.SimpleQueue = queue.SimpleQueue()  # (level, text): "result" | "info" | "warn"
        self.servers: dict[int, tuple[str, int]] = {}  # rank -> its debug server
        self.unregistered: dict[int, str] = {}  # rank -> why it has no usable debug server
        self.world = 0
        self.watch = frwatch.Watch(opts.hang_s)
        self.stream: FrStream | None = None
        # what was named, in order (the last NAMED_KEPT: a job whose slow steps are named one
        # after the other, for hours, keeps memory bounded too), and how many in all
        self.named: deque[frwatch.Named] = deque(maxlen=NAMED_KEPT)
        self.resolved: deque[tuple[frwatch.Named, float]] = deque(maxlen=NAMED_KEPT)
        self.named_count = 0
        self.polls = 0
        self.entries_seen = 0
        self.last_poll_s = 0.0  # how long the last poll took
        self.gap_s = opts.interval_s  # the last gap between polls (next_gap)
        self._last_rid: dict[int, int] = {}  # rank -> its newest record_id read
        self._floor: dict[int, int] = {}  # rank -> the record_id a tail read began at (none read below it again)
        self._answered: set[int] = set()  # the ranks whose buffers the last poll read
        # rank -> pg_id -> {p2p: its last entry read}: a tail without a group's entries reads
        # the group's pg_status through them (frverdict._groups)
        self._known: dict[int, dict[int, dict[bool, frverdict.FrEntry]]] = {}
        self.unread = 0  # collectives the ranks made between polls that no tail reached (a sample drawn)
        self.tail_reads = 0  # ranks' buffers read by their tail only
        self._sample_said = False
        self.down: dict[int, str] = {}  # rank -> why it did not answer (said once)
        self.profiles: list[str] = []  # traces directories written
        self._silent = 0
        self._entries: dict[int, dict] = {}  # rank -> its entries read at the last poll (rank_dump's cache)
        self._empty_said = False
        self._many_said = False
        self.busy_polls = 0  # polls in a row in which the job's collectives went on (it trains)
        self._client: StoreClient | None = None
        self._reprobe_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._rec_lock = threading.Lock()
        self._pending: list | None = []  # frames before the recording opens (its first poll)
        self._started_ns = 0

    # -- connecting ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Read the store for every rank's debug server; AttachError (one line) when the store
        cannot be read or no rank registered one."""
        o = self.opts
        try:
            client = StoreClient(o.host, o.port, timeout=o.timeout_s)
            found = client.ranks(PREFIX)
        except StoreError as e:
            raise AttachError(str(e)) from None
        if not found:
            client.close()
            raise AttachError(f"{o.target} is the job's TCPStore, but no rank registered a debug server in it "
                              f"(no {PREFIX}/rank<N> key): the job must call "
                              f"torch.distributed.debug.start_debug_server() on every rank (a job still starting "
                              f"registers it after init_process_group: try again in a few seconds)")
        self._client = client
        self._take(found)
        if not self.servers:
            raise AttachError(f"{o.target}: no rank's debug server address can be read ("
                              + "; ".join(f"rank {r}: {w}" for r, w in sorted(self.unregistered.items())) + ")")
        self.world = max(found) + 1
        for r in range(self.world):
            if r not in found:
                self.unregistered[r] = f"no {PREFIX}/rank{r} key in the store (its debug server not started)"

    def _take(self, found: dict[int, str]) -> None:
        for r, value in found.items():
            addr = server_address(value)
            if addr is None:
                self.unregistered[r] = f"its registered address {value[:80]!r} is not http://HOST:PORT"
            else:
                self.servers[r] = addr
                self.unregistered.pop(r, None)

    def describe(self) -> str:
        """'2 ranks (rank 0 at vm:35115, rank 1 at vm:41023)'."""
        shown = [f"rank {r} at {h}:{p}" for r, (h, p) in sorted(self.servers.items())][:4]
        more = f", {len(self.servers) - 4} more" if len(self.servers) > 4 else ""
        return f"{self.world} rank{'s' if self.world != 1 else ''} ({', '.join(shown)}{more})"

    # -- the Source ---------------------------------------------------------------------------
    def start(self) -> None:
        if not self.servers:
            self.connect()
        self.state = "running"
        self.message = f"attached to {self.opts.target}: {self.describe()} (read-only)"
        self._started_ns = time.time_ns()
        self._say("info", self.message)
        for r, why in sorted(self.unregistered.items()):
            self._say("warn", f"rank {r}: {why}; the others are watched")
        self._thread = threading.Thread(target=self._loop, name="ddptui-attach", daemon=True)
        self._thread.start()

    def poll(self) -> bool:
        return self.state not in ("running", "starting")

    def stop(self, why: str = "stopped by user") -> None:
        """Stop polling (the job goes on untouched); the recording is finished and its header
        rewritten with what was seen."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.opts.timeout_s + 5)
        if self.state in ("running", "starting", "created"):
            self.state, self.message = "stopped", why
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
        self._close_recording()
        self.store.update()

    # -- polling ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self._poll_once()
            except Exception as e:  # noqa: BLE001 - said, and the next poll tries again
                self._say("warn", f"a poll failed: {type(e).__name__}: {e}")
            self.last_poll_s = time.monotonic() - t0
            if self._silent >= GONE_POLLS:
                self.state = "finished"
                self.message = (f"no rank has answered for {GONE_POLLS} polls: the job has ended "
                                f"(or its hosts cannot be reached from here)")
                self._say("warn", self.message)
                self._close_recording()
                return
            self.gap_s = self.next_gap()
            self._stop.wait(max(0.05, self.gap_s - self.last_poll_s))

    def next_gap(self) -> float:
        """Seconds from this poll's start to the next's (IDLE_S above)."""
        o = self.opts
        fast = o.interval_s
        if o.idle_s <= fast or self.polls < EMPTY_POLLS or self.stream is None or self.watch.current is not None \
                or self.down or self._silent:
            return fast
        pending = self.watch.pending_s
        if pending >= SUSPECT_S:  # (at the latest when it would be named)
            return max(0.2, min(fast, self.watch.hang_s - pending + 0.05))
        return max(fast, o.idle_s)

    def tail(self) -> int | None:
        """How many of a rank's newest entries the next poll reads (None: the whole buffer)."""
        if self.polls == 0 or self.watch.current is not None or self.watch.pending_s >= SUSPECT_S:
            return None
        return TAIL

    def _fetch(self, handler: str, ranks, params=None, timeout=None, cap=None, deadline=None) -> dict:
        """rank -> Reply of one handler, every rank at once."""
        o = self.opts
        timeout = o.timeout_s if timeout is None else timeout
        cap = int(o.cap_mb * (1 << 20)) if cap is None else cap
        ranks = [r for r in ranks if r in self.servers]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(32, max(1, len(self.servers))),
                                            thread_name_prefix="ddptui-attach-http")
        futs = {r: self._pool.submit(debugserver.post, *self.servers[r], handler, params, timeout=timeout,
                                     cap=cap, deadline=deadline) for r in ranks}
        return {r: f.result() for r, f in futs.items()}

    def _poll_once(self) -> None:
        o = self.opts
        now = time.monotonic()
        if self.unregistered and now >= self._reprobe_at and self._client is not None:
            self._reprobe_at = now + REPROBE_S
            self._reprobe()
        replies = self._fetch("fr_trace_json", sorted(self.servers), deadline=o.timeout_s * 2)
        self.take(replies, time.time_ns(), time.monotonic())

    def take(self, replies: dict[int, debugserver.Reply], now_ns: int, now_s: float) -> None:
        """One poll's answers (rank -> its fr_trace_json reply) made into the verdict, what is
        named, the frames; `now_ns`: when they came (the wall clock), `now_s`: a monotonic
        clock. (The polling thread's; a test hands it replies of its own.)"""
        dumps: dict[int, frverdict.RankDump] = {}
        tail = self.tail()
        for r, reply in sorted(replies.items()):
            why = reply.error
            if reply.ok:  # (decoded straight into typed entries: frverdict.rank_dump_json)
                try:
                    dumps[r] = self._read(r, reply.body, now_ns, tail)
                except msgspec.DecodeError:
                    why = debugserver.json_of(reply)[1]  # (not JSON: the phrase says what it is)
                except frverdict.DumpFormatError as e:
                    why = f"its fr_trace_json is not a Flight Recorder dump ({e})"
            if r not in dumps:
                self._entries.pop(r, None)
            self._note_answer(r, None if r in dumps else why)
        self._answered = set(dumps)
        self._silent = 0 if dumps else self._silent + 1
        if not dumps:
            return
        self.polls += 1
        self.entries_seen = sum(len(d.entries) for d in dumps.values())
        if self.polls == EMPTY_POLLS and not self.entries_seen and not self._empty_said:
            self._empty_said = True
            self._say("warn", "every rank's Flight Recorder is empty: the job has issued no collective yet "
                              "(still starting?), or TORCH_FR_BUFFER_SIZE (e.g. 2000) was not set when it "
                              "started (without it PyTorch records no collective); on gloo it records no send "
                              "or recv either (a pipeline's stages show only their collectives)")
        no_dump = {r: w for r, w in self.down.items()}
        no_dump.update({r: w for r, w in self.unregistered.items()})
        verdict = frverdict.verdict(_unsettled(dumps, self.stream), self.world, no_dump=no_dump)
        for ev in self.watch.update(verdict, now_ns, now_s):
            if ev[0] == "named":
                self._named(ev[1])
            elif ev[0] == "resolved":
                self._resolved(ev[1], ev[2])
        if self.stream is None:
            backends = [d.backend for d in dumps.values() if d.backend]
            backend = backends[0] if backends else ""
            if not backend and self.polls < EMPTY_POLLS:  # (no entry yet: the run's header, which
                self.store.update()  # names the backend, waits for the first collective a while)
                return
            origin = min((e.created_ns for d in dumps.values() for e in d.entries if e.created_ns), default=now_ns)
            self.stream = FrStream(self.world, origin, backend,
                                   notes={r: w for r, w in self.unregistered.items() if r < self.world})
            self.store.set_meta(run_meta(self.world, backend, self.opts.target, []))
            self._open_recording(backend)
        self.store.revise_meta("flight_recorder", self.doc(verdict))
        for f in self.stream.poll(dumps, verdict, now_ns, self.watch.current is not None):
            self.feed.frame(f)
        if self.unread and not self._sample_said:  # (said once: a job faster than TAIL a poll)
            self._sample_said = True
            self._say("info", f"a fast job: between two polls a rank makes more collectives than the {TAIL} newest "
                              f"a poll reads (what attaching costs the job kept small), so the steps drawn are a "
                              f"sample of its steps; a hang is named as ever (a whole buffer is read then)")
        per = self.stream.per_drawn
        if per > 1 and not self._many_said:  # (said once: a fast job)
            self._many_said = True
            self._say("info", f"a fast job: it makes more steps between two polls than are drawn one by one, so up to "
                              f"{per} of its steps are drawn as one (every collective read is still drawn)")
        self.busy_polls = self.busy_polls + 1 if self.stream.last_settled else 0
        self.store.update()

    def _read(self, r: int, body: bytes, now_ns: int, tail: int | None) -> frverdict.RankDump:
        """One rank's reply read (`tail`: its newest entries only, or the whole where one in
        flight is older: frverdict.rank_dump_json; the whole at its first answer), nothing below
        what a tail read began at; what no read reached between two polls it answered (`unread`)."""
        last = self._last_rid.get(r)
        if last is None:
            tail = None
        known = self._known.setdefault(r, {})
        d = frverdict.rank_dump_json(body, r, now_ns, cache=self._entries.setdefault(r, {}), tail=tail,
                                     known={pid: list(es.values()) for pid, es in known.items()})
        for e in d.entries:  # (each group's last collective and last point-to-point op read)
            if e.pg_id is not None:
                known.setdefault(e.pg_id, {})[e.p2p] = e
        floor = self._floor.get(r)
        if d.cut is not None:
            self.tail_reads += 1
            self._floor[r] = max(d.cut, floor or 0)
        elif floor is not None and d.entries and d.entries[0].record_id < floor:
            d.entries = [e for e in d.entries if e.record_id >= floor]
        if d.entries:
            if last is not None and d.cut is not None and r in self._answered and d.entries[0].record_id > last + 1:
                self.unread += d.entries[0].record_id - last - 1
            self._last_rid[r] = max(d.entries[-1].record_id, last if last is not None else -1)
        return d

    def _reprobe(self) -> None:
        try:
            found = self._client.ranks(PREFIX, known={r: "" for r in self.servers})
        except StoreError:
            return
        new = {r: v for r, v in found.items() if r not in self.servers and r < self.world}
        if new:
            self._take(new)
            for r in sorted(new):
                if r in self.servers:
                    self._say("info", f"rank {r} registered its debug server: watched from now on")

    def _note_answer(self, r: int, why: str | None) -> None:
        """A rank's answer this poll: a line when it stops answering, and when it answers again."""
        was = self.down.get(r)
        if why is None:
            if was is not None:
                del self.down[r]
                self._say("info", f"rank {r} answers again")
            return
        if was is None or was.split(" (", 1)[0] != why.split(" (", 1)[0]:
            self._say("warn", f"rank {r}: {why}; the other ranks are watched")
        self.down[r] = why

    # -- a hang named ---------------------------------------------------------------------------
    def _named(self, n: frwatch.Named) -> None:
        late = n.late[:SHOWN_STACKS]
        replies = self._fetch("dump_traceback", late, cap=1 << 20)
        for r in late:
            reply = replies.get(r)
            if reply is None or not reply.ok:
                n.stacks[r] = ""
                n.stack_lines[r] = [f"(its stack could not be read: {reply.error if reply else 'no debug server'})"]
                continue
            st = pystack.main_stack(pystack.parse(reply.body.decode("utf-8", "replace")))
            n.stacks[r] = pystack.describe(st)
            n.stack_lines[r] = [f'File "{f.file}", line {f.line} in {f.func}' for f in (st.frames if st else [])][:STACK_LINES]
        self.named.append(n)
        self.named_count += 1
        after = n.after_s()
        when = f", named {after:.1f} s after it began" if after is not None else ""
        self._say("result", n.line() + when)
        for r in late:
            if n.stacks.get(r):
                self._say("result", f"  rank {r} is at {n.stacks[r]}")
            else:
                self._say("result", f"  rank {r}: " + (n.stack_lines.get(r) or ["its stack is empty"])[0])
            lines = [f"Python stack of rank {r} when {n.kind} {n.name} was named (innermost first):"] + \
                [f"  {x}" for x in n.stack_lines.get(r, [])]
            for x in lines[1:]:
                self.lines.put(("stack", x))
            self.feed.frame(frames.Output(rank=r, stream="err", lines=[x[:frames.MAX_OUTPUT_LINE] for x in lines],
                                          ts=time.time()))
        if len(n.late) > len(late):
            self._say("result", f"  ({len(n.late) - len(late)} more late ranks: their stacks not fetched)")

    def _resolved(self, n: frwatch.Named, secs: float) -> None:
        self.resolved.append((n, secs))
        self._say("result", f"resolved: {n.group} {n.name} went on after {secs:.1f} s "
                            f"(a slow rank, not a hang; --hang-s above the job's slowest step names fewer)")

    def doc(self, verdict: frverdict.Verdict | None = None) -> dict:
        """The run's `flight_recorder` description (the headline, summary, the JSON)."""
        cur = self.watch.current
        o = self.opts
        base = {"source": "attach", "attached_to": o.target, "world": self.world, "polls": self.polls,
                "named_count": self.named_count,
                "backend": self.stream.backend if self.stream else "", "named": [n.doc() for n in self.named],
                "resolved": [{"collective": n.name, "label": n.group, "after_s": round(s, 3)} for n, s in self.resolved],
                "unreadable": {}}
        if cur is not None:
            where = cur.where_line()
            group = {"group": cur.group_name, "label": cur.group,
                     "first_disagreement": {"seq": cur.seq, "never_issued": cur.never} if (cur.never or cur.other) else None,
                     "ranks_at": {str(r): {"in_flight": [{"seq": cur.seq}]} for r in cur.inside}}
            lines = [cur.line() + (f"; {where}" if where else "")]
            for r in cur.late[:SHOWN_STACKS]:
                lines += [f"rank {r} stack:"] + [f"  {x}" for x in cur.stack_lines.get(r, [])[:8]]
            return {**base, "verdict": lines[0], "short": cur.short(), "groups": [group], "lines": lines}
        said = f"attached to {o.target}: {self.world} ranks, no hang (every collective completes)"
        if self.resolved:
            n, s = self.resolved[-1]
            said += f"; {n.group} {n.name} was stuck {s:.1f} s, then went on"
        if self.down:
            said += f"; {len(self.down)} rank(s) not answering"
        return {**base, "verdict": said, "short": "", "groups": [], "lines": [said]}

    # -- a profile --------------------------------------------------------------------------
    def training(self) -> bool:
        """Whether the job is seen training: its collectives went on in TRAINING_POLLS polls
        in a row (a profile is asked only then: see pull_profile)."""
        return self.busy_polls >= TRAINING_POLLS

    def pull_profile(self, seconds: float, out_dir: str | None = None) -> profpull.Pulled:
        """A torch.profiler window of `seconds` from every rank, written as a traces directory
        (live/profpull.py); said in lines, and returned. Only while the job is seen training:
        the profiler imports modules on the debug server's thread, and a job still importing
        torch on its main thread (its first seconds: DDP's constructor imports torch._dynamo)
        can then fail on torch's import lock (seen here: both ranks died)."""
        out_dir = out_dir or profpull.default_dir(self.opts.record)
        if not self.training():
            got = profpull.Pulled(out_dir, seconds, refused="not taken: the job is not seen training yet "
                                  "(no new collectives in the last polls); a profile asked while it still "
                                  "imports torch can break it")
            self._say("warn", got.lines()[0])
            return got
        self._say("info", f"taking {seconds:g} s of torch.profiler on {len(self.servers)} rank(s)…")
        got = profpull.pull(self.servers, seconds, out_dir, timeout=self.opts.timeout_s,
                            cap=int(max(self.opts.cap_mb, 256) * (1 << 20)))
        for line in got.lines():
            self._say("result" if got.ok else "warn", line)
        if got.ok:
            self.profiles.append(got.path)
        return got

    # -- lines and the recording --------------------------------------------------------------
    def _say(self, level: str, text: str) -> None:
        """A line for the headless verb, and the store's log (recorded)."""
        self.lines.put((level, text))
        self.feed.frame(frames.Status(text=text[:4000], level="error" if level == "result" and text.startswith(("hang", "desync"))
                                      else "warn" if level == "warn" else "info", ts=time.time()))

    def _open_recording(self, backend: str) -> None:
        if not self.opts.record:
            return
        meta = self.store.meta.as_dict()
        meta.update(created=time.time(), ddptui=__version__)
        try:
            with self._rec_lock:
                self.recorder = RecordWriter(self.opts.record, meta)
                for body, frame in self._pending or ():
                    self.recorder.write_body(body, frame)
                self._pending = None
        except OSError as e:
            self._recording_failed(e)

    def _sink(self, body: bytes, frame) -> None:
        with self._rec_lock:
            rec = self.recorder
            if rec is not None:
                rec.write_body(body, frame)
            elif self.opts.record and self._pending is not None and len(self._pending) < PENDING_MAX:
                self._pending.append((body, frame))  # (before the first poll opens the recording)

    def _recording_failed(self, e: BaseException) -> None:
        self.feed.sink = None
        if self.recording_error is None:
            self.recording_error = str(e) if isinstance(e, RecordingStopped) else \
                f"recording {self.opts.record} stopped: {type(e).__name__}: {e}"
            self.lines.put(("warn", self.recording_error + "; attaching goes on without it"))
            self.store.add_log(self.recording_error + "; attaching goes on without it", "warn")

    def _close_recording(self) -> None:
        with self._rec_lock:
            rec, self.recorder = self.recorder, None
        if rec is None:
            return
        try:
            rec.close()
        except OSError as e:
            self._recording_failed(e)
            return
        if self.recording_error is None:
            meta = self.store.meta.as_dict()
            meta["flight_recorder"] = self.doc()
            try:
                restamp(self.opts.record, meta)
            except (OSError, ValueError, RecordingError) as e:
                self.lines.put(("warn", f"recording {self.opts.record}: its header not rewritten ({e}); "
                                        f"it replays without the final verdict"))


def _unsettled(dumps: dict[int, frverdict.RankDump], stream: FrStream | None) -> dict[int, frverdict.RankDump]:
    """What the verdict needs of each rank's buffer: its collectives not yet drawn (settled on
    every rank: nothing to judge there), and of those drawn, the last of each group (its last
    completed one). A healthy job's verdict then reads a few entries a rank, not its buffer."""
    if stream is None or not stream.drawn:
        return dumps
    out = {}
    for r, d in dumps.items():
        last: dict[str, frverdict.FrEntry] = {}
        keep = []
        for e in d.entries:
            if (e.group, e.p2p, e.seq) in stream.drawn:
                if not e.p2p:
                    last[e.group] = e
            else:
                keep.append(e)
        keep += last.values()
        keep.sort(key=lambda e: e.record_id)
        out[r] = frverdict.RankDump(rank=r, version=d.version, entries=keep, group_ranks=d.group_ranks,
                                    group_desc=d.group_desc, status=d.status, skipped=d.skipped, dumped_ns=d.dumped_ns)
    return out


def restamp(path: str, meta: dict) -> None:
    """Rewrite a finished recording's header with `meta` (what was learnt while it was
    written: the process groups, what was named); the frames are copied as they are (their
    zlib stream does not depend on the header). Written beside it, then renamed over it."""
    import msgpack
    head = msgpack.packb(meta, use_bin_type=True)
    tmp = f"{path}.restamp-{os.getpid()}"
    with open(path, "rb") as src:
        read_header(src, path)  # (positions src after the old header; raises on a bad file)
        try:
            with open(tmp, "wb") as dst:
                dst.write(MAGIC + HDR.pack(FORMAT_VERSION, len(head)) + head)
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
