"""`ddptui attach HOST:PORT` (ddptui/live/attach.py) on a real job that knows nothing of ddptui:
2 gloo ranks under torchrun training a small DDP model, with PyTorch's debug server started
the way a user adds it (tests/scripts/attach_job.py). One job for the module: the attach UI
(Pilot) while it trains, its profile key; then the job made to hang (rank 1 stops in
`stall_here`, rank 0 waits inside the step's all_reduce) under `ddptui attach --headless`:
the hang named within 5 s of its start with rank 1's file, line and function, the recording
replayed; then ranks that do not answer, answer slowly, too much or not in JSON, beside the
real rank 0; bad input; and memory over a long attach simulated from the job's real buffers.
"""
from __future__ import annotations

import gc
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import msgspec
import pytest

from ddptui.live import debugserver
from ddptui.live.attach import AttachOptions, AttachRun
from ddptui.live.storeclient import StoreClient, server_address
from ddptui.recording.loader import load

from .helpers import ROOT, assert_no_leftovers, cli_env, run_main, start_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("attach")]

SCRIPT = os.path.join(ROOT, "tests", "scripts", "attach_job.py")
STALL_LINE = next(i for i, line in enumerate(open(SCRIPT), 1) if "# STALL" in line)
NAMED_WITHIN_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    port: int
    dir: str
    hang: str  # the file that makes rank 1 stop
    servers: dict  # rank -> (host, port) of its debug server
    bodies: dict  # rank -> its fr_trace_json while it trains (bytes)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("attach-job")
    port = _free_port()
    ready, hang = str(d / "ready"), str(d / "hang")
    log = open(d / "job.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          "--master-addr=127.0.0.1", f"--master-port={port}", SCRIPT, "--ready", ready, "--hang", hang],
                         stdout=log, stderr=subprocess.STDOUT, cwd=str(d), start_new_session=True,
                         env=cli_env({"TORCH_FR_BUFFER_SIZE": "2000"}))
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(ready):
            assert p.poll() is None and time.monotonic() < deadline, (d / "job.log").read_text()[-3000:]
            time.sleep(0.2)
        c = StoreClient("127.0.0.1", port)  # (read-only, as attach reads it)
        servers = {r: server_address(v) for r, v in c.ranks().items()}
        c.close()
        assert sorted(servers) == [0, 1], servers
        bodies = {r: debugserver.post(*servers[r], "fr_trace_json").body for r in servers}
        yield Job(port, str(d), hang, servers, bodies)
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        log.close()
        assert_no_leftovers()


def _target(job: Job) -> str:
    return f"127.0.0.1:{job.port}"


# -- the UI, while the job trains ----------------------------------------------------------------
@pytest.mark.asyncio
async def test_the_attach_screen_draws_the_job_and_p_takes_a_profile(job, tmp_path):
    from textual.geometry import Region

    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets import StartupScreen

    notes: list[str] = []

    class App(DdpApp):
        def notify(self, message, **kw):
            notes.append(str(message))
            return super().notify(message, **kw)

    rec = tmp_path / "ui.ddptui"
    run = AttachRun(AttachOptions("127.0.0.1", job.port, interval_s=0.5, record=str(rec)))
    run.connect()
    app = App(run, profile_s=1.0)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        deadline = time.monotonic() + 20
        while isinstance(app.screen, StartupScreen) or not run.training():
            assert time.monotonic() < deadline, (run.state, run.message, run.polls)
            await pilot.pause(0.2)
        app.redraw()
        await pilot.pause()
        assert set(app.panes) == {"ddp"} and run.store.world == 2
        head = " ".join(strip.text for strip in app.headline.render_lines(Region(0, 0, *app.headline.size)))
        assert "attached to 127.0.0.1" in head and "no hang" in head, head
        status = " ".join(strip.text for strip in app.status_line.render_lines(Region(0, 0, *app.status_line.size)))
        assert "LIVE" in status and "hang" not in status, status
        assert app.check_action("profile", ()) and not app.check_action("bucket", ())
        await pilot.press("p")
        deadline = time.monotonic() + 30
        while not any(n.startswith("profile: 1 s of torch.profiler") or "no rank" in n for n in notes):
            assert time.monotonic() < deadline, notes
            await pilot.pause(0.2)
        await pilot.press("q")
        await pilot.pause(0.5)
    said = next(n for n in notes if n.startswith("profile: 1 s"))
    assert "from 2 rank(s)" in said and "no module records" in said, said
    prof = re.search(r"written to (\S+)", said).group(1)
    assert sorted(os.listdir(prof)) == ["rank0.json", "rank1.json"]
    got = run_main("summary", prof)  # the traces directory `ddptui replay DIR` opens
    assert got.returncode == 0 and re.search(r"│ ddp\s+│\s+2 │", got.stdout), got.stdout + got.stderr
    assert run.state == "stopped"
    got = run_main("summary", str(rec))
    assert got.returncode == 0 and "attached to 127.0.0.1" in got.stdout and "no hang" in got.stdout, got.stdout


# -- the hang, headless ---------------------------------------------------------------------------
class Lines:
    """A process's lines as they come, each with when it came (time.time())."""

    def __init__(self, stream):
        self.got: list[tuple[float, str]] = []
        self.t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.t.start()

    def _read(self, stream):
        for line in stream:
            self.got.append((time.time(), line.rstrip("\n")))

    def wait(self, pattern: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.got):
                if re.search(pattern, line):
                    return t, line
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s: {[x for _, x in self.got]}")

    def text(self) -> str:
        return "\n".join(x for _, x in self.got)


