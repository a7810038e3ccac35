"""P8: opening torch.profiler (Kineto) traces, one JSON per rank, with `ddptui summary DIR`'s
path (`recording.load(DIR)`: ddptui.recording.kineto's reader, the Feed, the Store).

A set of rank traces is generated from the real A100 NCCL trace of tests/data (its steps
repeated with times, External ids and correlations moved on; rank r shifted by r x 50 µs),
formatted as torch's profiler writes them. Two figures, each in a fresh process:

- memory: peak RSS growth while the traces are opened, over the peak RSS growth of opening
  the same run from a ddptui recording of the same frames (what ddptui keeps: the Store);
- speed: MB of JSON per CPU-second of the importing process (one core).

    .venv/bin/python benchmarks/p8_trace_import.py            # 1 GB of JSON (4 ranks)
    .venv/bin/python benchmarks/p8_trace_import.py --mb 256   # a smaller set
    .venv/bin/python benchmarks/p8_trace_import.py --quick    # 32 MB (CI)
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from _common import ROOT, result_line

A100 = os.path.join(ROOT, "tests", "data", "hta_nccl_a100.json.gz")

CHILD = r"""
import json, os, resource, sys, time
import psutil
from ddptui.recording import kineto, loader as recording  # noqa: F401  (imported before the baseline)
from ddptui.model import store  # noqa: F401
from ddptui.ingest import feed  # noqa: F401
import msgspec, ijson  # noqa: F401
path = sys.argv[1]
base = psutil.Process().memory_info().rss
c0, w0 = time.process_time(), time.perf_counter()
got = recording.load(path)
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_growth": peak - base, "cpu_s": cpu, "wall_s": wall,
                  "steps": len(got.store.complete_steps("ddp")), "spans": got.spans}))
"""


def generate(d: str, mb: float, world: int) -> int:
    """Rank traces of about `mb` MB of JSON in all; returns their bytes."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    with gzip.open(A100, "rt") as f:
        doc = json.load(f)
    evs = doc["traceEvents"]
    ts = [e["ts"] for e in evs if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    ext_max = max(int((e.get("args") or {}).get("External id", 0) or 0) for e in evs) + 1
    corr_max = max(int((e.get("args") or {}).get("correlation", 0) or 0) for e in evs) + 1
    steps = sorted(int(e["name"].split("#")[1]) for e in evs if e.get("name", "").startswith("ProfilerStep#"))
    per_copy = len(json.dumps(evs))
    copies = max(1, round(mb * 1e6 / world / per_copy))
    total = 0
    for r in range(world):
        path = os.path.join(d, f"rank{r}.pt.trace.json")
        with open(path, "w") as f:
            f.write("{\n")
            for k, v in doc.items():
                if k != "traceEvents":
                    v = dict(v, rank=r, world_size=world) if k == "distributedInfo" else v
                    f.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
            f.write('  "traceEvents": [\n')
            first = True
            for c in range(copies):
                shift = c * span + r * 50.0
                for e in evs:
                    e = dict(e)
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = e["ts"] + shift
                    a = e.get("args")
                    if a:
                        a = dict(a)
                        if "External id" in a:
                            a["External id"] = a["External id"] + c * ext_max
                        if "correlation" in a:
                            a["correlation"] = a["correlation"] + c * corr_max
                        e["args"] = a
                    if e.get("name", "").startswith("ProfilerStep#"):
                        e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + c * len(steps)}"
                    f.write(("" if first else ",\n") + "  {\n    " + json.dumps(e)[1:-1] + "\n  }")
                    first = False
            f.write("\n  ]\n}\n")
        total += os.path.getsize(path)
    return total


def child(path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"P8: the import failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1024, help="MB of JSON in all (default 1024)")
    ap.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--quick", action="store_true", help="32 MB (CI)")
    a = ap.parse_args()
    mb = 32 if a.quick else a.mb
    from ddptui.recording.rankset import open_reader as Reader
    from ranks.recfile import RecordWriter
    with tempfile.TemporaryDirectory(prefix="ddptui-p8-") as tmp:
        d = os.path.join(tmp, "traces")
        os.mkdir(d)
        nbytes = generate(d, mb, a.world)
        print(f"generated {a.world} rank traces, {nbytes / 1e6:.0f} MB of JSON", flush=True)
        imp = child(d)
        rec = os.path.join(tmp, "same.ddptui")  # the same frames as a ddptui recording
        r = Reader(d)
        w = RecordWriter(rec, r.meta)
        for body, frame in r:
            w.write_body(body, frame)
        w.close()
        kept = child(rec)
    mbs = nbytes / 1e6 / imp["cpu_s"]
    ratio = imp["peak_growth"] / max(kept["peak_growth"], 1)
    print(f"import: {imp['steps']} steps, {imp['spans']} spans, {imp['cpu_s']:.2f} CPU s "
          f"({imp['wall_s']:.2f} s wall), peak RSS growth {imp['peak_growth'] / 1e6:.1f} MB; "
          f"the same run from a ddptui recording: peak RSS growth {kept['peak_growth'] / 1e6:.1f} MB")
    print(result_line("P8", "trace_import", "rss_ratio", ratio, "<=", 1.5, "{:.2f}"))
    print(result_line("P8", "trace_import", "mb_per_cpu_s", mbs, ">=", 50, "{:.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
