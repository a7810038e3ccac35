"""`ddptui bench`: the seeds' benchmark table, measured here, with the cost model next to it.

For each model, one live run (one torchrun) trains `single` and the chosen strategies,
alternating step by step inside the same workers, so all of them see the same machine at
the same time. Then, per model:

- the table of seed 002: model, strategy, ranks, parameters, median step, communication
  time, samples/s, speedup vs single;
- the cost model of seed 001: bytes per rank per step = 2(N-1)/N x parameters x 4 (fp32
  gradients; fsdp: 3(N-1)/N, all-gathers before forward and backward, reduce-scatter), the measured bus bandwidth (the best any strategy of that model reached), and
  the communication time that bandwidth predicts, next to the measured one;
- the Amdahl ceiling of seed 002: f = T_single / (T_single + T_comm_naive) with T_single
  the single strategy's median step and T_comm_naive naive's (blocking) AllReduce time;
  ceiling = 1 / ((1 - f) + f / N), against the speedup each strategy achieved.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from ranks import spec

from ddptui import __version__
from .common import CliError, Parser, check_environment, check_writable_path, json_target, sigterm_to_interrupt
from ddptui.model.costmodel import model_figures
from .options import add_numeric, run_parent
from ddptui.reports.report import print_bench_tables, write_csv, write_json

DEFAULT_MODELS = ("small", "medium")
DEFAULT_STRATEGIES = ("naive", "interleaved", "ddp", "fsdp")

CSV_FIELDS = (
    "model", "strategy", "ranks", "device", "params", "steps", "step_ms_median", "compute_ms",
    "comm_ms", "exposed_comm_ms", "overlap_pct", "samples_per_s", "speedup_vs_single",
    "allreduce_calls_per_step", "allreduce_bytes_per_step", "ring_bytes_per_rank_per_step",
    "bus_bw_gbps", "model_bus_bw_gbps", "predicted_comm_ms", "amdahl_f", "amdahl_ceiling",
    "efficiency_vs_ceiling",
)


def parser() -> Parser:
    p = Parser(prog="ddptui bench",
                description="Headless benchmark: single vs the chosen strategies for each model, "
                            "the seeds' table with the ring-AllReduce cost model and the Amdahl ceiling.",
                parents=[run_parent()])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), metavar="LIST",
                   help="comma-separated, from " + ", ".join(spec.MODELS) + " (default small,medium)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), metavar="LIST",
                   help="comma-separated, from naive, interleaved, ddp, fsdp (default all four); "
                        "single always runs as the baseline")
    add_numeric(p, "--steps", lo=2, hi=1_000_000, default=10,
                help="steps per strategy (default 10; the first is warm-up and not counted)")
    p.add_argument("--csv", metavar="PATH", help="also write one CSV row per model and strategy")
    p.add_argument("--record-dir", metavar="DIR",
                   help="record each model's run into DIR (default: no recording)")
    return p


def parse_models(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names:
        raise CliError("--models is empty; choose from " + ", ".join(spec.MODELS))
    for n in names:
        if n not in spec.MODELS:
            raise CliError(f"unknown model {n!r}; choose from " + ", ".join(spec.MODELS))
    return list(dict.fromkeys(names))


def parse_bench_strategies(text: str) -> list[str]:
    try:
        names = spec.parse_strategies(text)
    except ValueError as e:
        raise CliError(str(e)) from None
    names = [n for n in names if n != "single"]  # always the baseline, run first
    if not names:
        raise CliError("--strategies needs at least one of naive, interleaved, ddp, fsdp (single always runs)")
    return names


# -- running ---------------------------------------------------------------------------
def run_model(model: str, opts, plan, store, say):
    """One live run for one model, watched until it ends; returns the LiveRun.
    KeyboardInterrupt propagates once the ranks are stopped (`store` keeps what was measured)."""
    from ddptui.live.headless import Progress
    from ddptui.live.loop import watch
    from ddptui.live.session import LiveRun

    run = LiveRun(opts, plan, store)
    watch(run, Progress(store), opts.steps, say, what=f"the {model} ranks", final_count=True)
    return run


def main(argv: list[str]) -> int:
    from ddptui.live.launcher import plan as make_plan
    from ddptui.live.session import RunOptions
    from ddptui.model.store import Store

    a = parser().parse_args(argv)
    models = parse_models(a.models)
    strategies = parse_bench_strategies(a.strategies)
    json_path = json_target(a.json)
    csv_path = check_writable_path(a.csv, "--csv") if a.csv else None
    if json_path and csv_path and json_path == csv_path:
        raise CliError("--json and --csv name the same file")
    if a.record_dir:
        if not os.path.isdir(a.record_dir):
            raise CliError(f"--record-dir {a.record_dir}: no such directory")
        if not os.access(a.record_dir, os.W_OK):
            raise CliError(f"--record-dir {a.record_dir}: not writable")
    check_environment()
    try:
        plan = make_plan(a.gpus, None, a.device)
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.batch_size % plan.ranks:
        raise CliError(f"--batch-size {a.batch_size} must divide evenly across {plan.ranks} ranks")

    def say(text: str) -> None:
        print(f"ddptui bench: {text}", file=sys.stderr, flush=True)

    where = (f"{plan.ranks} CPU rank(s) on gloo — no GPU used, so these are CPU figures, not GPU ones"
             if plan.device == "cpu" else plan.note)
    say(f"{len(models)} model(s) × single + {', '.join(strategies)}; {where}; "
        f"{a.steps} steps each, global batch {a.batch_size}")
    old_term = signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    rows: list[dict] = []
    infos: list[dict] = []
    runs_meta: dict = {}
    state, message, code = "finished", "", 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        for i, model in enumerate(models):
            record = None
            if a.record_dir:
                record = os.path.abspath(os.path.join(a.record_dir, f"bench-{stamp}-{model}-{plan.ranks}r.ddptui"))
            opts = RunOptions(model=model, strategies=["single", *strategies], steps=a.steps,
                              batch_size=a.batch_size, bucket_cap_mb=a.bucket_cap_mb,
                              threads=a.threads, pg_timeout=a.pg_timeout, record=record,
                              hang_s=max(30.0, a.pg_timeout + 10),
                              extra_worker_args=["--layer-every", a.layer_every] if a.layer_every != "auto" else [])
            say(f"[{i + 1}/{len(models)}] model {model} ({spec.param_count(model):,} parameters): "
                f"starting {plan.ranks} {'CPU ' if plan.device == 'cpu' else ''}rank(s)…")
            t0 = time.monotonic()
            store = Store()
            try:
                run = run_model(model, opts, plan, store, say)
            except KeyboardInterrupt:
                state, message, code = "interrupted", f"interrupted during {model}", 130
                _collect(model, plan, store, rows, infos, runs_meta, "interrupted", record)
                break
            _collect(model, plan, store, rows, infos, runs_meta, run.state, record)
            say(f"[{i + 1}/{len(models)}] model {model}: {run.state} in {time.monotonic() - t0:.1f} s")
            if run.state != "finished":
                state, message, code = "failed", f"{model}: {run.message}", 1
                say(f"error: {model}: {run.message}")
                break
    except KeyboardInterrupt:  # between two models: nothing is running
        state, message, code = "interrupted", "interrupted", 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
    header = (f"ddptui bench · {plan.ranks} {'CPU rank(s) (no GPU)' if plan.device == 'cpu' else 'GPU rank(s)'}"
              f" · {runs_meta.get('backend') or ''} · global batch {a.batch_size} · "
              f"{a.steps} steps per strategy, medians after the warm-up step"
              + ("" if state == "finished" else f" · {state.upper()}: partial figures"))
    if rows:
        print_bench_tables(rows, infos, header, file=sys.stderr if json_path == "-" else None)
    else:
        say("nothing was measured")
    doc = {
        "tool": "ddptui bench", "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"models": models, "strategies": ["single", *strategies], "gpus": a.gpus,
                     "ranks": plan.ranks, "device": plan.device, "note": plan.note,
                     "steps": a.steps, "batch_size": a.batch_size, "threads": a.threads,
                     "bucket_cap_mb": a.bucket_cap_mb, "bytes_per_grad": spec.BYTES_PER_GRAD},
        "backend": runs_meta.get("backend"), "torch": runs_meta.get("torch"),
        "state": state, "message": message,
        "rows": rows, "models": infos,
    }
    if json_path:
        write_json(json_path, doc)
        if json_path != "-":
            say(f"wrote {json_path}")
    if csv_path:
        write_csv(csv_path, rows, CSV_FIELDS)
        say(f"wrote {csv_path}")
    return code


def _collect(model, plan, store, rows, infos, runs_meta, state: str, record=None) -> None:
    summaries = store.summaries()
    meta = store.meta.as_dict()
    ranks = store.rank_snapshot()
    if ranks:
        first = ranks[min(ranks)]
        runs_meta.setdefault("backend", first.backend or meta.get("backend"))
    if meta.get("torch") and meta.get("torch") != "synthetic":
        runs_meta.setdefault("torch", meta.get("torch"))
    r, info = model_figures(model, plan.ranks, summaries, plan.device)
    info["state"] = state
    info["recording"] = record
    info["dropped_spans"] = sum(i.dropped_spans for i in ranks.values())
    rows.extend(r)
    infos.append(info)
