import os
import sys
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# every process this test session starts inherits this tag: leftover checks look only at
# ours. One tag per pytest-xdist worker, so tests running side by side never see (or
# signal) each other's ranks.
_RUN = os.environ.setdefault("DDPTUI_TEST_RUN", uuid.uuid4().hex)
os.environ["DDPTUI_TEST_SESSION"] = f"{_RUN}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
# Every test means CPU ranks unless it is marked gpu: the GPU-count seam at 0 for this session
# and every process it starts (the CLI, torchrun, in-process plans), so that `--gpus 2` in a
# CPU test means two CPU ranks on a machine with one GPU too (there it would be refused: "--gpus
# 2 but only 1 GPU(s) present"). A test marked gpu sees the machine's own count again
# (`_gpu_tests_see_the_gpus`). Check: on a machine without CUDA the suite passes with
# DDPTUI_GPU_COUNT=1 set for the whole run.
_GPU_COUNT = os.environ.get("DDPTUI_GPU_COUNT")
os.environ["DDPTUI_GPU_COUNT"] = "0"


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# fixtures that start real ranks, by scope: the tests sharing one run go to one pytest-xdist
# worker (`--dist loadgroup`), so the run is made once
SHARED_RUNS = {"run": "module", "kineto_traces": "session", "cli_run": "session", "lm_run": "module",
               "mlp_run": "module", "user_lm_run": "session",
               "inductor_run": "module", "outside_run": "module"}
# runs whose tests must share one worker although they read different fixtures (a test reading
# two of them, others one each): one group, whatever the fixture
SHARED_GROUPS = {"user_lm_run": "user-scripts", "lm_run": "user-scripts", "mlp_run": "user-scripts"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # the modules that start real runs first, each module's tests kept together (its shared
    # run is made once): pytest-xdist hands tests out in this order, so the last ones to go
    # are short, and no worker is left with a long run while the others have finished
    for item in items:
        shared = sorted(set(SHARED_RUNS).intersection(getattr(item, "fixturenames", ())))
        if shared:
            # a module's shared runs in one group (a test reading two of them, others one each:
            # one worker makes each once), a session's by its name; a test reading a real run
            # is slow, whoever made the run (`bin/test --fast` leaves it out)
            together = next((SHARED_GROUPS[n] for n in shared if n in SHARED_GROUPS), None)
            name = shared[0]
            group = (f"shared:{together}" if together is not None
                     else f"session:{name}" if SHARED_RUNS[name] == "session" else f"{item.module.__name__}:runs")
            item.add_marker(pytest.mark.xdist_group(group))
            item.add_marker(pytest.mark.slow)
    slow = {item.module.__name__ for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.module.__name__ not in slow)
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# `bin/test --fast` (DDPTUI_TEST_FAST=1) runs the tests that start no real run, in about a
# minute: one that starts real ranks itself (or in a function-scoped fixture) without being
# marked slow fails there, saying so, so that the quick tier stays quick (measured by the CPU
# of the processes it waited for: a torchrun launch costs 5-8 CPU-s here, a CLI verb in a
# process of its own well under one). A module or session fixture's run is made before this
# reading: such fixtures go in SHARED_RUNS, which marks their tests slow.
FAST_CHILD_CPU_S = 3.0


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_real_run(request):
    if not os.environ.get("DDPTUI_TEST_FAST") or request.node.get_closest_marker("slow"):
        yield
        return
    import resource

    def children() -> float:
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return c.ru_utime + c.ru_stime
    c0 = children()
    yield
    used = children() - c0
    assert used < FAST_CHILD_CPU_S, (
        f"{request.node.nodeid} used {used:.1f} CPU-s in processes it started: it starts real ranks, "
        f"so mark it slow (bin/test --fast leaves slow tests out)")


@pytest.fixture(autouse=True)
def _gpu_tests_see_the_gpus(request, monkeypatch):
    """A test marked gpu, and what it starts, count the machine's GPUs as the user set them
    (DDPTUI_GPU_COUNT as it was before this session, else NVML)."""
    if "gpu" in request.keywords:
        if _GPU_COUNT is None:
            monkeypatch.delenv("DDPTUI_GPU_COUNT", raising=False)
        else:
            monkeypatch.setenv("DDPTUI_GPU_COUNT", _GPU_COUNT)
    yield


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory):
    """The session's processes make their temporary files under pytest's own temporary
    directory (kept for the last few sessions only), not the machine's: what a test's
    SIGKILLed process leaves behind, and torchrun's log folders, do not pile up there."""
    import tempfile
    d = tmp_path_factory.mktemp("tmp")
    if len(str(d)) > 60:  # (a run's socket goes two levels under it: a Unix socket's path has 107 bytes)
        yield
        return
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(d), None
    yield
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


