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


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# module-scoped fixtures that start real ranks: the tests sharing one run go to one
# pytest-xdist worker (`--dist loadgroup`), so the run is made once
SHARED_RUNS = {"run", "live", "cpu_traces", "cpu_traces_plain"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = SHARED_RUNS.intersection(getattr(item, "fixturenames", ()))
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{min(shared)}"))
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TOKEN = b"0123456789abcdef0123456789abcdef"  # the run's token in the multi-node and doors tests


@pytest.fixture
def token_file(tmp_path):
    """TOKEN in a file only its owner can read, as `--token-file` wants it."""
    p = tmp_path / "token"
    p.write_bytes(TOKEN + b"\n")
    p.chmod(0o600)
    return str(p)
