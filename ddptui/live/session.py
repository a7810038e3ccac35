"""A live run: collector + recorder + torchrun, watched until it ends.

The same object serves the headless report and the UI: both call poll() on a timer and
stop() when they are done. Nothing here blocks for long.
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from ranks import frames, spec
from ranks.frames import UNSET

from ddptui import __version__
from ddptui.ingest.collector import Collector
from ddptui.ingest.feed import Feed
from .launcher import (PROJECT_ROOT, Launcher, Plan, describe_exit, rank_exit_codes, torchrun_cmd,  # noqa: F401
                       worker_args, worker_env)  # (PROJECT_ROOT: where `ddptui join` starts torchrun too)
from .nvml import CpuSampler, GpuSampler
from .output import OutputTail
from ranks.recfile import RecordingStopped, RecordWriter
from ddptui.model.store import Store
from ddptui.model.updater import Updater
from .watchdog import Watchdog



@dataclass
class RunOptions:
    model: str = "small"
    strategies: list[str] = field(default_factory=lambda: list(spec.DEFAULT_STRATEGIES))
    steps: int = 0  # per strategy; 0 = until stopped
    batch_size: int = 1024
    bucket_cap_mb: float | None = None
    seed: int = 42
    lr: float = 0.01
    pg_timeout: float = 60.0
    threads: int = 1  # torch threads per CPU rank
    record: str | None = None
    hang_s: float = 30.0  # no step completed for this long while training -> reported
    hb_timeout_s: float = 5.0
    sample_every_s: float = 0.5
    extra_worker_args: list[str] = field(default_factory=list)
    multinode: object = None  # ddptui.live.multinode.MultiNode: node 0 of a multi-node run


class LiveRun:
    def __init__(self, opts: RunOptions, plan: Plan, store: Store | None = None):
        self.opts = opts
        self.plan = plan
        self.store = store or Store()
        # every frame in, with one damage policy; the recorder failing stops recording alone
        self.feed = Feed(self.store, sink=self._sink, on_sink_error=self._recording_failed)
        self.recording_error: str | None = None  # where and why the recording stopped early
        self.state = "created"  # starting | running | finished | failed | stopped
        self.message = ""
        self.exit_code: int | None = None
        self.recorder: RecordWriter | None = None
        self.collector: Collector | None = None
        self.launcher: Launcher | None = None
        self._pending: list[tuple[bytes, frames.Frame]] = []  # (body, frame) until the recording opens
        self._rec_lock = threading.Lock()
        self._stop_ev = threading.Event()
        self.watchdog = Watchdog(self.store, opts.hang_s, opts.hb_timeout_s,
                                 lambda r: self._rank_exit(r, "exited"), time.monotonic(),
                                 on_stall=self._ask_flight_recorder)
        self.fr_dir: str | None = None  # where the ranks write their Flight Recorder on a hang
        self._fr_asked = 0.0
        self._bucket_seq = 0
        self._slow_seq = 0
        self.started = 0.0
        self.first_step_s: float | None = None
        self.multinode = opts.multinode
        self.listener = None  # multi-node: ddptui.live.netlisten.NetListener
        self.updater = Updater(self.store)  # the store's figures, off the drawing thread
        # the ranks' own output (a script's prints): read from torchrun's files into Output
        # frames; `on_output(rank, stream, line)`, set before start(), sees every line (headless)
        self.on_output = None
        self.output: OutputTail | None = None

    # -- metadata ----------------------------------------------------------------------
    def meta(self) -> dict:
        o = self.opts
        m = {
            "ddptui": __version__, "created": time.time(), "model": o.model,
            "layers": spec.layer_names(o.model),
            "params": [list(p) for p in spec.param_table(o.model)],
            "strategies": list(o.strategies), "world": self.plan.ranks, "batch": o.batch_size,
            "steps": o.steps, "bucket_cap_mb": o.bucket_cap_mb or spec.DEFAULT_BUCKET_CAP_MB,
            "seed": o.seed, "lr": o.lr, "device": self.plan.device, "gpus": self.plan.gpus,
            "note": self.plan.note, "settings": {k: v for k, v in asdict(o).items() if k != "record"},
        }
        return m

    def status(self, text: str, level: str = "info") -> None:
        self.feed.frame(frames.Status(text=text, level=level, ts=time.time()))

    # -- start -------------------------------------------------------------------------
    def start(self) -> None:
        o = self.opts
        self.started = time.monotonic()
        self.state = "starting"
        self.store.set_meta(self.meta())
        token = secrets.token_hex(16)
        self.run_dir = tempfile.mkdtemp(prefix="ddptui-")  # private (0700): socket and log
        self.collector = Collector(self.store, token, feed=self.feed, on_disconnect=self._on_disconnect,
                                   run_dir=self.run_dir)
        # (on a hang the ranks' Flight Recorder dumps: beside the recording, else in the run's
        # private directory, read there)
        self.fr_dir = f"{o.record}.fr" if o.record else os.path.join(self.run_dir, "fr")
        env = worker_env(self.plan, self.collector.path, token, o.threads, one_host=self.multinode is None,
                         fr_dir=self.fr_dir)
        args = worker_args(o, self.plan.device)
        log_path = os.path.join(self.run_dir, "torchrun.log")
        self.status(self.plan.note)
        self.status(f"spawning torchrun: {self.plan.ranks} rank(s), model {o.model}")
        cmd = self.command(args)
        if self.multinode is not None:  # node 0 of several: c10d rendezvous, a listener for the others
            from .multinode import start_listener, torchrun_cmd as node_cmd
            m = self.multinode
            cmd = node_cmd(m.nnodes, m.node_rank, m.nproc_per_node, m.rdzv_endpoint, m.run_id, args)
            self.listener = start_listener(self, args, env)
        one_host = self.multinode is None  # (other nodes' ranks: their own torchrun's files)
        self.launcher = Launcher(cmd, env, log_path, cwd=self.cwd, redirect_output=one_host)
        if one_host:
            self.output = OutputTail(self.launcher.log_dir, self.feed.frame, self.on_output)
            self.output.start()
        self._sampler = threading.Thread(target=self._sample_loop, name="ddptui-sampler", daemon=True)
        self._sampler.start()
        self.updater.start()
        self.state = "running"

    cwd = PROJECT_ROOT  # where torchrun starts

    def command(self, worker_args: list[str]) -> list[str]:
        """The torchrun command line (ddptui run: the user's script instead of the workers)."""
        return torchrun_cmd(self.plan.ranks, worker_args)

    # -- recording ---------------------------------------------------------------------
    def _sink(self, body: bytes, frame: frames.Frame) -> None:
        with self._rec_lock:
            if self.recorder is None and self.opts.record:
                self._pending.append((body, frame))
                hellos = sum(1 for _, f in self._pending if type(f) is frames.Hello)
                if hellos >= self.plan.ranks or type(frame) is frames.Spans or len(self._pending) > 10000:
                    self._open_recording()
                return
            if self.recorder is not None:
                self.recorder.write_body(body, frame)

    def _record(self, frame: frames.Frame) -> None:
        """A frame into the recording only (not the store)."""
        if self.feed.sink is None:  # (recording stopped)
            return
        try:
            self._sink(frames.encode(frame), frame)
        except Exception as e:  # noqa: BLE001 - recording stops alone
            self.feed.sink_failed(e)

    def _recording_failed(self, e: BaseException) -> None:
        """The recorder failed (a full disk, the file removed): recording stops, said once in
        a warning with where the file ends and why; the run, its screen, figures and JSON go
        on. The file is finalised as far as it got (RecordWriter)."""
        self.feed.sink = None
        with self._rec_lock:
            if self.recording_error is not None:
                return
            self._pending = []
            self.recording_error = str(e) if isinstance(e, RecordingStopped) else \
                f"recording {self.opts.record} stopped: {type(e).__name__}: {e}"
            rec = self.recorder
        if rec is not None:
            try:
                rec.close()  # (after another failure: the file ends cleanly where it got to)
            except OSError:
                pass
        self.store.add_log(self.recording_error + "; the run goes on without it", "warn")

    def _open_recording(self) -> None:
        meta = self.meta()
        hellos = [f for _, f in self._pending if type(f) is frames.Hello]
        if hellos:
            h = hellos[0]
            meta["torch"] = None if h.torch is UNSET else h.torch
            meta["backend"] = h.backend
            meta["devices"] = {str(f.rank): f.device for f in hellos}
            meta["host"] = None if h.host is UNSET else h.host
        self.recorder = RecordWriter(self.opts.record, meta)
        for body, f in self._pending:
            self.recorder.write_body(body, f)
        self._pending = []
        self.recorder.flush()

    # -- watching ----------------------------------------------------------------------
    def _sample_loop(self) -> None:
        gpu = GpuSampler() if self.plan.device == "cuda" else None
        if gpu is not None and not gpu.has_gpus:
            gpu = None
        cpu = CpuSampler()
        selected = False
        while not self._stop_ev.wait(self.opts.sample_every_s):
            try:
                if gpu is not None and not selected:  # the run's GPUs, once every rank said
                    uuids = [i.uuid for i in self.store.rank_snapshot().values()]
                    if len(uuids) == self.plan.ranks and all(uuids):
                        gpu.select(uuids)
                        selected = True
                if gpu is not None:
                    f = gpu.sample()
                else:
                    pids = {r: i.pid for r, i in self.store.rank_snapshot().items() if i.pid}
                    f = cpu.sample(pids)
                self.feed.frame(f)
                if self.recorder is not None and self.recording_error is None:
                    try:
                        self.recorder.flush()
                    except Exception as e:  # noqa: BLE001 - recording stops alone
                        self.feed.sink_failed(e)
            except Exception as e:  # noqa: BLE001 - sampling must never break the run
                self.store.add_log(f"sampler: {type(e).__name__}: {e}", "warn")

    FR_READ_AFTER_S = 2.0  # the ranks' dumps read this long after they were asked for

    def _ask_flight_recorder(self) -> None:
        """A hang named: every rank writes its Flight Recorder (PyTorch's record of every
        collective, those C++ issues too: DDP's without a comm hook, its broadcasts), then
        the dumps are read and their verdict logged (at most every 5 s)."""
        now = time.monotonic()
        if self.collector is None or self.fr_dir is None or now - self._fr_asked < 5.0:
            return
        self._fr_asked = now
        try:
            os.makedirs(self.fr_dir, exist_ok=True)
        except OSError as e:
            self.store.add_log(f"no Flight Recorder dumps: {self.fr_dir}: {e.strerror or e}", "warn")
            return
        self.collector.send(frames.Dump(why="hang"))
        t = threading.Timer(self.FR_READ_AFTER_S, self._read_flight_recorder)
        t.daemon = True
        t.start()

    def _read_flight_recorder(self) -> None:
        from ddptui.recording.frdump import FrDumpReader
        from ranks.recfile import RecordingError
        st = self.store
        try:
            got = FrDumpReader(self.fr_dir)
        except RecordingError as e:
            st.add_log(f"Flight Recorder: {str(e).split(': ', 1)[-1]}", "warn")
            return
        except Exception as e:  # noqa: BLE001 - the report goes on without it
            st.add_log(f"Flight Recorder dumps not read: {type(e).__name__}: {e}", "warn")
            return
        where = f" ({self.fr_dir})" if self.opts.record else ""
        head = got.verdict.headline()
        st.add_log(f"Flight Recorder{where}: {head}", "warn")
        for line in [x for x in got.verdict.lines()[1:] if x.strip() != head][:5]:
            st.add_log(f"  {line}", "info")

    def _on_disconnect(self, rank: int, clean: bool) -> None:
        if not clean and self.state in ("running", "starting"):
            self.store.add_log(f"rank {rank} closed its connection without saying goodbye", "warn")

    def rank_pids(self) -> list[int]:
        return [i.pid for i in self.store.rank_snapshot().values() if i.pid]

    def poll(self) -> bool:
        """Check on the run; returns True once it has ended (see state, message)."""
        if self.state not in ("running", "starting"):
            return True
        st = self.store
        if self.first_step_s is None:  # (later steps: the Updater's thread)
            st.update()
        now = time.monotonic()
        if self.first_step_s is None and any(st.latest_complete(s) is not None for s in st.strategies()):
            self.first_step_s = now - self.started
            self.status(f"first step done after {self.first_step_s:.1f} s")
        self.watchdog.progress(now)
        rc = self.launcher.poll()
        if rc is not None:
            self._finish(rc)
            return True
        why = self.watchdog.check(now)
        if why is not None:
            self.fail(why)
            return True
        return False

    def _rank_exit(self, rank: int, status: str) -> None:
        self.feed.frame(frames.Exit(rank=rank, status=status))

    def _finish(self, rc: int) -> None:
        st = self.store
        codes = rank_exit_codes(self.launcher.log_text()) if rc != 0 else {}
        for r, code in codes.items():
            self._rank_exit(r, describe_exit(code))
        errors = [(r, i.error) for r, i in sorted(st.rank_snapshot().items()) if i.error]
        if rc == 0 and not errors:
            self.state = "finished"
            self.message = "run finished"
        else:
            self.state = "failed"
            parts = []
            killed = [(r, c) for r, c in sorted(codes.items()) if c < 0 or r not in dict(errors)]
            for r, c in killed:
                parts.append(f"rank {r} {describe_exit(c)}")
            for r, e in errors:
                parts.append(f"rank {r}: {e}")
            if not parts:
                tail = [ln for ln in self.launcher.log_tail(2000).splitlines() if ln.strip()]
                parts.append(f"torchrun {describe_exit(rc)}" + (f": {tail[-1].strip()}" if tail else ""))
            self.message = "; ".join(parts)
        self.exit_code = rc
        self._close()

    def fail(self, message: str) -> None:
        self.state = "failed"
        self.message = message
        self._record(frames.Status(text=message, level="error", ts=time.time()))
        self._shutdown()

    # -- control -----------------------------------------------------------------------
    def set_bucket_cap(self, mb: float) -> int:
        """Ask every rank to re-wrap DDP with this bucket cap at an agreed step."""
        self._bucket_seq += 1
        return self.collector.send(frames.Set(key="bucket_cap_mb", value=float(mb), seq=self._bucket_seq))

    def set_straggler(self, ms: float, rank: int | None = None, layer: int | None = None) -> int:
        """Ask every rank to start (ms > 0) or stop delaying `rank`'s backward of `layer` (default:
        the highest rank, the middle layer) at an agreed step; the timeline marks it."""
        names = spec.layer_names(self.opts.model)
        rank = self.plan.ranks - 1 if rank is None else rank
        layer = (len(names) - 1) // 2 if layer is None else layer
        self._slow_seq += 1
        return self.collector.send(frames.Set(key="slow_ms", value=float(ms), slow_rank=rank, layer=layer,
                                              seq=self._slow_seq))

    def stop(self, why: str = "stopped by user", grace: float = 6.0) -> None:
        """Stop every rank: ranks in their training loop stop together at the next step
        and say goodbye; whatever is still running after `grace` s is terminated."""
        if self.state not in ("running", "starting"):
            self._close()
            return
        self.status(f"stopping: {why}")
        ranks = list(self.store.rank_snapshot().values())
        training = len(ranks) == self.plan.ranks and all(
            i.phase in ("training", "done") and i.connected for i in ranks)
        if training:
            self.collector.send(frames.Stop())
        else:  # ranks still starting cannot act on a message: torchrun is told at once
            grace = 0.0
        deadline = time.monotonic() + grace
        all_done_at = None
        while time.monotonic() < deadline and self.launcher is not None and self.launcher.poll() is None:
            if all_done_at is None and all(i.finished for i in self.store.rank_snapshot().values()):
                all_done_at = time.monotonic()
            if all_done_at is not None and time.monotonic() - all_done_at > 2.0:
                break
            time.sleep(0.05)
        self.state = "stopped"
        self.message = why
        self._shutdown()

    def _shutdown(self) -> None:
        if self.launcher is not None:
            self.launcher.stop(grace=3.0, workers=self.rank_pids())
        self._close()

    def _close(self) -> None:
        self._stop_ev.set()
        if self.listener is not None:  # multi-node: the joins end with the run
            self.listener.close(self.message or self.state)
        if self.launcher is not None:  # (torchrun already gone: its orphaned workers reaped)
            self.launcher.stop(grace=5.0, workers=self.rank_pids())
        if self.collector is not None:
            self.collector.close()
        if self.output is not None:  # (the ranks are gone: their output to its end, recorded)
            self.output.close()
        try:
            with self._rec_lock:
                if self.recorder is None and self.opts.record and self._pending and self.recording_error is None:
                    self._open_recording()
                if self.recorder is not None:
                    self.recorder.close()
        except Exception as e:  # noqa: BLE001 - recording stops alone
            self.feed.sink_failed(e)
        if getattr(self, "run_dir", None):
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self.updater.stop()
        self.store.update()
