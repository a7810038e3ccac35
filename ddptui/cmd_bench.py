"""`ddptui bench`: the seeds' benchmark table, measured here, with the cost model next to it.

For each model, one live run (one torchrun) trains `single` and the chosen strategies,
alternating step by step inside the same workers, so all of them see the same machine at
the same time. Then, per model:

- the table of seed 002: model, strategy, ranks, parameters, median step, communication
  time, samples/s, speedup vs single;
- the cost model of seed 001: bytes per rank per step = 2(N-1)/N x parameters x 4 (fp32
  gradients), the measured bus bandwidth (the best any strategy of that model reached), and
  the communication time that bandwidth predicts, next to the measured one;
- the Amdahl ceiling of seed 002: f = T_single / (T_single + T_comm_naive) with T_single
  the single strategy's median step and T_comm_naive naive's (blocking) AllReduce time;
  ceiling = 1 / ((1 - f) + f / N), against the speedup each strategy achieved.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time

from ranks import spec

from . import __version__
from . import figures as F
from .cli import CliError, _check_writable_path, _Parser, check_environment
from .options import add_numeric

DEFAULT_MODELS = ("small", "medium")
DEFAULT_STRATEGIES = ("naive", "interleaved", "ddp")

CSV_FIELDS = (
    "model", "strategy", "ranks", "device", "params", "steps", "step_ms_median", "compute_ms",
    "comm_ms", "exposed_comm_ms", "overlap_pct", "samples_per_s", "speedup_vs_single",
    "allreduce_calls_per_step", "allreduce_bytes_per_step", "ring_bytes_per_rank_per_step",
    "bus_bw_gbps", "model_bus_bw_gbps", "predicted_comm_ms", "amdahl_f", "amdahl_ceiling",
    "efficiency_vs_ceiling",
)


def parser() -> _Parser:
    p = _Parser(prog="ddptui bench",
                description="Headless benchmark: single vs the chosen strategies for each model, "
                            "the seeds' table with the ring-AllReduce cost model and the Amdahl ceiling.")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), metavar="LIST",
                   help="comma-separated, from " + ", ".join(spec.MODELS) + " (default small,medium)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), metavar="LIST",
                   help="comma-separated, from naive, interleaved, ddp (default all three); "
                        "single always runs as the baseline")
    add_numeric(p, "--gpus", default=2,
                   help="GPUs (ranks) to use (default 2); with no GPU, the number of CPU ranks")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where ranks compute (default auto: CUDA when present)")
    add_numeric(p, "--steps", lo=2, hi=1_000_000, default=10,
                   help="steps per strategy (default 10; the first is warm-up and not counted)")
    add_numeric(p, "--batch-size", default=1024,
                   help="global batch, split across ranks (default 1024)")
    add_numeric(p, "--bucket-cap-mb", default=None,
                   help="DDP bucket size in MB (default PyTorch's, 25)")
    add_numeric(p, "--threads", default=1,
                   help="torch threads per CPU rank (default 1)")
    add_numeric(p, "--pg-timeout", default=60.0, metavar="S",
                   help="process-group timeout in seconds (default 60)")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
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
        raise CliError("--strategies needs at least one of naive, interleaved, ddp (single always runs)")
    return names


# -- the arithmetic (pure) -------------------------------------------------------------
def ring_bytes_per_rank(params: int, ranks: int, bytes_per_grad: int = spec.BYTES_PER_GRAD) -> float:
    """Seed 001: bytes each rank sends (and receives) per step in a ring AllReduce."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * params * bytes_per_grad


def amdahl(t_single_ms: float | None, t_comm_naive_ms: float | None, ranks: int):
    """Seed 002: (f, ceiling) with f = T_single / (T_single + T_comm_naive)."""
    if not t_single_ms or t_comm_naive_ms is None or t_single_ms <= 0 or ranks < 1:
        return None, None
    f = t_single_ms / (t_single_ms + max(0.0, t_comm_naive_ms))
    return f, 1.0 / ((1.0 - f) + f / ranks)