TOKEN = b"0123456789abcdef0123456789abcdef"  # the run's token in the multi-node and doors tests


@pytest.fixture
def token_file(tmp_path):
    """TOKEN in a file only its owner can read, as `--token-file` wants it."""
    p = tmp_path / "token"
    p.write_bytes(TOKEN + b"\n")
    p.chmod(0o600)
    return str(p)



@pytest.fixture(scope="session")
def cli_run(tmp_path_factory):
    """One real recorded run of `ddptui --headless` (2 CPU ranks, small, naive and ddp,
    CLI_RUN_STEPS steps, batch 256), shared by the tests of its report, the verbs that read
    its recording and what-if: {"dir", "rec", "json", "stdout", "stderr"}. It runs with a
    temporary directory of its own, which it must leave empty (no socket folder, no
    torchrun log folder)."""
    import json

    from .helpers import CLI_RUN_STEPS, assert_no_leftovers, run_cli

    d = tmp_path_factory.mktemp("cli-run")
    tmp = d / "tmp"
    tmp.mkdir()
    rec, js = d / "run.ddptui", d / "run.json"
    res = run_cli("--headless", "--gpus", "2", "--model", "small", "--batch-size", "256",
                  "--steps", str(CLI_RUN_STEPS), "--record", str(rec), "--json", str(js),
                  timeout=180, env={"DDPTUI_GPU_COUNT": "0", "TMPDIR": str(tmp)})
    assert res.returncode == 0, res.stderr
    assert_no_leftovers(5)
    return {"dir": d, "rec": rec, "json": json.loads(js.read_text()), "stdout": res.stdout,
            "stderr": res.stderr, "tmp_left": sorted(os.listdir(tmp))}


@pytest.fixture(scope="session")
def kineto_traces(tmp_path_factory):
    """One real 2-rank CPU run (gloo, torchrun) profiled four times by torch.profiler, as users
    record theirs (tests/kineto_record_colls.py): a script's own collectives ("explicit"), FSDP2
    ("fsdp"), DDP with module records and stacks ("ddp") and without ("plain"), each a folder of
    a JSON a rank; read by tests/test_kineto_colls.py and tests/test_kineto_import.py."""
    import subprocess
    import sys

    from .helpers import ROOT
    d = tmp_path_factory.mktemp("kineto")
    out = {k: str(d / k) for k in ("explicit", "fsdp", "ddp", "plain")}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        os.path.join(ROOT, "tests", "kineto_record_colls.py"), out["explicit"],
                        "--fsdp-out", out["fsdp"], "--ddp-out", out["ddp"], "--ddp-plain-out", out["plain"]],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def user_lm_run(tmp_path_factory):
    """One real recorded `ddptui run --headless --auto --output all` (2 CPU ranks) of
    tests/scripts/tied.py, a plain DDP script that knows nothing of ddptui: a tiny language model
    with tied weights, rank 0 alone evaluating before every third iteration, each rank printing
    its loss every iteration and a line on stderr at its end; its steps sound (helpers.
    sound_script_run). Shared by the tests of such scripts (tests/test_user_scripts.py), of
    --auto's instrumentation and of the script's output passed through: a helpers.ScriptRun
    (JSON, recording loaded, stdout; .stderr, .rec). Its processes are gone when it returns."""
    from .helpers import assert_no_leftovers, sound_script_run

    run = sound_script_run(tmp_path_factory.mktemp("lm"), "tied.py", ("--every", "3", "--how", "both"),
                           cli=("--output", "all"))
    assert_no_leftovers()
    return run


# DDPTUI_TEST_COST=FILE: a line of JSON a test appended to FILE (its id, its worker, wall
# seconds, CPU seconds of the pytest process and of the processes it started and waited for:
# fixtures' runs counted in the test that made them), to see where the suite's CPU goes
# (`python -m tests.cost FILE`): on two cores the suite is CPU-bound, its wall time about half
# its CPU time.
_COST = os.environ.get("DDPTUI_TEST_COST")
if _COST:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        import json
        import resource
        import time

        def cpu():
            s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
        t0, (s0, c0) = time.monotonic(), cpu()
        yield
        t1, (s1, c1) = time.monotonic(), cpu()
        with open(_COST, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "start": time.time() - (t1 - t0), "wall": round(t1 - t0, 3),
                                "self_cpu": round(s1 - s0, 3), "children_cpu": round(c1 - c0, 3)}) + "\n")
