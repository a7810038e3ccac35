"""End to end: the real app in tmux with 2 real CPU ranks (torchrun, gloo).

Reads the screen with `tmux capture-pane -p`, presses keys with `send-keys`, and checks
that quitting leaves no worker process behind. Skipped without tmux or torch.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKETS = re.compile(r" DDP .*?step (\d+) · .*?(\d+) buckets? · cap (\d+(?:\.\d+)?) MB")


class Tmux:
    def __init__(self, name: str):
        self.sock = f"ddptui-test-{os.getpid()}-{name}"

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              timeout=30).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "main")

    def wait_for(self, check, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if check(text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{text}")


def lanes_drawn(text: str) -> bool:
    lines = text.splitlines()
    for r in (0, 1):
        rows = [ln for ln in lines if re.match(rf"r{r} +comp ", ln)]
        if len(rows) < 2 or not all("█" in ln for ln in rows):  # one per pane, with bars
            return False
    comm = [ln for ln in lines if ln.lstrip().startswith("comm")]
    return " NAIVE " in text and " DDP " in text and len(comm) >= 4 and all("█" in ln for ln in comm)


def workers_of(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if _is_worker(p)]


def _is_worker(p: psutil.Process) -> bool:
    try:
        return "ranks.builtin.worker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def test_live_app_two_cpu_ranks_bucket_change_and_clean_quit():
    tmux = Tmux("live")
    app = (f"env OMP_NUM_THREADS=1 {sys.executable} -m ddptui.cli.main --gpus 2 --device cpu "
           f"--model medium --batch-size 256 --no-record")  # (quarter-length steps: the same UI)
    cmd = f'{app}; echo "ddptui exited rc=$?"; sleep 120'
    seen: list[psutil.Process] = []
    try:
        tmux("new-session", "-d", "-x", "160", "-y", "45", "-s", "main", "-c", ROOT, cmd)
        pane_pid = int(tmux("display", "-p", "-t", "main", "#{pane_pid}").strip())
        tmux.wait_for(lambda t: "start-up" in t or " NAIVE " in t, 60, "the start-up screen")
        tmux.wait_for(lambda t: lanes_drawn(t) and BUCKETS.search(t), 180,
                      "both strategies with bars for ranks 0 and 1")
        # DDP settles its buckets after the first steps: read the count after that
        text = tmux.wait_for(lambda t: int(BUCKETS.search(t).group(1)) >= 3, 60, "DDP step 3")
        seen = workers_of(pane_pid)  # torchrun (its command names the worker module) and the ranks
        ranks = [p for p in seen if "torch.distributed.run" not in " ".join(p.cmdline())]
        assert len(ranks) == 2
        _, before, cap = BUCKETS.search(text).groups()
        assert float(cap) == 25.0

        # 25 MB -> 5 MB: medium's 33.7 MB of fp32 gradients go into more, smaller buckets
        tmux("send-keys", "-t", "main", "b")

        def changed(t: str) -> bool:
            m = BUCKETS.search(t)
            return bool(m) and float(m.group(3)) == 5.0 and m.group(2) != before

        tmux.wait_for(changed, 120, f"the DDP pane to show the 5 MB cap and a bucket count other than {before}")

        # (the d key's straggler, named once it dominates, needs the cores to itself: it is
        # tests/test_stragglers.py's, with the same app on a real run)
        tmux("send-keys", "-t", "main", "q")
        text = tmux.wait_for(lambda t: "ddptui exited rc=" in t, 90, "the app to exit")
        assert "ddptui exited rc=0" in text
        alive = [p for p in seen if p.is_running() and _is_worker(p)]
        assert not alive, f"processes left running: {[p.cmdline() for p in alive]}"
    finally:
        tmux("kill-server")
        for p in seen:
            if p.is_running() and _is_worker(p):
                p.kill()