def model_figures(model: str, ranks: int, summaries: list[dict], device: str) -> tuple[list[dict], dict]:
    """Rows of the table (one per strategy) and the model's cost-model/Amdahl figures."""
    params = spec.param_count(model)
    ring = ring_bytes_per_rank(params, ranks)
    by = {s["strategy"]: s for s in summaries if s.get("step_ms_median")}
    sp = F.speedups(list(by.values()))
    # the network's effective bus bandwidth, as the best any strategy of this run reached
    bw, bw_from = None, None
    for s, r in by.items():
        b = r.get("bus_bw_gbps")
        if s != "single" and b and (bw is None or b > bw):
            bw, bw_from = b, s
    t_single = by.get("single", {}).get("step_ms_median")
    t_comm_naive = by.get("naive", {}).get("comm_ms")
    f, ceiling = amdahl(t_single, t_comm_naive, ranks)
    rows = []
    for s in summaries:
        name = s["strategy"]
        n = s.get("ranks", 1)
        measured = bool(s.get("step_ms_median"))
        speed = 1.0 if name == "single" and measured else sp.get(f"{name}_vs_single")
        rb = ring if name != "single" else 0.0
        rows.append({
            "model": model, "strategy": name, "ranks": n, "device": device, "params": params,
            "steps": s.get("steps", 0),
            "step_ms_median": s.get("step_ms_median"), "compute_ms": s.get("compute_ms"),
            "comm_ms": s.get("comm_ms"), "exposed_comm_ms": s.get("exposed_comm_ms"),
            "overlap_pct": s.get("overlap_pct"), "samples_per_s": s.get("samples_per_s"),
            "speedup_vs_single": speed,
            "allreduce_calls_per_step": s.get("allreduce_calls_per_step"),
            "allreduce_bytes_per_step": s.get("bytes_per_step"),
            "ring_bytes_per_rank_per_step": rb,
            "bus_bw_gbps": s.get("bus_bw_gbps"),
            "model_bus_bw_gbps": bw if name != "single" else None,
            "predicted_comm_ms": (0.0 if name == "single" else
                                  rb / (bw * 1e9) * 1e3 if bw else None),
            "amdahl_f": f if name != "single" else None,
            "amdahl_ceiling": ceiling if name != "single" else None,
            "efficiency_vs_ceiling": (speed / ceiling if speed is not None and ceiling
                                      and name != "single" else None),
        })
    best = max((r for r in rows if r["strategy"] != "single" and r["speedup_vs_single"]),
               key=lambda r: r["speedup_vs_single"], default=None)
    info = {
        "model": model, "params": params, "ranks": ranks, "device": device,
        "grad_bytes": params * spec.BYTES_PER_GRAD, "ring_bytes_per_rank_per_step": ring,
        "bus_bw_gbps": bw, "bus_bw_from": bw_from,
        "predicted_comm_ms": ring / (bw * 1e9) * 1e3 if bw else None,
        "t_single_ms": t_single, "t_comm_naive_ms": t_comm_naive,
        "amdahl_f": f, "amdahl_ceiling": ceiling,
        "best_strategy": best["strategy"] if best else None,
        "best_speedup": best["speedup_vs_single"] if best else None,
    }
    return rows, info


