"""The GPU pass's preflight (benchmarks/gpu_pass.sh): every package pyproject.toml asks for, its
dependencies and the test extra, installed at a version its requirement admits. Prints what is
missing or too old and exits 1; exits 0 saying how many were checked.

    python benchmarks/gpu_pass_needs.py [--extra test]

tests/test_bench.py checks it both ways (CI has no GPU: the pass's own preflight is rehearsed there).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirements(extras: list[str], path: str) -> list[str]:
    with open(path, "rb") as f:
        if tomllib is None:  # (no TOML reader: the installed metadata's)
            return [r.split(";")[0] for r in md.requires("ddptui") or []]
        doc = tomllib.load(f)
    proj = doc["project"]
    out = list(proj.get("dependencies", []))
    for e in extras:
        out += proj.get("optional-dependencies", {}).get(e, [])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", action="append", default=None, help="extras to check (default: test)")
    p.add_argument("--pyproject", default=os.path.join(ROOT, "pyproject.toml"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    from packaging.requirements import Requirement  # (pip's own copy where packaging is absent)
    bad = []
    reqs = requirements(a.extra or ["test"], a.pyproject)
    for text in reqs:
        r = Requirement(text)
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            bad.append(f"{r.name} missing (wants {r.specifier or 'any'})")
            continue
        if r.specifier and not r.specifier.contains(have, prereleases=True):
            bad.append(f"{r.name} {have} (wants {r.specifier})")
    if bad:
        print("what pyproject.toml asks for and this Python lacks: " + "; ".join(bad))
        return 1
    print(f"all {len(reqs)} packages pyproject.toml asks for are here")
    return 0


if __name__ == "__main__":
    try:
        import packaging  # noqa: F401
    except ImportError:
        sys.modules["packaging"] = __import__("pip._vendor.packaging", fromlist=["requirements"])
        sys.modules["packaging.requirements"] = sys.modules["packaging"].requirements
    sys.exit(main())
