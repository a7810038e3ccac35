"""demo/README.md's commands work as written: every command line of its indented code blocks
is run for real (`ddptui` as `python -m ddptui.cli.main`, in a scratch folder where `demo/` is
this checkout's), the UI ones with --headless (no terminal here; talk.sh: what it would play),
the GPU recording command parsed only (no GPU here). A command that fails fails the test."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from ddptui.cli.main import live_parser

from .helpers import pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "demo", "README.md")


def commands() -> list[str]:
    """Lines of the indented code blocks that start with a command, comments removed."""
    out = []
    for line in open(README, encoding="utf-8").read().splitlines():
        if not line.startswith("    "):
            continue
        cmd = re.sub(r"\s+#.*$", "", line.strip())
        if cmd.startswith(("ddptui ", "demo/talk.sh", "python ")):
            out.append(cmd)
    return out


def test_the_readme_has_its_commands():
    cmds = commands()
    assert len(cmds) >= 9
    assert any("from ddptui.recording import Reader" in c for c in cmds)
    assert any(c.startswith("ddptui demo") for c in cmds) and any(c.startswith("demo/talk.sh") for c in cmds)


@pytest.mark.parametrize("cmd", commands())
def test_command_runs(cmd, tmp_path):
    os.symlink(os.path.join(ROOT, "demo"), tmp_path / "demo")
    argv = shlex.split(cmd)
    env = dict(os.environ, PYTHONPATH=pythonpath())
    if argv[0] == "ddptui" and len(argv) > 1 and argv[1].startswith("--"):  # live: needs GPUs here
        a = live_parser().parse_args(argv[1:])
        assert a.record and a.gpus
        return
    if argv[0] == "demo/talk.sh":
        argv = ["bash", "demo/talk.sh"] + [a for a in argv[1:] if not a.startswith("[")]
        env["DDPTUI_TALK_DRY_RUN"] = "1"
    elif argv[0] == "ddptui":
        argv = [sys.executable, "-m", "ddptui.cli.main"] + argv[1:]
        if argv[3] in ("replay", "demo") and "--headless" not in argv and "--seed-table" not in argv:
            argv.append("--headless")
    elif argv[0] == "python":
        argv[0] = sys.executable
    p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 0, f"{cmd}\n{p.stderr}"
    if argv[:2] == ["bash", "demo/talk.sh"]:
        assert p.stdout.strip().endswith("demo/gpu-h100-xlarge-2ranks-gloo.ddptui")


@pytest.mark.parametrize("present, plays", [
    (["cpu-small-2ranks.ddptui", "simulated-a100-pcie-xlarge-4gpus.ddptui", "h100-xlarge-8ranks.ddptui"],
     "h100-xlarge-8ranks.ddptui"),
    (["cpu-small-2ranks.ddptui", "simulated-a100-pcie-xlarge-4gpus.ddptui"], "simulated-a100-pcie-xlarge-4gpus.ddptui"),
    (["cpu-small-2ranks.ddptui"], "cpu-small-2ranks.ddptui"),
    (["cpu-small-2ranks.ddptui", "gpu-h100-xlarge-1rank-nccl.ddptui", "gpu-h100-xlarge-2ranks-gloo.ddptui",
      "simulated-a100-pcie-xlarge-4gpus.ddptui"], "gpu-h100-xlarge-2ranks-gloo.ddptui"),
])
def test_talk_prefers_gpu_then_simulated_then_cpu(present, plays, tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "talk.sh").write_text(open(os.path.join(ROOT, "demo", "talk.sh")).read())
    for name in present:
        (demo / name).write_bytes(b"")
    p = subprocess.run(["bash", str(demo / "talk.sh")], capture_output=True, text=True,
                       env=dict(os.environ, DDPTUI_TALK_DRY_RUN="1"), timeout=60)
    assert p.returncode == 0 and os.path.basename(p.stdout.strip()) == plays