def test_headless_names_the_hang_within_5_s_with_the_late_ranks_line(job, tmp_path):
    rec, js = tmp_path / "hang.ddptui", tmp_path / "hang.json"
    p = start_cli("attach", _target(job), "--headless", "--record", str(rec), "--json", str(js),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = Lines(p.stdout), Lines(p.stderr)
    try:
        err.wait(r"^ddptui: attached to 127\.0\.0\.1:\d+: 2 ranks", 20)
        err.wait(r"^ddptui: Ctrl-C stops", 5)
        import psutil
        assert psutil.Process(p.pid).nice() == 10  # (an observer: the job's cores first, --nice)
        time.sleep(1.0)  # (a poll of the healthy job first)
        began = time.time()
        open(job.hang, "w").close()  # rank 1 stops before its next step
        t, line = out.wait(r"^hang: ", 15)
        assert t - began <= NAMED_WITHIN_S + 0.1, (t - began, line)  # (+ rank 1's last step, at most 0.1 s)
        assert re.search(r"default_pg \[ranks 0, 1\] all_reduce #\d+ \(.*\): rank 0 inside it for [\d.]+ s; "
                         r"rank 1 never issued it, named ([\d.]+) s after it began", line), line
        assert float(re.search(r"named ([\d.]+) s after", line).group(1)) <= NAMED_WITHIN_S
        _, where = out.wait(r"^  rank 1 is at ", 5)
        assert where == f"  rank 1 is at attach_job.py:{STALL_LINE} in stall_here", where
        out.wait(rf'File ".*attach_job\.py", line {STALL_LINE} in stall_here', 5)
        time.sleep(0.6)  # (the hang's step drawn again as it lasts)
    finally:
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    out.t.join(5)
    err.t.join(5)
    assert rc == 1, err.text()  # a hang stands at the end
    assert "Traceback" not in err.text() and f"recorded to {rec}" in err.text(), err.text()
    doc = json.loads(js.read_text())
    (named,) = doc["flight_recorder"]["named"]
    assert named["kind"] == "hang" and named["never_issued"] == [1] and list(named["inside"]) == ["0"]
    assert named["named_after_s"] <= NAMED_WITHIN_S
    assert named["stacks"]["1"]["where"] == f"attach_job.py:{STALL_LINE} in stall_here"
    # the recording replays: the hang in its last step (rank 0 inside the all_reduce for
    # seconds, rank 1 never in it) and the verdict in its report
    got = run_main("summary", str(rec))
    assert got.returncode == 0, got.stderr
    assert re.search(rf"named: hang default_pg all_reduce #\d+, [\d.]+ s after it began; rank 1 at "
                     rf"attach_job.py:{STALL_LINE} in stall_here", got.stdout), got.stdout
    assert run_main("replay", str(rec), "--headless").returncode == 0
    loaded = load(str(rec))
    st = loaded.store
    last = st.complete_steps("ddp")[-1]
    batches = st.step_batches("ddp", last)
    long0 = max((int(t1) - int(t0) for k, t0, t1 in zip(batches[0].kind, batches[0].t0, batches[0].t1) if k != 0),
                default=0)
    assert long0 >= 1_000  # µs... at least a second inside it (µs columns)
    assert doc["flight_recorder"]["verdict"].startswith("hang: default_pg")


@pytest.mark.asyncio
async def test_the_attach_screen_names_the_hang_and_o_shows_the_late_ranks_stack(job):
    """The job hung (by the test above): attached now, the first poll names it (it began long
    ago, and its group has made no progress since): the headline and the status line say it
    with rank 1's line, key `o` shows rank 1's stack, and `p` takes no profile of a hung job."""
    from textual.geometry import Region

    from ddptui.ui.app import DdpApp
    from ddptui.ui.widgets.output import OutputScreen

    assert os.path.exists(job.hang), "runs after the headless test made the job hang"
    notes: list[str] = []

    class App(DdpApp):
        def notify(self, message, **kw):
            notes.append(str(message))
            return super().notify(message, **kw)

    def text(w) -> str:
        return " ".join(strip.text for strip in w.render_lines(Region(0, 0, *w.size)))

    run = AttachRun(AttachOptions("127.0.0.1", job.port))
    run.connect()
    app = App(run)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        deadline = time.monotonic() + 15
        while run.watch.current is None or not run.polls:
            assert time.monotonic() < deadline, (run.polls, run.message)
            await pilot.pause(0.2)
        await pilot.pause(0.3)
        app.redraw()
        await pilot.pause()
        where = f"attach_job.py:{STALL_LINE} in stall_here"
        assert "hang: default_pg all_reduce #" in text(app.headline) and where in text(app.headline), text(app.headline)
        assert "r1 never issued it" in text(app.status_line), text(app.status_line)
        await pilot.press("o")
        deadline = time.monotonic() + 10  # (the screen composed: a loaded machine takes its time)
        while not (isinstance(app.screen, OutputScreen) and app.screen.query("#output-body")):
            assert time.monotonic() < deadline, app.screen
            await pilot.pause(0.1)
        await pilot.pause(0.1)
        shown = text(app.screen.query_one("#output-body"))
        assert "Python stack of rank 1" in shown and f"line {STALL_LINE} in stall_here" in shown, shown
        await pilot.press("escape")
        await pilot.press("p")
        await pilot.pause(0.5)
        assert any("not taken: the job is not seen training" in n for n in notes), notes
        await pilot.press("q")
        await pilot.pause(0.5)
    assert run.state == "stopped"


# -- ranks that do not answer, and bad input -----------------------------------------------------
class _Fake(http.server.BaseHTTPRequestHandler):
    """A debug server that answers badly: HTML, too slowly, or too much."""
    mode = "html"

    def do_POST(self):
        if self.mode == "slow":
            time.sleep(4)
        self.send_response(200)
        if self.mode == "huge":
            self.send_header("Content-Length", str(200 << 20))
            self.end_headers()
            return
        body = b"<html><body>not here</body></html>"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # (the client gave up first: a slow answer's)

    def log_message(self, *a):
        pass


def _fake(mode: str) -> http.server.ThreadingHTTPServer:
    cls = type(f"Fake{mode}", (_Fake,), {"mode": mode})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None  # (a client that gave up: nothing to say)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _own_store(keys: dict[str, str]):
    """A TCPStore of the test's own (not the job's: attach never writes to one)."""
    import datetime

    import torch.distributed as dist
    st = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    for k, v in keys.items():
        st.set(k, v)
    return st


def test_ranks_that_answer_badly_are_said_once_and_the_others_go_on(job):
    fakes = {m: _fake(m) for m in ("html", "slow", "huge")}
    h0, p0 = job.servers[0]
    st = _own_store({"debug_server/rank0": f"http://{h0}:{p0}",
                     "debug_server/rank1": f"http://127.0.0.1:{_free_port()}",
                     "debug_server/rank2": f"http://127.0.0.1:{fakes['html'].server_address[1]}",
                     "debug_server/rank3": f"http://127.0.0.1:{fakes['slow'].server_address[1]}",
                     "debug_server/rank4": f"http://127.0.0.1:{fakes['huge'].server_address[1]}",
                     "debug_server/rank6": "ftp://nowhere"})
    try:
        got = run_main("attach", f"127.0.0.1:{st.port}", "--headless", "--duration", "2.5", "--interval", "0.5", "--timeout", "1",
                       "--max-reply-mb", "1", "--no-record")
    finally:
        for f in fakes.values():
            f.shutdown()
    err = got.stderr
    assert got.returncode in (0, 1) and "Traceback" not in err, err
    assert "attached to 127.0.0.1" in err and "7 ranks" in err, err
    for says in ("rank 1: unreachable (connection refused", "rank 2: not JSON (an HTML page?)",
                 "rank 3: no answer within 1 s", "rank 4: a reply of 200 MB, over the 1 MB cap (not read)",
                 "rank 5: no debug_server/rank5 key in the store", "rank 6: its registered address 'ftp://nowhere'"):
        lines = [x for x in err.splitlines() if says in x]
        assert len(lines) == 1, (says, err)  # said once, not at every poll
    polls = [int(m) for m in re.findall(r"(\d+) poll\(s\) of 5 rank\(s\)", err)]
    assert polls and polls[-1] >= 2, err  # rank 0 read poll after poll


@pytest.mark.parametrize("target, says", [
    ("node0", "'node0' is not HOST:PORT"),
    ("node0:0", "port 0 is not 1..65535"),
    ("no-such-host.invalid:29500", "no such host"),
    ("127.0.0.1:{closed}", "nothing listens on port"),
    ("127.0.0.1:{http}", "answers, but not as a PyTorch TCPStore"),
    ("127.0.0.1:{store}", "no rank registered a debug server in it (no debug_server/rank<N> key): the job must "
                          "call torch.distributed.debug.start_debug_server() on every rank (a job still starting "
                          "registers it after init_process_group: try again in a few seconds)"),
])
def test_bad_input_is_one_line_and_exit_2(target, says):
    fake = _fake("html") if "{http}" in target else None
    st = _own_store({"other/key": "1"}) if "{store}" in target else None
    target = target.format(closed=_free_port(), http=fake.server_address[1] if fake else 0, store=st.port if st else 0)
    t0 = time.monotonic()
    try:
        got = run_main("attach", target, "--headless", "--timeout", "1")
    finally:
        if fake is not None:
            fake.shutdown()
    assert got.returncode == 2 and got.stdout == "", got
    lines = got.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error: ") and says in lines[0], got.stderr
    assert time.monotonic() - t0 < 5  # never a hang


def test_a_target_that_is_not_host_port_is_said_before_the_ui_asks_for_a_terminal():
    got = run_main("attach", "127.0.0.1")  # (no --headless, and no terminal: the target is what is wrong)
    assert got.returncode == 2 and got.stdout == "", got
    assert got.stderr.splitlines() == ["ddptui: error: '127.0.0.1' is not HOST:PORT (the job's "
                                       "MASTER_ADDR:MASTER_PORT, e.g. node0:29500)"], got.stderr


# -- memory over a long attach ----------------------------------------------------------------------
SIM_POLLS = 200  # polls (at one a second: over 3 minutes)
SIM_PER_POLL = 10  # the job's collectives between two polls
SIM_BUFFER = 60  # entries a rank's buffer holds (TORCH_FR_BUFFER_SIZE)
SIM_KEEP = 30  # steps the Store keeps (the attach's default: 200, and 2,000 steps' figures)


def test_memory_stays_bounded_over_a_long_attach(job):
    """The job's real buffers (rank 0's and 1's fr_trace_json while it trained) advanced poll
    by poll as a job that keeps issuing collectives fills them, through the attach's own path
    (AttachRun.take: the buffers read, the verdict, the watch, the frames, the Store): once
    the Store holds all the steps it keeps, the objects Python holds must stop growing (its
    allocated blocks between the middle and the end of the run: no more than noise). Over 3
    hours (10,800 polls) with the attach's own limits: docs/attach.md."""
    docs = {r: msgspec.json.decode(b) for r, b in job.bodies.items()}
    tmpl = {r: [e for e in d["entries"] if str(e.get("profiling_name")).endswith("all_reduce")][-1]
            for r, d in docs.items()}
    t0 = time.time_ns()

    def body(r: int, i: int) -> bytes:
        top = i * SIM_PER_POLL
        es = [dict(tmpl[r], collective_seq_id=j + 1, record_id=j, op_id=j + 1, retired=True,
                   time_created_ns=t0 + j * 50_000_000) for j in range(max(0, top - SIM_BUFFER), top)]
        last = str(top)
        return msgspec.json.encode(dict(docs[r], entries=es, pg_status={"0": {
            "last_completed_collective": last, "last_enqueued_collective": last, "last_started_collective": "-1"}}))

    run = AttachRun(AttachOptions("127.0.0.1", job.port, keep_steps=SIM_KEEP, keep_figures=SIM_KEEP))
    run.world = 2
    blocks = {}
    for i in range(1, SIM_POLLS + 1):
        now_ns = t0 + i * SIM_PER_POLL * 50_000_000 + 10_000_000
        run.take({r: debugserver.Reply(True, body(r, i)) for r in (0, 1)}, now_ns, i * 1.0)
        if i in (SIM_POLLS // 2, SIM_POLLS):
            gc.collect()
            blocks[i] = sys.getallocatedblocks()
    assert run.watch.current is None and run.stream.steps >= SIM_POLLS - 1
    assert len(run.stream.drawn) <= 2 * SIM_BUFFER  # (the keys drawn: only what a buffer holds)
    assert len(run.store.complete_steps("ddp")) <= SIM_KEEP * 2
    grew = blocks[SIM_POLLS] - blocks[SIM_POLLS // 2]
    assert grew < 2000, f"{grew} more blocks after {SIM_POLLS} polls than after {SIM_POLLS // 2}"


def test_the_hang_step_sent_again_at_each_poll_grows_in_the_store():
    """While a hang lasts, attach sends its step again at every poll (recording/frstream.py),
    longer each time: the live Store figures it anew from the spans as they are now (before,
    the step kept the figures of its first poll on screen while its spans grew)."""
    from ddptui.model import frverdict
    from ddptui.model.store import Store
    from ddptui.recording.frdump import read_dump
    from ddptui.recording.frstream import FrStream, run_meta
    d = os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo")
    raw = {r: read_dump(os.path.join(d, f"nccl_trace_rank_{r}")) for r in (0, 1)}
    first = {r: frverdict.rank_dump(raw[r], r) for r in raw}
    made = [e.created_ns for x in first.values() for e in x.entries if e.created_ns]
    st, stream = Store(), FrStream(2, min(made), first[0].backend)
    st.set_meta(run_meta(2, first[0].backend, "127.0.0.1:1", []))

    def poll(at: int) -> tuple[int, float]:
        dumps = {r: frverdict.rank_dump(raw[r], r, at) for r in raw}
        for f in stream.poll(dumps, frverdict.verdict(dumps), at, True):
            st.ingest(f)
        st.update()
        figs = st.step_figs["ddp"]
        return max(figs), figs[max(figs)].step_ms

    k1, a = poll(max(made) + 200_000_000)
    k2, b = poll(max(made) + 900_000_000)
    assert k1 == k2 and abs((b - a) - 700) < 1, (k1, k2, a, b)
    for r in (0, 1):  # (the HTA totals hold each step once, the hang's as it is now)
        total = sum(f.comm_ms for (s, _k, q), f in st.rank_figs.items() if s == "ddp" and q == r)
        assert abs(st.hta_acc[("ddp", r)][0] - total) < 1e-6, (r, st.hta_acc[("ddp", r)], total)


def test_every_step_the_buffers_hold_is_drawn_each_a_step_of_the_job():
    """Between two polls a job makes many steps; each is drawn as a step of its own: the
    collectives repeat (DDP's two buckets a step, of two sizes), a step is one period of them,
    cut where the job paused longest (its forward and optimizer), even where the buffer begins
    mid-step; a last step not yet whole (its second bucket in flight) waits for the next poll,
    which draws it whole. (Before, a step was whatever the job did between two polls: about
    one drawn step for every twenty of the job's.)"""
    from ddptui.model import frverdict
    from ddptui.model.store import Store
    from ddptui.recording.frdump import read_dump
    from ddptui.recording.frstream import FrStream, run_meta
    tmpl = [e for e in read_dump(os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo", "nccl_trace_rank_0"))["entries"]
            if "all_reduce" in str(e.get("profiling_name"))][-1]
    t0 = 1_795_814_961_000_000_000
    ms = 1_000_000

    def raw(n_steps: int, last_done: bool) -> dict:
        """A rank's buffer after n_steps steps of two buckets (A: 1,000 floats, then B: 10,
        5 ms apart; steps 50 ms apart), its first step's A gone (the buffer wrapped)."""
        es, seq = [], 0
        for j in range(n_steps):
            for b, size in enumerate((1000, 10)):
                seq += 1
                if j == 0 and b == 0:
                    continue
                done = last_done or not (j == n_steps - 1 and b == 1)
                made = t0 + j * 50 * ms + b * 5 * ms
                es.append(dict(tmpl, record_id=seq - 1, collective_seq_id=seq, op_id=seq,
                               input_sizes=[[size]], output_sizes=[[size]], time_created_ns=made,
                               state="completed" if done else "started",
                               time_discovered_started_ns=made + ms,
                               time_discovered_completed_ns=made + 2 * ms if done else None,
                               retired=done))
        last = seq if last_done else seq - 1
        return {"version": "2.10", "pg_config": {}, "entries": es, "pg_status": {"0": {
            "last_enqueued_collective": seq, "last_started_collective": seq, "last_completed_collective": last}}}

    st, stream = Store(), FrStream(2, t0, "gloo")
    st.set_meta(run_meta(2, "gloo", "127.0.0.1:1", []))

    def poll(n_steps: int, last_done: bool) -> None:
        dumps = {r: frverdict.rank_dump(raw(n_steps, last_done), r, t0 + n_steps * 50 * ms) for r in (0, 1)}
        for f in stream.poll(dumps, frverdict.verdict(dumps), t0 + n_steps * 50 * ms, False):
            st.ingest(f)

    from ranks.wire import COLL

    def drawn() -> dict[int, int]:  # step -> its collectives a rank (rank 0's, rank 1's the same)
        out = {}
        for k, by_rank in st.span_batches()["ddp"].items():
            per = {r: sum(1 for kd in b.kind if kd == COLL) for r, b in by_rank.items()}
            assert per[0] == per[1], (k, per)
            out[k] = per[0]
        return out

    poll(8, last_done=False)  # the 8th step's B still in flight: steps 1-6 drawn whole, B of 0 alone
    assert drawn() == {0: 1, **{k: 2 for k in range(1, 7)}}, drawn()
    poll(12, last_done=True)  # the 8th step whole now, and four more
    assert drawn() == {0: 1, **{k: 2 for k in range(1, 12)}}, drawn()
    assert stream.steps == 12 and stream.per_drawn == 1
    # 80 more between two polls (a host-bound job): more than DRAWN_MAX drawn apart, so three of
    # the job's steps to a drawn step, every collective drawn, said (per_drawn)
    from ddptui.recording.frstream import DRAWN_MAX
    poll(92, last_done=True)
    got = drawn()
    later = [got[k] for k in sorted(got) if k >= 12]
    assert stream.per_drawn == 3 and len(later) <= DRAWN_MAX and sum(later) == 160, (stream.per_drawn, later)
    assert later[:-1] == [6] * (len(later) - 1), later


# -- how often it polls ----------------------------------------------------------------------------
def _drawn_keys(bodies, t0: int, until_s: float) -> tuple:
    """An attach of 2 ranks polled at its own pace from 0.3 s to `until_s`, `bodies(at)` its
    replies: (the AttachRun, every collective's key in the order it was drawn)."""
    from ddptui.recording import frstream
    keys: list = []
    real = frstream.FrStream._step

    def step(self, ks, *a, **k):
        keys.extend(ks)
        return real(self, ks, *a, **k)
    run = AttachRun(AttachOptions("127.0.0.1", 1, interval_s=1.0))
    run.world = 2
    at = 0.3
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(frstream.FrStream, "_step", step)
        while at < until_s:
            run.take(bodies(at), t0 + int(at * 1e9), at)
            at += run.next_gap()
    return run, keys


def _job_bodies(t0: int, at_s: float, per_s: int, buffer: int, hang_at_s: float | None = None) -> dict:
    """Each rank's fr_trace_json at `at_s` s into a gloo job making `per_s` all_reduces a second
    (a buffer of `buffer` entries); from `hang_at_s` rank 1 issues no more and rank 0 stands
    inside the first all_reduce it issued after."""
    from ddptui.recording.frdump import read_dump
    tmpl = [e for e in read_dump(os.path.join(ROOT, "demo", "fr-hang-2ranks-gloo", "nccl_trace_rank_0"))["entries"]
            if "all_reduce" in str(e.get("profiling_name"))][-1]
    hung = hang_at_s is not None and at_s >= hang_at_s
    done = int((hang_at_s if hung else at_s) * per_s)
    out = {}
    for r in (0, 1):
        top = done + (1 if hung and r == 0 else 0)
        es = [dict(tmpl, record_id=j, collective_seq_id=j + 1, op_id=j + 1, retired=j < done, state="scheduled",
                   time_created_ns=t0 + (j + 1) * 1_000_000_000 // per_s) for j in range(max(0, top - buffer), top)]
        out[r] = debugserver.Reply(True, msgspec.json.encode({"version": "2.10", "pg_config": {}, "entries": es,
                                   "pg_status": {"0": {"last_enqueued_collective": str(top), "last_started_collective": "-1",
                                                       "last_completed_collective": str(done)}}},
                                   order="sorted"))  # (keys sorted, as torch writes them)
    return out


def _polled(hang_at_s: float | None, until_s: float, per_s: int = 20, buffer: int = 200,
            interval_s: float = 1.0) -> tuple[AttachRun, list[float], float | None]:
    """AttachRun fed a simulated job at the moments its own next_gap() asks for (a clock of its
    own: nothing sleeps); the polls' moments and when a hang was named (s)."""
    run = AttachRun(AttachOptions("127.0.0.1", 1, interval_s=interval_s))
    run.world = 2
    t0 = time.time_ns() - 60_000_000_000
    at, polls, named = 0.3, [], None
    while at < until_s and named is None:
        run.take(_job_bodies(t0, at, per_s, buffer, hang_at_s), t0 + int(at * 1e9), at)
        polls.append(at)
        if run.watch.current is not None:
            named = at
        at += run.next_gap()
    return run, polls, named


def test_a_healthy_job_is_polled_less_often_and_a_hang_still_named_within_3_s():
    """A poll makes every rank dump its whole buffer (what attaching costs the job), so a job
    seen progressing is polled every IDLE_S, reading each rank's newest TAIL entries once its
    whole buffer was read; the first polls, a collective standing stuck and a hang named are
    polled at --interval (or at the moment a stuck one would be named), reading whole buffers:
    a hang is named as soon as with one poll a second, wherever it falls between two polls. A
    job faster than TAIL a poll is polled no faster (before: at half its buffer's fill time),
    drawn on a sample, said."""
    from ddptui.live.attach import EMPTY_POLLS, IDLE_S, TAIL
    run, polls, named = _polled(None, 30.0)
    gaps = [round(b - a, 3) for a, b in zip(polls, polls[1:])]
    assert gaps[:EMPTY_POLLS - 1] == [1.0] * (EMPTY_POLLS - 1) and set(gaps[EMPTY_POLLS:]) == {IDLE_S}, gaps
    assert run.stream.steps > 0 and run.watch.current is None
    assert run.tail_reads == 0 and run.unread == 0  # (a buffer of 200, under TAIL: read whole)
    # a buffer of 1,000 filled at 400 entries a second: still polled every IDLE_S, each rank's
    # newest TAIL read of the ~1,000 it made between two polls, the rest counted and said
    run, polls, _ = _polled(None, 20.0, per_s=400, buffer=1000, interval_s=0.5)
    assert {round(b - a, 3) for a, b in zip(polls[4:], polls[5:])} == {IDLE_S}, polls
    assert run.entries_seen == 2 * TAIL and run.tail_reads == 2 * (len(polls) - 1), (run.entries_seen, run.tail_reads)
    assert run.unread >= 2 * (len(polls) - 5) * (1000 - TAIL), run.unread
    said = []
    while not run.lines.empty():
        said.append(run.lines.get()[1])
    assert sum("a sample of its steps" in x for x in said) == 1, said
    # a hang anywhere between two idle polls: named within 3 s of its start (before: up to 1 s
    # of polling and then 2 s of no progress counted from the poll that first saw it)
    _, healthy, _ = _polled(None, 12.0)
    last = healthy[-1]
    for k in range(6):
        began = last + k * IDLE_S / 5
        run, polls, at = _polled(began, began + 10)
        assert at is not None, (began, polls)
        first_issued = (int(began * 20) + 1) / 20  # (rank 0's all_reduce that rank 1 never issues)
        assert at - first_issued <= 3.0, (k, began, polls[-4:])
        assert run.watch.current.never == [1] and run.next_gap() == 1.0
    # the same in a job read by its tails (400 collectives a second): named as soon, by a poll of
    # whole buffers, never behind where a tail read began
    for k in (0, 3):
        began = last + k * IDLE_S / 5
        run, polls, at = _polled(began, began + 10, per_s=400, buffer=1000)
        assert at is not None and run.tail_reads > 0 and run.tail() is None, (began, polls)
        first_issued = (int(began * 400) + 1) / 400
        assert at - first_issued <= 3.0 and run.watch.current.never == [1], (k, began, polls[-4:])


def test_the_typed_read_of_a_poll_is_the_tolerant_reads(job):
    """A poll's JSON is decoded straight into typed entries (frverdict.rank_dump_json, a poll's
    most work halved): the same RankDump as the tolerant read of its dict, on the job's real
    buffers, read fresh and again through the cache (every entry a hit), and on JSON of
    another shape (numbers as text, an entry of no shape), which takes the tolerant path."""
    from ddptui.model import frverdict
    for r, body in job.bodies.items():
        want = frverdict.rank_dump(msgspec.json.decode(body), r, 5)
        cache: dict = {}
        for _ in range(2):
            got = frverdict.rank_dump_json(body, r, 5, cache=cache)
            assert got == want and len(got.entries) >= 5 and got.status, (r, len(got.entries), got == want)
        odd = msgspec.json.decode(body)
        odd["entries"][0]["record_id"] = str(odd["entries"][0]["record_id"])  # (numbers as text)
        odd["entries"].append({"profiling_name": 7})  # (an entry of no shape: skipped, counted)
        want = frverdict.rank_dump(msgspec.json.decode(msgspec.json.encode(odd)), r, 5)
        got = frverdict.rank_dump_json(msgspec.json.encode(odd), r, 5, cache=cache)
        assert got == want and got.skipped == 1, (got.skipped, want.skipped)
        # the newest entries only, cut from the JSON undecoded: the whole read's last ones
        n = len(want.entries) // 2
        whole = frverdict.rank_dump_json(body, r, 5)
        tail = frverdict.rank_dump_json(body, r, 5, tail=n)
        assert tail.entries == whole.entries[-n:] and tail.cut == whole.entries[-n].record_id, r
        assert tail.status == whole.status and tail.group_ranks == whole.group_ranks
        assert frverdict.rank_dump_json(body, r, 5, tail=len(whole.entries) + 1).cut is None  # (no more: whole)
        unsorted = msgspec.json.encode({"entries": [dict(reversed(list(e.items())))
                                                    for e in msgspec.json.decode(body)["entries"]]})
        assert frverdict.rank_dump_json(unsorted, r, 5, tail=n).cut is None  # (not cut where it cannot tell)
    with pytest.raises(msgspec.DecodeError):
        frverdict.rank_dump_json(b"<html>", 0)
    with pytest.raises(frverdict.DumpFormatError):
        frverdict.rank_dump_json(b"[1, 2]", 0)
    empty = frverdict.rank_dump_json(b'{"version": "2.10", "pg_status": {}}', 0)
    assert empty.entries == [] and empty.version == "2.10"


def test_an_idle_interval_below_the_interval_is_one_line():
    """--idle-interval under --interval would poll a healthy job more often than one that may
    hang: refused in one line, before anything connects (nothing listens at the target)."""
    got = run_main("attach", "127.0.0.1:1", "--headless", "--interval", "2", "--idle-interval", "0.5")
    assert got.returncode == 2 and got.stdout == "", got
    assert got.stderr.splitlines() == ["ddptui: error: --idle-interval 0.5 s is less than --interval 2 s: a healthy "
                                       "job is never polled more often than one that may hang (give --interval 0.5 "
                                       "for one rate)"], got.stderr


# -- reading the tails: what must not be lost ------------------------------------------------------
def _side_bodies(t0: int, at_s: float, side_at_s: float, block_after_s: float, per_s: int = 400,
                 buffer: int = 2000, prior: int = 0) -> dict:
    """A gloo job making `per_s` all_reduces a second on default_pg (a `buffer`-entry buffer);
    both ranks ran `prior` all_reduces on a side group early on; at `side_at_s` rank 0 issues
    one more there that rank 1 never issues, and both go on with default_pg until
    `block_after_s` later, when rank 1 stands inside one that rank 0 never issues (rank 0 now
    waiting on the side one): the root is the side group's."""
    def entry(rid, pg, seq, retired, t_ns):
        return {"record_id": rid, "pg_id": pg, "process_group": [str(pg), "default_pg" if pg == 0 else "side"],
                "thread_name": "python", "thread_id": "1", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
                "profiling_name": "gloo:all_reduce", "time_created_ns": t_ns, "input_sizes": [[7]],
                "input_dtypes": ["Float"], "output_sizes": [[7]], "output_dtypes": ["Float"], "state": "scheduled",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": retired,
                "timeout_ms": 600000, "is_p2p": False}
    out = {}
    side_n, block = int(side_at_s * per_s), int((side_at_s + block_after_s) * per_s)
    for r in (0, 1):
        n = int(at_s * per_s)
        if at_s >= side_at_s:
            n = min(n, block + (1 if r == 1 else 0))
        es, rid, side = [], 0, 0
        for j in range(n):
            if j == 10 and prior:  # (both: the side group's first ones, ended)
                for k in range(prior):
                    es.append(entry(rid, 1, k + 1, True, t0 + int(10 / per_s * 1e9)))
                    rid += 1
                side = prior
            if r == 0 and at_s >= side_at_s and j == side_n:
                es.append(entry(rid, 1, prior + 1, False, t0 + int(side_at_s * 1e9)))
                rid, side = rid + 1, prior + 1
            es.append(entry(rid, 0, j + 1, not (r == 1 and j == block), t0 + (j + 1) * 1_000_000_000 // per_s))
            rid += 1
        done = min(n, block) if at_s >= side_at_s else n
        status = {"0": {"last_enqueued_collective": n, "last_started_collective": -1, "last_completed_collective": done},
                  "1": {"last_enqueued_collective": side if side else -1, "last_started_collective": -1,
                        "last_completed_collective": prior if side else -1}}
        out[r] = debugserver.Reply(True, msgspec.json.encode({"version": "2.10", "pg_config": {}, "entries": es[-buffer:],
                                                               "pg_status": status}, order="sorted"))
    return out


@pytest.mark.parametrize("block_after_s, prior", [(100.0, 0), (0.75, 0), (100.0, 3), (0.75, 3)])
def test_a_collective_in_flight_behind_the_tail_is_still_the_hang_named(block_after_s, prior):
    """A rank stuck in a side group's all_reduce while default_pg goes on at 400 a second: the
    stuck one is buried under more than TAIL newer entries by the next poll, yet its group's
    pg_status says one is in flight that the tail does not hold, so that rank's whole buffer
    is read; the other rank, read by its tail (none of its side entries there), reads the
    group's pg_status through the side entries it read before (`prior`: the group used
    before, its numbers not -1): named as the side group's within 2.5 s wherever it falls
    between two polls (with tail reads alone: not named, late, or default_pg's later one named
    in its place)."""
    for side_at in (5.0, 5.6, 6.1, 6.9):
        run = AttachRun(AttachOptions("127.0.0.1", 1, interval_s=1.0))
        run.world = 2
        t0 = time.time_ns() - 60_000_000_000
        at, named = 0.3, None
        while at < side_at + 12 and named is None:
            run.take(_side_bodies(t0, at, side_at, block_after_s, prior=prior), t0 + int(at * 1e9), at)
            if run.watch.current is not None:
                named = (at, run.watch.current.group, run.watch.current.name)
            at += run.next_gap()
        assert run.tail_reads > 0 and named is not None, side_at
        assert named[1].startswith("side") and named[2] == f"all_reduce #{prior + 1}" and named[0] - side_at <= 2.5, \
            (side_at, named)


def test_a_tail_without_a_groups_entries_gives_it_no_status_to_misread():
    """NCCL's pg_status counts a point-to-point op by its own number, read through the group's
    entries: a tail holding none of the group's (a rank busy in another group since) leaves the
    group's status unknown, never its p2p number taken for its last collective (which would
    say the rank never issued collectives it did); a group that says nothing was ever issued
    in it keeps that."""
    from ddptui.model import frverdict

    def e(rid, pg, seq, op, p2p_seq=0):
        return {"record_id": rid, "pg_id": pg, "process_group": [str(pg), "default_pg" if pg == 0 else "undefined"],
                "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": seq + p2p_seq, "profiling_name": "nccl:" + op,
                "time_created_ns": 10**18 + rid, "input_sizes": [[7]], "input_dtypes": ["Float"], "output_sizes": [[7]],
                "output_dtypes": ["Float"], "state": "completed", "retired": True, "timeout_ms": 600000,
                "is_p2p": p2p_seq > 0, "time_discovered_started_ns": 10**18 + rid,
                "time_discovered_completed_ns": 10**18 + rid}

    def dump(r, later):
        es = [e(s - 1, 1, s, "all_reduce") for s in range(1, 6)]
        es.append(e(5, 1, 5, "send 1->0" if r == 1 else "recv 0<-1", p2p_seq=1))
        es += [e(6 + j, 2 + r, j + 1, "all_reduce") for j in range(later)]
        status = {"1": {"last_enqueued_collective": 1, "last_started_collective": 1, "last_completed_collective": 1},
                  "4": {"last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1}}
        cfg = {"1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}, "2": {"name": "2", "desc": "undefined", "ranks": "[0]"},
               "3": {"name": "3", "desc": "undefined", "ranks": "[1]"}}
        return msgspec.json.encode({"version": "2.10", "pg_config": cfg, "entries": es, "pg_status": status}, order="sorted")
    for tail in (None, 256):
        got = {0: frverdict.rank_dump_json(dump(0, 100), 0, tail=tail), 1: frverdict.rank_dump_json(dump(1, 400), 1, tail=tail)}
        assert got[1].cut == (None if tail is None else 406 - 256), got[1].cut
        assert "1" not in got[1].status if tail else got[1].status["1"] == (1, 1, 1)
        assert got[1].status["4"] == (-1, -1, -1)
        assert frverdict.verdict(got, 2).headline().startswith("no hang"), (tail, frverdict.verdict(got, 2).headline())


def test_a_rank_back_after_missed_polls_draws_nothing_twice_and_counts_nothing_unread():
    """A rank that did not answer for a few polls, read whole when it answers again (a hang
    pending): its entries from where its last tail began come back into view, but what was
    drawn is not drawn again; the collectives it made while not answering are not counted as
    a sample's (they were not between two polls it answered)."""
    from ddptui.recording import frstream
    drawn_twice, ever = [], set()
    real_step = frstream.FrStream._step

    def step(self, keys, *a, **k):  # (a key drawn as settled before, drawn again: `ever` is what was)
        drawn_twice.extend(key for key in keys if key in ever and key not in self.drawn)
        return real_step(self, keys, *a, **k)
    for down, hang_at in (((6.0, 9.5), 8.5), ((5.0, 9.0), 7.9), ((4.0, 7.0), 6.5)):
        drawn_twice.clear()
        ever.clear()
        run = AttachRun(AttachOptions("127.0.0.1", 1, interval_s=1.0))
        run.world = 2
        t0 = time.time_ns() - 60_000_000_000
        at = 0.3
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(frstream.FrStream, "_step", step)
            while at < 16:
                bodies = _job_bodies(t0, at, 400, 1000, hang_at)
                if down[0] <= at < down[1]:
                    bodies[1] = debugserver.Reply(False, b"", "no answer within 3 s")
                run.take(bodies, t0 + int(at * 1e9), at)
                if run.stream is not None:
                    ever.update(run.stream.drawn)
                at += run.next_gap()
        assert run.watch.current is not None and drawn_twice == [], (down, drawn_twice[:3])
    # 20 a second, rank 1 silent for 25 s: nothing unread (every poll it answered read all since)
    run = AttachRun(AttachOptions("127.0.0.1", 1, interval_s=1.0))
    run.world = 2
    t0, at = time.time_ns() - 60_000_000_000, 0.3
    while at < 60:
        bodies = _job_bodies(t0, at, 20, 2000, None)
        if 10 <= at < 35:
            bodies[1] = debugserver.Reply(False, b"", "no answer within 3 s")
        run.take(bodies, t0 + int(at * 1e9), at)
        at += run.next_gap()
    assert run.unread == 0 and run.tail_reads > 0, (run.unread, run.tail_reads)


def test_a_group_made_again_under_its_name_is_drawn_and_nccl_p2p_groups_keep_their_tails():
    """A job that destroys its process group and makes it again ("0" again, its collectives
    numbered from 1, the buffer going on): every collective after it is drawn (what was drawn
    and left the buffers holds back only collectives older than it was). An NCCL pipeline's
    group of sends and receives only, its newest in flight: read by its tail (its entries'
    state says the tail holds what is in flight; its numbers count point-to-point ops)."""
    from ddptui.model import frverdict
    per, buf, again = 20, 200, 30.0

    def bodies(t0, at):
        n, out = int(at * per), {}
        for r in (0, 1):
            es = []
            for j in range(max(0, n - buf), n):
                seq = j + 1 if j < again * per else j + 1 - int(again * per)
                es.append({"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[7]], "is_p2p": False,
                           "op_id": seq, "output_dtypes": ["Float"], "output_sizes": [[7]], "p2p_seq_id": 0,
                           "pg_id": 0 if j < again * per else 1, "process_group": ["0", "default_pg"],
                           "profiling_name": "gloo:all_reduce", "record_id": j, "retired": True, "state": "scheduled",
                           "thread_id": "1", "thread_name": "python", "time_created_ns": t0 + (j + 1) * 10**9 // per,
                           "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0, "timeout_ms": 600000})
            last = es[-1]["collective_seq_id"]
            st = {str(es[-1]["pg_id"]): {"last_enqueued_collective": str(last), "last_started_collective": "-1",
                                         "last_completed_collective": str(last)}}
            out[r] = debugserver.Reply(True, msgspec.json.encode({"version": "2.10", "pg_config": {}, "entries": es,
                                                                   "pg_status": st}, order="sorted"))
        return out
    t0 = time.time_ns() - 600 * 10**9
    _, got = _drawn_keys(lambda at: bodies(t0, at), t0, 80)
    seqs = [k[2] for k in got]
    i = next(i for i in range(1, len(seqs)) if seqs[i] < seqs[i - 1])  # (the group made again)
    assert seqs[i] == 1 and len(seqs) - i >= (80 - again) * per - 2 * per, (seqs[i:i + 3], len(seqs) - i)

    def e(rid, pg, coll, p2p, name, state):
        return {"collective_seq_id": coll, "input_dtypes": ["Float"], "input_sizes": [[7]], "is_p2p": p2p > 0,
                "op_id": rid + 1, "output_dtypes": ["Float"], "output_sizes": [[7]], "p2p_seq_id": p2p, "pg_id": pg,
                "process_group": [str(pg), "undefined"], "profiling_name": "nccl:" + name, "record_id": rid,
                "retired": state == "completed", "state": state, "thread_id": "1", "thread_name": "python",
                "time_created_ns": 10**18 + rid, "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0,
                "timeout_ms": 600000}
    es, rid, p, c = [], 0, 0, 0
    for _ in range(200):
        for _ in range(4):
            for name in ("send 0->1", "recv 0<-1"):
                p += 1
                es.append(e(rid, 1, 0, p, name, "completed"))
                rid += 1
        c += 1
        es.append(e(rid, 2, c, 0, "all_reduce", "completed"))
        rid += 1
    es[-2]["state"], es[-2]["retired"] = "started", False
    st = {"1": {"last_enqueued_collective": str(p), "last_started_collective": str(p), "last_completed_collective": str(p - 1)},
          "2": {"last_enqueued_collective": str(c), "last_started_collective": str(c), "last_completed_collective": str(c)}}
    body = msgspec.json.encode({"version": "2.10", "pg_config": {}, "entries": es, "pg_status": st}, order="sorted")
    d = frverdict.rank_dump_json(body, 0, tail=256)
    assert d.cut is not None and len(d.entries) == 256, (d.cut, len(d.entries))


def test_whole_reads_after_tails_draw_nothing_behind_what_the_tails_drew():
    """A fast job read by its tails (400 a second: a sample), then a hang: the whole buffers
    read while it is pending and named hold the collectives between the tails, never read;
    they are not drawn then, out of order (`_floor`: nothing below where a tail began)."""
    t0 = time.time_ns() - 60_000_000_000
    run, keys = _drawn_keys(lambda at: _job_bodies(t0, at, 400, 1000, 9.0), t0, 14)
    seqs = [k[2] for k in keys]
    assert run.watch.current is not None and run.unread > 0 and run.tail_reads > 0
    assert all(b >= a for a, b in zip(seqs, seqs[1:])), [(a, b) for a, b in zip(seqs, seqs[1:]) if b < a][:3]