# -- output ----------------------------------------------------------------------------
def _f(v, fmt="{:.2f}", na="—"):
    return na if v is None else fmt.format(v)


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def print_tables(rows: list[dict], infos: list[dict], header: str, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file or sys.stdout, width=160)
    t = Table(title=header, header_style="bold")
    for col in ("model", "strategy", "ranks", "params", "step ms (median)", "comm ms",
                "samples/s", "speedup vs single"):
        t.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    last = None
    for r in rows:
        if last is not None and r["model"] != last:
            t.add_section()
        last = r["model"]
        t.add_row(r["model"], r["strategy"], str(r["ranks"]), _params(r["params"]),
                  _f(r["step_ms_median"]),
                  "—" if r["strategy"] == "single" else _f(r["comm_ms"]),
                  _f(r["samples_per_s"], "{:,.0f}"), _f(r["speedup_vs_single"], "{:.2f}×"))
    con.print(t)

    c = Table(title="cost model (seed 001): bytes/rank/step = 2(N−1)/N × params × 4 B; "
                    "predicted comm = bytes / bus bandwidth", header_style="bold")
    for col in ("model", "strategy", "AllReduce/step", "MB/rank/step", "bus GB/s (this)",
                "bus GB/s (best)", "predicted comm ms", "measured comm ms", "exposed comm ms"):
        c.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    last = None
    for r in rows:
        if r["strategy"] == "single":
            continue
        if last is not None and r["model"] != last:
            c.add_section()
        last = r["model"]
        c.add_row(r["model"], r["strategy"], _f(r["allreduce_calls_per_step"], "{:.0f}"),
                  _f(r["ring_bytes_per_rank_per_step"] / 1e6, "{:.2f}"), _f(r["bus_bw_gbps"]),
                  _f(r["model_bus_bw_gbps"]), _f(r["predicted_comm_ms"]), _f(r["comm_ms"]),
                  _f(r["exposed_comm_ms"]))
    con.print(c)

    a = Table(title="Amdahl (seed 002): f = T_single / (T_single + T_comm naive); "
                    "ceiling = 1 / ((1 − f) + f / N)", header_style="bold")
    for col in ("model", "ranks", "T_single ms", "T_comm naive ms", "f", "ceiling",
                "achieved (best)", "of ceiling"):
        a.add_column(col, justify="left" if col == "model" else "right")
    for m in infos:
        best = (f"{m['best_speedup']:.2f}× {m['best_strategy']}" if m.get("best_speedup") else "—")
        eff = (m["best_speedup"] / m["amdahl_ceiling"]
               if m.get("best_speedup") and m.get("amdahl_ceiling") else None)
        a.add_row(m["model"], str(m["ranks"]), _f(m["t_single_ms"]), _f(m["t_comm_naive_ms"]),
                  _f(m["amdahl_f"], "{:.3f}"), _f(m["amdahl_ceiling"], "{:.2f}×"), best,
                  _f(eff * 100 if eff is not None else None, "{:.0f}%"))
    con.print(a)
    notes = [m for m in infos if m.get("amdahl_f") is None]
    for m in notes:
        con.print(f"{m['model']}: no Amdahl ceiling (needs single and naive measured)")


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_FIELDS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


# -- running ---------------------------------------------------------------------------
def _sigterm(signum, frame):
    raise KeyboardInterrupt


def run_model(model: str, opts, plan, store, say):
    """One live run for one model, watched until it ends; returns the LiveRun.
    KeyboardInterrupt propagates once the ranks are stopped (`store` keeps what was measured)."""
    from .headless import Progress
    from .session import LiveRun

    run = LiveRun(opts, plan, store)
    prog = Progress(store)
    try:
        run.start()
        while not run.poll():
            prog.update(opts.steps)
            time.sleep(0.1)
        prog.last_steps = 0.0  # the final step count, however recent the last one was
        prog.update(opts.steps)
    except BaseException as e:
        # a second Ctrl-C (or a SIGTERM) while stopping must not leave ranks behind
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            interrupted = isinstance(e, KeyboardInterrupt)
            if interrupted:
                say(f"interrupted: stopping the {model} ranks…")
            if run.launcher is None:
                run._close()
            else:
                run.stop("interrupted" if interrupted else f"{type(e).__name__}: {e}")
            prog.update(opts.steps)
            if interrupted:
                say("stopped; every rank has exited")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
        raise
    return run


def main(argv: list[str]) -> int:
    from .launcher import plan as make_plan
    from .session import RunOptions
    from .store import Store

    a = parser().parse_args(argv)
    models = parse_models(a.models)
    strategies = parse_bench_strategies(a.strategies)
    json_path = _check_writable_path(a.json, "--json") if a.json else None
    csv_path = _check_writable_path(a.csv, "--csv") if a.csv else None
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
    old_term = signal.signal(signal.SIGTERM, _sigterm)
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
                              hang_s=max(30.0, a.pg_timeout + 10))
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
        print_tables(rows, infos, header)
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
        say(f"wrote {json_path}")
    if csv_path:
        write_csv(csv_path, rows)
        say(f"wrote {csv_path}")
    return code


def _collect(model, plan, store, rows, infos, runs_meta, state: str, record=None) -> None:
    summaries = store.summaries()
    meta = dict(store.meta)
    if store.ranks:
        first = store.ranks[min(store.ranks)]
        runs_meta.setdefault("backend", first.backend or meta.get("backend"))
    if meta.get("torch") and meta.get("torch") != "synthetic":
        runs_meta.setdefault("torch", meta.get("torch"))
    r, info = model_figures(model, plan.ranks, summaries, plan.device)
    info["state"] = state
    info["recording"] = record
    info["dropped_spans"] = sum(i.dropped_spans for i in store.ranks.values())
    rows.extend(r)
    infos.append(info)
