"""Start torchrun in its own session, watch it, stop it without leaving anything behind."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from ranks import seams

from . import nvml

# the checkout (or installed tree) holding ddptui/ and ranks/: the workers import ranks from it
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def detect_gpus() -> int:
    """CUDA devices this run may use, without importing torch (fast).
    DDPTUI_GPU_COUNT overrides (ranks.seams.gpu_count: for tests and machines without NVML)."""
    forced = seams.gpu_count()
    if forced is not None:
        return forced
    n = nvml.device_count()
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        vis = vis.strip()
        n = 0 if vis in ("", "-1") else min(n, len([v for v in vis.split(",") if v.strip()]))
    return n


@dataclass
class Plan:
    ranks: int
    gpus: int
    device: str  # "cuda" | "cpu"
    note: str


def plan(gpus: int, ranks: int | None, device: str = "auto", available: int | None = None) -> Plan:
    """Decide ranks and device; ValueError with a one-line message for impossible asks."""
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1 (got {gpus})")
    if ranks is not None and ranks < 1:
        raise ValueError(f"--ranks must be at least 1 (got {ranks})")
    n = detect_gpus() if available is None else available
    want_ranks = ranks or gpus
    if want_ranks > 64:
        raise ValueError(f"{want_ranks} ranks is more than this tool runs on one host (64)")
    if device == "cpu" or (device == "auto" and n == 0):
        if device == "auto":
            note = f"no GPU found: --gpus {gpus} means {want_ranks} CPU rank(s) on gloo"
        else:
            note = f"{want_ranks} CPU rank(s) on gloo"
        return Plan(want_ranks, 0, "cpu", note)
    if device == "cuda" and n == 0:
        raise ValueError("--device cuda but no CUDA GPU is visible")
    if gpus > n:
        raise ValueError(f"--gpus {gpus} but only {n} GPU(s) present; "
                         f"to run {gpus} ranks on {n} GPU(s) use --gpus {n} --ranks {gpus}")
    if want_ranks < gpus:
        raise ValueError(f"--ranks {want_ranks} is fewer than --gpus {gpus}")
    if want_ranks > gpus:
        note = f"{want_ranks} ranks on {gpus} GPU(s): gloo with CUDA tensors (NCCL needs a GPU per rank)"
    else:
        note = f"{want_ranks} rank(s), one GPU each, on nccl"
    return Plan(want_ranks, gpus, "cuda", note)


def visible_devices(gpus: int, current: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a run on `gpus` GPUs: the first `gpus` of what is visible now
    (indices, UUIDs or MIG ids as the user gave them), else of all devices. Without it the
    ranks would see every GPU and `--gpus 1 --ranks 2` would put NCCL on two of them."""
    if current is not None and current.strip() not in ("", "-1"):
        ids = [v.strip() for v in current.split(",") if v.strip()]
        return ",".join(ids[:gpus])
    return ",".join(str(i) for i in range(gpus))


def worker_env(plan: Plan, socket_path: str, token: str, threads: int, one_host: bool = True,
               base: dict | None = None, fr_dir: str | None = None) -> dict:
    """The ranks' environment: ours (less TORCH_DISTRIBUTED_DEBUG), the app's socket and token,
    this tree importable, one thread count on CPU or exactly the plan's GPUs, and gloo/NCCL
    sockets on loopback when every rank runs on this host (unless the user chose)."""
    env = dict(os.environ if base is None else base)
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)  # DETAIL crashes DDP construction on some builds
    env.update({
        "DDPTUI_SOCKET": socket_path, "DDPTUI_TOKEN": token,
        "PYTHONPATH": PROJECT_ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
    })
    if plan.device == "cpu":
        env["OMP_NUM_THREADS"] = str(threads)
    else:  # the ranks see exactly the GPUs of the plan, numbered as NVML numbers them
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(plan.gpus, env.get("CUDA_VISIBLE_DEVICES"))
        nccl_timing_env(env)
    # PyTorch's Flight Recorder on for every rank (gloo's and NCCL's): on a hang each rank
    # writes it into `fr_dir` (a Dump control frame), and the report reads it (LiveRun)
    if not env.get("TORCH_FR_BUFFER_SIZE") and not env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env["TORCH_FR_BUFFER_SIZE"] = str(FR_BUFFER)
    if fr_dir:
        env["DDPTUI_FR_DIR"] = fr_dir
    if one_host:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


