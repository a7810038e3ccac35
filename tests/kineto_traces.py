"""Kineto traces for the import tests: the real A100 trace of tests/data as rank 0, and a
rank 1 made from it (every time shifted; its distributedInfo says rank 1)."""
from __future__ import annotations

import gzip
from functools import partial
import json
import os

DATA = os.path.join(os.path.dirname(__file__), "data")
A100 = os.path.join(DATA, "hta_nccl_a100.json.gz")


def a100_doc() -> dict:
    with gzip.open(A100, "rt") as f:
        return json.load(f)


def write_torch_formatted(doc: dict, path: str) -> None:
    """JSON formatted as torch's profiler writes it: top-level keys, then one event per `\\n  {` block."""
    opener = partial(gzip.open, compresslevel=1) if path.endswith(".gz") else open  # (fast; read the same)
    with opener(path, "wt") as f:
        f.write("{\n")
        for k, v in doc.items():
            if k != "traceEvents":
                f.write(f'  {json.dumps(k)}: {json.dumps(v)},\n')
        f.write('  "traceEvents": [\n')
        f.write(",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in doc["traceEvents"]))
        f.write("\n  ]\n}\n")


def shifted(doc: dict, rank: int, shift_us: float) -> dict:
    """The same trace as another rank: every time moved by shift_us."""
    out = dict(doc, distributedInfo=dict(doc["distributedInfo"], rank=rank))
    evs = []
    for e in doc["traceEvents"]:
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e = dict(e, ts=e["ts"] + shift_us)
        evs.append(e)
    out["traceEvents"] = evs
    return out


def a100_pair(d: str, shift_us: float = 250.0, gz: bool = True) -> str:
    """Two ranks of the A100 trace in directory d: rank 0 as recorded, rank 1 shifted."""
    os.makedirs(d, exist_ok=True)
    doc = a100_doc()
    ext = ".json.gz" if gz else ".json"
    with open(A100, "rb") as src, open(os.path.join(d, "rank0" + ext if gz else "rank0.json"), "wb") as dst:
        data = src.read()
        dst.write(data if gz else gzip.decompress(data))
    write_torch_formatted(shifted(doc, 1, shift_us), os.path.join(d, "rank1" + ext))
    return d
