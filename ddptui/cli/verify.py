"""`ddptui verify`: can I trust these bars on my machine?

Runs the normal instrumented ranks (the same session as `ddptui --headless`) with
torch.profiler active on every rank for steps 1..K-1 (step 0 is warm-up), then pairs every
ddptui span of those steps with the profiler's own record of the same work (ddptui/reports/verify.py)
and prints, per (strategy, kind), how far apart they are.

Exit status: 0 when every kind is within tolerance; 1 when one is not (or the run failed);
2 for a bad command line or environment (one line on stderr).
"""
from __future__ import annotations

import glob
import io
import json
import os
import shutil
import signal
import sys
import tempfile

from ranks import spec
from ranks.wire import COMM

from ddptui.reports import verify
from .common import CliError, JSON_METAVAR, json_target, Parser
from .options import add_numeric


# the strategies verify holds to its tolerances by default: FSDP2's layer spans (module hooks,
# after its all-gather's wait) are not yet within them on CPU (forward starts ~2 ms apart)
VERIFIED = tuple(s for s in spec.STRATEGIES if s != "fsdp")


def parser() -> Parser:
    p = Parser(prog="ddptui verify", description="Check every ddptui span against torch.profiler's "
                "own record of the same work (ops, autograd nodes, collectives, kernels) on this machine.")
    add_numeric(p, "--gpus", 1, 64, default=2,
                   help="GPUs to use (default 2); with no GPU, the number of CPU ranks")
    add_numeric(p, "--ranks", 1, 64, default=None,
                   help="ranks to start (default: one per GPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where ranks compute (default auto: CUDA when present)")
    p.add_argument("--model", default="small", metavar="NAME",
                   help="model: " + ", ".join(spec.MODELS) + " (default small)")
    p.add_argument("--strategies", default=",".join(VERIFIED), metavar="LIST",
                   help="comma-separated, from " + ", ".join(spec.STRATEGIES) + " (default "
                        + ",".join(VERIFIED) + "; fsdp's spans, compared when asked, are not yet "
                        "held within the tolerances)")
    add_numeric(p, "--steps", 2, 1000, default=5,
                   help="steps per strategy; all but the first are profiled and compared (default 5)")
    add_numeric(p, "--batch-size", 1, 1 << 20, default=1024,
                   help="global batch, split across ranks (default 1024)")
    add_numeric(p, "--threads", 1, 256, default=1,
                   help="torch threads per CPU rank (default 1)")
    add_numeric(p, "--pg-timeout", default=60.0, metavar="S",
                   help="process-group timeout in seconds (default 60)")
    p.add_argument("--compile", metavar="BACKEND", choices=("inductor", "aot_eager", "eager"),
                   help="compile each block of the model with torch.compile(backend=BACKEND): "
                        "inductor, aot_eager or eager (the first step then compiles: give it "
                        "--pg-timeout to spare); the spans are checked against the profiler's "
                        "compiled regions and their backward nodes")
    p.add_argument("--json", metavar=JSON_METAVAR, help="also write the comparison as JSON to PATH (-: to stdout, the table to stderr)")
    return p


def main(argv: list[str]) -> int:
    from .main import build_live

    a = parser().parse_args(argv)
    # the same options, checks and session as `ddptui --headless`, plus the profiler window
    live = ["--headless", "--no-record", "--gpus", str(a.gpus), "--device", a.device,
            "--model", a.model, "--strategies", a.strategies, "--steps", str(a.steps),
            "--batch-size", str(a.batch_size), "--threads", str(a.threads),
            "--pg-timeout", str(a.pg_timeout)] + (["--ranks", str(a.ranks)] if a.ranks else [])
    _, opts, plan = build_live(live)
    pipes = [s for s in opts.strategies if s in spec.BUILTIN_PIPELINES]
    if pipes:  # (their microbatches are not what torch.profiler's spans are matched to)
        raise CliError(f"verify checks the spans of {', '.join(VERIFIED)} against torch.profiler, not the "
                       f"pipelines ({', '.join(pipes)}): leave them out of --strategies")
    json_path = json_target(a.json)
    prof_dir = tempfile.mkdtemp(prefix="ddptui-verify-")  # private (0700)
    try:
        opts.extra_worker_args += ["--profile-steps", f"1:{a.steps}", "--profile-dir", prof_dir]
        if a.compile:
            opts.extra_worker_args += ["--compile", a.compile]
        return _run(opts, plan, prof_dir, json_path)
    finally:
        shutil.rmtree(prof_dir, ignore_errors=True)


