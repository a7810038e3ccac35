"""The load generator (no torch) through the real Unix socket, collector and store."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

from ddptui.ingest.collector import Collector
from ddptui.model.store import Store

from .helpers import ROOT, cli_env


def drive(store, col, token, *args, timeout=60):
    env = cli_env({"DDPTUI_TOKEN": token})
    p = subprocess.run([sys.executable, "-m", "ddptui.live.loadgen", "--socket", col.path, *args],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return p


def test_simulated_ranks_reach_the_store_and_name_the_slow_one():
    store, token = Store(), secrets.token_hex(16)
    col = Collector(store, token)
    try:
        p = drive(store, col, token, "--ranks", "24", "--rate", "20", "--seconds", "1.5",
                  "--model", "small", "--slow", "17:30:fc2")
        assert p.returncode == 0, p.stderr
        sent = int(p.stdout.split(" spans)")[0].rsplit(" ", 1)[-1])
        deadline = time.monotonic() + 20
        while store.spans < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.spans == sent and store.rejected == 0
        store.update()
        assert store.world == 24 and len(store.complete_steps("ddp")) == 30
        st = store.summary("ddp")["stragglers"]
        assert st["culprit"] == "rank 17 · fc2 backward +30 ms", st["evidence"]["findings"]
    finally:
        col.close()


def test_wrong_token_is_refused_and_bad_options_are_one_line():
    store = Store()
    col = Collector(store, secrets.token_hex(16))
    try:
        p = drive(store, col, "not-the-token", "--ranks", "2", "--seconds", "0.2")
        deadline = time.monotonic() + 10
        while store.rejected < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.rejected >= 1 and store.spans == 0
        assert any("wrong token" in text for _, _, text in store.log_lines())
    finally:
        col.close()
    env = {k: v for k, v in cli_env().items() if k != "DDPTUI_TOKEN"}
    p = subprocess.run([sys.executable, "-m", "ddptui.live.loadgen", "--socket", "/nonexistent"],
                       capture_output=True, text=True, timeout=30, env=env, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip() == "loadgen: DDPTUI_TOKEN is not set (the run's token)"
    p = subprocess.run([sys.executable, "-m", "ddptui.live.loadgen", "--socket", os.path.join(ROOT, "no.sock")],
                       capture_output=True, text=True, timeout=30, env=cli_env({"DDPTUI_TOKEN": "x"}), cwd=ROOT)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("loadgen: ")