# the Flight Recorder's entries when the user set none (torch's own suggestion, 2,000): a
# dump costs ~15-20 ms of the sender thread (the GIL held) whatever the buffer holds (an H200:
# 256 entries 19 ms, 2,000 entries 25 ms and 8 ms to read), so few dumps of a large buffer
# (ranks.core.flightrec.FlightTimes: every three quarters of it, at most every second); 256 entries
# read every second let 1.5 % of the buckets be overwritten unread at xlarge
FR_BUFFER = 2000


def nccl_timing_env(env: dict) -> dict:
    """NCCL's own timing of collectives on (before any process group is made) and a Flight
    Recorder buffer, unless the user chose: DDP's buckets are then timed without a Python
    comm hook (ranks.builtin.strategies.comm_timing_for). A user's `TORCH_NCCL_ENABLE_TIMING=0` keeps
    the comm hook."""
    env.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    if not env.get("TORCH_FR_BUFFER_SIZE") and not env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env["TORCH_FR_BUFFER_SIZE"] = str(FR_BUFFER)
    return env


def worker_args(opts, device: str) -> list[str]:
    """The command line of ranks.builtin.worker for a run's options (a session.RunOptions)."""
    args = ["--model", opts.model, "--strategies", ",".join(opts.strategies), "--steps", str(opts.steps),
            "--batch-size", str(opts.batch_size), "--seed", str(opts.seed), "--lr", str(opts.lr),
            "--pg-timeout", str(opts.pg_timeout), "--device", device]
    if opts.bucket_cap_mb is not None:
        args += ["--bucket-cap-mb", str(opts.bucket_cap_mb)]
    return args + list(opts.extra_worker_args)


def torchrun_cmd(ranks: int, worker_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(ranks), "-m", "ranks.builtin.worker", *worker_args]


_FAIL = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.M)


def rank_exit_codes(log_text: str) -> dict[int, int]:
    """torchrun's failure summary -> {rank: exitcode} (negative: killed by that signal)."""
    return {int(r): int(c) for r, c in _FAIL.findall(log_text)}


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def with_log_dir(cmd: list[str], log_dir: str, redirect: bool = False) -> list[str]:
    """torchrun's own files (one folder per attempt, error files) under `log_dir` instead of a
    `torchelastic_*` folder it would leave in the temp directory after every run; `redirect`:
    each rank's stdout and stderr to files there too (``<run>/attempt_<n>/<local rank>/
    std{out,err}.log``, read by ddptui.live.output). A command that is not `python -m
    torch.distributed.run ...` is returned as it is."""
    at = cmd.index("torch.distributed.run") + 1 if "torch.distributed.run" in cmd else 0
    if at < 3 or cmd[at - 2] != "-m":
        return list(cmd)
    return [*cmd[:at], "--log-dir", log_dir, *(["--redirects", "3"] if redirect else []), *cmd[at:]]


class Launcher:
    """torchrun in a new session; its output goes to a log file, its own files to a folder
    beside it, `log_dir` (the run's private folder, removed with it); `redirect_output`: the
    ranks' stdout and stderr to files there, one per rank and stream."""

    def __init__(self, cmd: list[str], env: dict, log_path: str, cwd: str | None = None,
                 redirect_output: bool = False):
        self.log_dir = os.path.join(os.path.dirname(os.path.abspath(log_path)), "torchrun")
        cmd = with_log_dir(cmd, self.log_dir, redirect_output)
        self.cmd = cmd
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, grace: float = 8.0, workers: list[int] | None = None) -> int | None:
        """SIGTERM the whole session and wait; SIGKILL what is still there after `grace`."""
        if self.proc.poll() is None:
            # torchrun starts each worker in a session of its own, and a stopped worker (SIGSTOP,
            # Ctrl-Z) acts on the SIGTERM torchrun sends it only once continued
            self._resume(workers or [])
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                try:
                    self.proc.wait(3)
                except subprocess.TimeoutExpired:
                    pass
        # workers orphaned by a dead torchrun are still in its session / our list
        self._reap(workers or [])
        self.log.close()
        return self.proc.returncode

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _resume(pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self, pids: list[int]) -> None:
        import psutil
        left = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                left.append(p)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, 0)
            self._signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        for p in left:
            try:
                p.terminate()
                p.resume()  # a stopped process only acts on SIGTERM once continued
            except psutil.NoSuchProcess:
                pass
        gone, alive = psutil.wait_procs(left, timeout=3)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if alive:
            psutil.wait_procs(alive, timeout=2)