def _run(opts, plan, prof_dir: str, json_path: str | None, out=None, err=None) -> int:
    from .common import sigterm_to_interrupt
    from ddptui.live.headless import run_headless
    from ddptui.model.store import Store

    out = out or sys.stdout
    err = err or sys.stderr
    store = Store()
    print(f"ddptui: verify: {plan.ranks} rank(s), model {opts.model}, torch.profiler on steps "
          f"1..{opts.steps - 1} of every strategy", file=err, flush=True)
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    code = run_headless(opts, plan, None, out=io.StringIO(), err=err, store=store)
    if code != 0:
        return code
    print("ddptui: comparing spans with the profiles…", file=err, flush=True)
    doc, table, notes = compare(store, prof_dir, opts.model, opts.strategies, plan.device)
    for n in notes:
        print(f"ddptui: note: {n}", file=err)
    print(table, file=err if json_path == "-" else out, flush=True)
    bad = [f"{r['strategy']} {r['kind']}" for r in doc["compared"] if not r["ok"]]
    if json_path == "-":
        json.dump(doc, out, indent=1)
        out.write("\n")
        out.flush()
    elif json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
    if not doc["compared"]:
        print("ddptui: error: nothing was compared (no profiled step)", file=err)
        return 1
    if bad:
        print("ddptui: verify FAILED: " + ", ".join(bad) + " not within tolerance", file=err)
        return 1
    print("ddptui: verify passed: every kind is within tolerance", file=err)
    return 0


def compare(store, prof_dir: str, model: str, strategies: list[str], device: str):
    """(JSON document, printed table, notes) for a finished run's store and rank profiles."""
    n_layers = len(spec.MODEL_WIDTHS[model]) - 1
    notes: list[str] = []
    pairs: list[verify.SpanPair] = []
    ranks = store.rank_snapshot()
    raw = store.span_batches()
    paths = sorted(glob.glob(os.path.join(prof_dir, "profile.rank*.json")))
    have = set()
    cuda = False
    first = ranks[min(ranks)] if ranks else None
    backend = first.backend if first else ""
    profs = [verify.load_profile(path) for path in paths]
    cuda = any(p.cuda for p in profs)
    # NCCL with one rank launches no kernel for an in-place sum: nothing to compare with
    check_comm = not (cuda and len(ranks) == 1)
    if not check_comm:
        notes.append("one rank on CUDA: NCCL launches no kernel for an AllReduce on one rank, "
                     "so communication is not checked; compute is")
    for prof in profs:
        have.add(prof.rank)
        if abs(prof.drift_ns) > 20_000:
            notes.append(f"rank {prof.rank}: the wall clock moved {prof.drift_ns / 1000:.0f} µs "
                         f"against the monotonic clock during the window")
        lo, hi = prof.window
        batches = [b for s, per in raw.items() for k, rs in per.items() if lo <= k < hi
                   for r, b in rs.items() if r == prof.rank]
        span_steps = verify.steps_from_batches(batches)
        profiled_steps = verify.profile_steps(prof, n_layers)

        def comm_bytes(strategy, step, idx, r=prof.rank):
            return store.comm_bytes_fn(strategy, r, step)(idx)

        got, rank_notes = verify.match_rank(span_steps, profiled_steps, comm_bytes, n_layers=n_layers,
                                            check_comm=check_comm)
        pairs.extend(got)
        notes.extend(f"rank {prof.rank}: {n}" for n in rank_notes)
    for r in sorted(set(ranks) - have):
        notes.append(f"rank {r} wrote no profile: its spans are unmatched")
        for s, per in raw.items():
            for k, rs in per.items():
                if k >= 1 and r in rs:
                    for kd in rs[r].kind:
                        if kd != COMM or check_comm:
                            pairs.append(verify.SpanPair(s, kd, None, None))
    tol, late = verify.tolerances(cuda, backend)
    bounds = [i.clock_bound_ns for i in ranks.values() if getattr(i, "clock_bound_ns", None) is not None]
    bound = max(bounds) if cuda and bounds else None
    tol, widened = verify.widen_for_clock(tol, bound)
    if widened is not None:
        notes.append(f"ddptui's GPU times are good to ±{bound / 1000:.1f} µs on this run (its clock's "
                     f"bound: the calibration's bracket and how late an event on an idle stream is "
                     f"stamped, as on a GPU time-sliced between processes): tolerances widened to "
                     f"{widened} µs")
    rows = verify.summarize(pairs, tol, [s for s in strategies if s in raw], late_only=late)
    doc = {"ok": bool(rows) and all(r["ok"] for r in rows),
           "device": first.device if first else device,
           "backend": first.backend if first else "",
           "ranks": len(ranks), "model": model, "pass_pct": verify.PASS_PCT,
           "communication_checked": check_comm, "short_span_us": verify.SHORT_SPAN_US,
           "clock_bound_us": None if bound is None else round(bound / 1000, 1),
           "tolerance_widened_to_us": widened, "compared": rows}
    title = (f"ddptui verify · {model} · {len(ranks)} rank(s) · {doc['backend']} · "
             f"{doc['device']} · |Δ| = ddptui vs torch.profiler, µs; tolerance start/end"
             + " (+: a start is held only when late)"
             + ("" if widened is None else f"; widened to {widened} µs, the GPU clock's error bound"
                f" on this run (±{bound / 1000:.1f} µs)"))
    return doc, verify.format_table(rows, title), notes
