"""Faults with real processes: ranks killed or hung, ddptui interrupted, stalled or killed,
hostile clients, bad environments, NVML failing, long runs. Nothing may be left running."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import types

import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as hs

from ddptui.recording.reader import Reader
from ranks import frames as _fr
from ddptui.model.store import Store

from .bad_frames import bad_frame, frame_rank
from .helpers import StubNvml, assert_no_leftovers, run_main, start_cli, wait_no_workers, worker_procs

SHUTDOWN_WINDOW_S = 10.0
STALL_S = 2.0  # one stop of the stalled-app test: the app does nothing for this long


def _ranks_dropped(rec) -> int:
    """Spans the ranks say they dropped (their heartbeats, as recorded)."""
    drops = {}
    for _, f in Reader(str(rec)):
        if type(f) is _fr.Hb:
            drops[f.rank] = f.dropped
    return sum(drops.values())


class Headless:
    """A real `ddptui --headless` process whose stderr is read line by line."""

    def __init__(self, *args, record=None, env=None):
        rec = ["--record", str(record)] if record else ["--no-record"]
        self.p = start_cli("--headless", "--gpus", "2", "--model", "small", "--batch-size", "256", *args, *rec,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ln in self.lines:
                if needle in ln:
                    return ln
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"never saw {needle!r}; stderr so far:\n" + "\n".join(self.lines))

    def steps(self, strategy: str) -> int:
        """The steps of `strategy` the last progress line counts (0 before any)."""
        pat = re.compile(rf"\b{strategy} (\d+)")
        for ln in reversed(self.lines):
            m = pat.search(ln) if ln.startswith("ddptui: steps:") else None
            if m:
                return int(m.group(1))
        return 0

    def wait_steps(self, strategy: str, n: int, timeout: float = 90.0) -> None:
        """Until the progress line says `strategy` has completed at least n steps."""
        pat = re.compile(rf"\b{strategy} (\d+)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ln in reversed(self.lines):
                m = pat.search(ln) if ln.startswith("ddptui: steps:") else None
                if m and int(m.group(1)) >= n:
                    return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{strategy} never reached {n} steps; stderr:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 60.0) -> int:
        self.p.wait(timeout)
        self._reader.join(5)
        self.out = self.p.stdout.read()
        return self.p.returncode

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)


def rank_pid(rank: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in worker_procs():
            try:
                if "torch.distributed.run" not in " ".join(p.cmdline()) and p.environ().get("RANK") == str(rank):
                    return p.pid
            except psutil.Error:
                pass
        time.sleep(0.1)
    raise AssertionError(f"no worker process for rank {rank}")


def replay_steps(path) -> tuple[dict, str | None]:
    r = Reader(str(path))
    st = Store()
    st.set_meta(r.meta)
    for _, f in r:
        st.ingest(f)
    st.update()
    return {s: st.complete_steps(s) for s in st.strategies()}, r.damage


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    assert_no_leftovers(SHUTDOWN_WINDOW_S)


@pytest.mark.slow
def test_rank_killed_mid_run(tmp_path):
    rec = tmp_path / "killed.ddptui"
    h = Headless("--steps", "0", "--strategies", "naive", record=rec)  # (DDP adds nothing here)
    h.wait_steps("naive", 3)
    os.kill(rank_pid(1), signal.SIGKILL)
    rc = h.finish()
    assert rc == 1
    err = [ln for ln in h.lines if ln.startswith("ddptui: error:")]
    assert err and "rank 1 killed by SIGKILL" in err[-1], h.stderr
    assert "Traceback" not in h.stderr
    assert_no_leftovers(SHUTDOWN_WINDOW_S)
    steps, damage = replay_steps(rec)
    assert damage is None  # ddptui itself closed the recording properly
    assert len(steps["naive"]) >= 2


@pytest.mark.slow
def test_hung_rank_detected(tmp_path):
    # (naive alone: a hang is a collective that never ends whatever the strategy; DDP's first
    # construction costs each rank ~2 s of CPU importing torch._dynamo)
    h = Headless("--steps", "0", "--pg-timeout", "5", "--strategies", "naive")
    h.wait_for("steps:")
    pid = rank_pid(1)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        rc = h.finish(timeout=60)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    elapsed = time.monotonic() - t0
    assert rc == 1
    assert elapsed < 40, f"hang took {elapsed:.0f} s to report"
    # shown at once (no heartbeat for 5 s), before the collective times out; progress lines
    # ("rank 1: rendezvous…") name rank 1 too, so only the warning line itself counts
    assert [ln for ln in h.lines if ln.startswith("ddptui: warning: rank 1 not responding")], h.stderr
    err = [ln for ln in h.lines if ln.startswith("ddptui: error:")]
    assert err and re.search(r"\brank [01]\b", err[-1]), h.stderr
    assert "Traceback" not in h.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig,when", [
    (signal.SIGINT, "spawning torchrun"),
    # heavy: SIGINT is covered in CI at start-up (above), an interrupt while training by SIGTERM's
    # (below), on the same handler; SIGTERM while training: in CI, the end of
    # test_app_stalled_training_goes_on_and_drops_are_counted's run, held to the same
    pytest.param(signal.SIGINT, "steps:", marks=pytest.mark.heavy),
    (signal.SIGTERM, "rank 0 connected"),
    pytest.param(signal.SIGTERM, "steps:", marks=pytest.mark.heavy),
])
def test_interrupt_start_up_and_training(tmp_path, sig, when):
    rec = tmp_path / "int.ddptui"
    h = Headless("--steps", "0", "--strategies", "naive", record=rec)  # (DDP adds nothing here)
    h.wait_for(when)
    t0 = time.monotonic()
    h.p.send_signal(sig)
    rc = h.finish(timeout=30)
    assert rc == 130, h.stderr
    left = wait_no_workers(max(0.0, SHUTDOWN_WINDOW_S - (time.monotonic() - t0)))
    assert left == [], f"left after {time.monotonic() - t0:.1f} s: {left}\n{h.stderr}"
    assert "Traceback" not in h.stderr
    if rec.exists():  # finalised: reads to the end without damage
        _, damage = replay_steps(rec)
        assert damage is None
    if when == "steps:":
        steps, _ = replay_steps(rec)
        assert steps["naive"]


@pytest.mark.slow
@pytest.mark.heavy  # CI: tests/test_cli_verbs.py::test_sigkilled_run_replays_to_its_last_complete_step
def test_app_sigkilled_workers_exit_by_themselves():
    """Heavy: in CI, test_cli_verbs' test_sigkilled_run_replays_to_its_last_complete_step
    SIGKILLs a headless run's app the same way and holds its workers to leaving by themselves
    (within 15 s there; 8 s here)."""
    h = Headless("--steps", "0", "--strategies", "naive")
    h.wait_for("steps:")
    workers = [p for p in worker_procs() if "torch.distributed.run" not in " ".join(p.cmdline())]
    assert len(workers) == 2
    h.p.kill()
    h.p.wait()
    gone, alive = psutil.wait_procs(workers, timeout=8)
    assert not alive, "workers outlived the app by more than 8 s"


@pytest.mark.slow
def test_app_stalled_training_goes_on_and_drops_are_counted(tmp_path):
    rec = tmp_path / "stall.ddptui"
    out = tmp_path / "stall.json"
    # queues of 8 frames and 8 KB socket buffers (the kernel's default holds seconds of steps)
    h = Headless("--steps", "0", "--batch-size", "32", "--queue-size", "8", "--strategies", "naive",
                 "--json", str(out), record=rec, env={"DDPTUI_SOCKET_SNDBUF": "8192"})
    h.wait_steps("naive", 25)  # the steady rate before the stall is measured on 20 steps
    # the experiment: the app does nothing for STALL_S while the ranks train on; it is
    # stopped again (up to 6 times) until the ranks' socket buffers and queues of 8 frames
    # have overflowed (their heartbeats say so): how soon depends on how fast this machine is
    for stops in range(1, 7):
        h.p.send_signal(signal.SIGSTOP)
        time.sleep(STALL_S)
        seen = h.steps("naive")
        h.p.send_signal(signal.SIGCONT)
        h.wait_steps("naive", seen + 10)  # the app reads again and sees training went on
        if _ranks_dropped(rec):
            break
    # ended as test_interrupt_start_up_and_training ends a run while training (SIGTERM: a job
    # scheduler's), held to the same: 130, every rank gone within the window, the recording whole
    t0 = time.monotonic()
    h.p.send_signal(signal.SIGTERM)
    rc = h.finish(timeout=30)
    assert rc == 130, h.stderr
    left = wait_no_workers(max(0.0, SHUTDOWN_WINDOW_S - (time.monotonic() - t0)))
    assert left == [], f"left after {time.monotonic() - t0:.1f} s: {left}\n{h.stderr}"
    assert "Traceback" not in h.stderr
    assert replay_steps(rec)[1] is None
    doc = json.loads(out.read_text())
    assert doc["dropped_spans"] > 0, f"nothing dropped in {stops} stops of {STALL_S} s"
    assert "spans were dropped" in h.stderr
    # the ranks kept training while the app was stopped: step numbers kept advancing at
    # a rate of the same order across the stall (gaps are the dropped steps)
    r = Reader(str(rec))
    bases = {}
    for _, f in r:
        if type(f) is _fr.Spans and f.rank == 0 and f.strategy == "naive":
            bases[f.step] = f.base_ns
    ks = sorted(bases)
    gaps = [(ks[i], ks[i + 1]) for i in range(len(ks) - 1) if ks[i + 1] - ks[i] > 1]
    assert gaps, "no steps were dropped from the recording"
    k0, k1 = max(gaps, key=lambda g: bases[g[1]] - bases[g[0]])
    stall_rate = (k1 - k0) / ((bases[k1] - bases[k0]) / 1e9)
    before = [k for k in ks if k < k0][-20:]
    normal_rate = (before[-1] - before[0]) / ((bases[before[-1]] - bases[before[0]]) / 1e9)
    # (a rank held up by the stopped app: one waiting 100 ms for room before it drops a frame
    # made 0.18 of its rate at a ~20 ms step (tests/mutation_check.py's "held"; about T/(T +
    # 100 ms): a step over ~40 ms would hide that hold from this bound); one that blocks, none.
    # The rate moves with the neighbours' load: 0.49 was seen in the suite, three test workers
    # on two cores, against 0.5 before)
    assert stall_rate > 0.3 * normal_rate, (stall_rate, normal_rate)


@pytest.mark.parametrize("args,needle", [
    (["--record", "/nonexistent-dir/run.ddptui"], "does not exist"),
    (["--record", "/proc/run.ddptui"], "is not writable"),
    (["--json", "/nonexistent-dir/out.json"], "does not exist"),
    (["--runs-dir", "/proc/ddptui-runs"], "--runs-dir"),
])
def test_bad_paths(args, needle):
    p = run_main("--headless", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error:") and needle in lines[0], p.stderr


@pytest.mark.parametrize("module,needle", [("torch", "torch is not installed in this Python"),
                                           ("pynvml", "nvidia-ml-py (pynvml) is not installed")])
def test_missing_dependency(module, needle, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    p = run_main("--headless", "--no-record")
    assert p.returncode == 2
    assert p.stderr.strip() == f"ddptui: error: {needle}" + (
        "; run bin/setup (or pip install torch)" if module == "torch" else "; reinstall ddptui (pip install -e .)")


class FlakyNvml(StubNvml):
    """One GPU whose utilisation call starts failing after `ok_calls` samples; power is
    unsupported from the start."""

    name = b"Flaky GPU"

    def __init__(self, ok_calls):
        self.ok_calls = ok_calls
        self.util_calls = 0
        self.power_calls = 0

    def nvmlDeviceGetUtilizationRates(self, h):
        self.util_calls += 1
        if self.util_calls > self.ok_calls:
            raise self.NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=42)

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_calls += 1
        raise self.NVMLError_NotSupported()


def test_nvml_failing_mid_run_shows_na_and_stops_polling():
    from ddptui.live.nvml import GpuSampler
    lib = FlakyNvml(ok_calls=2)
    s = GpuSampler(lib=lib)
    samples = [s.sample().gpus[0] for _ in range(8)]
    assert [g.util for g in samples[:2]] == [42.0, 42.0]
    assert all(g.util is None for g in samples[2:])
    assert lib.util_calls == 2 + GpuSampler.MAX_FAILS  # dropped after repeated failures
    assert lib.power_calls == 1  # unsupported: asked once, never again
    assert all(g.power_w is None and g.nvlink_tx_mbs is None for g in samples)
    assert all(g.sm_clock_mhz == 1500 and g.mem_total_mb == 16384 for g in samples)
    assert samples[-1].pcie_tx_mbs == 2.0


@pytest.mark.slow
def test_long_run_memory_bounded():
    """3,000 steps of synthetic frames through the real socket, collector and store, whose
    limits (raw spans kept 100 steps, per-step figures 500) are reached by step 500: from step
    1,000 on every kept thing is at its limit, and memory must not grow (the store's defaults,
    400 and 20,000, take 20,000 steps to reach the second)."""
    from ddptui.ingest.collector import Collector
    from ddptui.recording.synthetic import SyntheticRun
    from ranks import wire

    steps, first = 3_000, 1_000
    st = Store(keep_steps=100, keep_figures=500)
    col = Collector(st, "tok")
    run = SyntheticRun("small", world=2, strategies=("naive", "ddp"))
    socks = {}
    for f in run.header_frames():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(col.path)
        s.sendall(wire.pack({"t": "auth", "token": "tok", "r": f.rank, "v": wire.PROTOCOL_VERSION})
                  + wire.pack(f))
        socks[f.rank] = s
    proc = psutil.Process()
    rss = {}
    try:
        for k in range(steps):
            for f in run.step_frames(k):
                socks[f.rank].sendall(wire.pack(f))
            if k % 250 == 249:
                deadline = time.monotonic() + 30
                while st.latest_complete("ddp") != k and time.monotonic() < deadline:
                    time.sleep(0.01)
                    st.update()
                if k + 1 in (first, steps):
                    rss[k + 1] = proc.memory_info().rss
    finally:
        for s in socks.values():
            s.close()
        col.close()
    assert st.latest_complete("naive") == steps - 1
    for s in ("naive", "ddp"):
        assert len(st.raw[s]) <= st.keep_steps
        assert len(st.step_figs[s]) <= st.keep_figures
    assert len(st.rank_figs) <= st.keep_steps * 2 * 2
    growth_mb = (rss[steps] - rss[first]) / 2**20
    print(f"RSS after {first:,} steps {rss[first] / 2**20:.1f} MB, after {steps:,} {rss[steps] / 2**20:.1f} MB")
    assert growth_mb < 5, f"memory grew {growth_mb:.1f} MB over {steps - first:,} steps"


@pytest.mark.slow
@settings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(hs.lists(bad_frame(), min_size=60, max_size=60))
def test_hostile_clients_and_generated_bad_frames_during_a_real_run(tmp_path_factory, frames):
    """While two real ranks train: hostile clients (silent, wrong token, not msgpack, a 2 GB
    length, no auth first, speaking for another rank, another version) are refused, each for
    its reason; then an authenticated client sends frames of every type with wrong values
    (one connection each): each is rejected and logged. The run, its figures and its
    recording are unaffected, and the app listens on no network port."""
    from ddptui.live.launcher import plan
    from ddptui.recording.loader import load
    from ddptui.live.session import LiveRun, RunOptions
    from ranks import wire

    def listening() -> set:
        return {c.laddr for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    before = listening()  # (another test's process group in this process may still listen)
    rec = tmp_path_factory.mktemp("bad-frames") / "run.ddptui"
    run = LiveRun(RunOptions(model="small", steps=0, batch_size=256, record=str(rec)), plan(2, None, "cpu"))
    st = run.store
    answered = []
    hostile = []

    def client(payload: bytes):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(run.collector.path)
        if payload:
            s.sendall(payload)
        hostile.append(s)

    def send_hostile():
        token = run.collector.token
        client(b"")  # says nothing
        client(wire.pack({"t": "auth", "token": "0" * 32, "r": 0}))  # wrong token
        client(b"\x00\x00\x00\x05garbage!")  # not msgpack
        client(b"\x7f\xff\xff\xff" + b"x" * 100)  # claims 2 GB
        client(wire.pack({"t": "hello", "r": 0}))  # no auth first
        client(wire.pack({"t": "auth", "token": token, "r": 1, "v": wire.PROTOCOL_VERSION}) +
               wire.pack({"t": "hb", "r": 0, "k": 999}))  # right token, speaks for another rank
        client(wire.pack({"t": "auth", "token": token, "r": 0,
                          "v": wire.PROTOCOL_VERSION + 1}))  # a worker of another ddptui version

    def send_all():
        for f in frames:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(run.collector.path)
            s.sendall(wire.pack({"t": "auth", "token": run.collector.token, "r": frame_rank(f),
                                 "v": wire.PROTOCOL_VERSION}) + wire.pack(f))
            answered.append(s.recv(10) == b"")  # the app closes a connection it rejected
            s.close()

    def steps_done() -> int:
        st.update()
        return min(len(st.complete_steps(s)) for s in ("naive", "ddp"))

    run.start()
    run.collector.auth_timeout = 1.0
    path = run.collector.path
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    send_hostile()  # while the ranks start
    deadline = time.monotonic() + 150
    sent_at = None
    try:
        while not run.poll():  # 3 steps, then the frames, then 3 more steps
            assert time.monotonic() < deadline, "run did not get through"
            done = steps_done()
            if sent_at is None and done >= 3:
                sent_at = done
                sender = threading.Thread(target=send_all, daemon=True)
                sender.start()  # training goes on meanwhile (the collector is its own thread)
                sender.join(60)
            elif sent_at is not None and done >= sent_at + 3:
                break
            time.sleep(0.05)
    finally:
        if run.state in ("running", "starting"):
            run.stop("test done")
    for c in hostile:
        c.close()
    assert run.state == "stopped", run.message
    assert answered == [True] * len(frames)
    # each hostile client refused for its reason
    text = "\n".join(t for _, _, t in st.log)
    for why in ("no token", "wrong token", "undecodable frame", "exceeds", "not an auth frame",
                "rank 1 sent a frame for rank 0",
                f"protocol version {wire.PROTOCOL_VERSION + 1}, but this ddptui speaks version "
                f"{wire.PROTOCOL_VERSION}"):
        assert why in text, why
    # every frame rejected and logged, naming its rank; nothing else rejected
    assert st.rejected == len(frames) + len(hostile)
    rejected = [t for _, lv, t in st.log if t.startswith("rejected")][-len(frames):]
    assert len(rejected) == len(frames)
    for f, line in zip(frames, rejected):
        assert line.startswith(f"rejected rank {frame_rank(f)}: "), line
        assert f["t"] in line or "sent a frame for rank" in line, (f, line)
    # the run is unaffected: two ranks, every step of both strategies complete
    assert sorted(st.ranks) == [0, 1] and all(i.finished and not i.error for i in st.ranks.values())
    for s in ("naive", "ddp"):  # (in the order they completed: a step may complete after a
        # later one when two callers of update() publish in turn, here steps_done() and the
        # Updater's thread; a CI run saw [.., 4, 6, 5, 7])
        assert sorted(st.complete_steps(s)) == list(range(len(st.complete_steps(s))))
    # ... and so is its recording: the same figures, no bad frame in it, the rejections kept
    got = load(str(rec))
    assert got.damage is None and got.rejected == []
    assert got.store.summaries() == st.summaries()
    assert got.store.rejected == len(frames) + len(hostile)  # the refusals are kept too
    assert sorted(got.store.ranks) == [0, 1]
    assert not listening() - before  # the app opened no network port
