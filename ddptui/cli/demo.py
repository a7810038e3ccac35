"""`ddptui demo [--profile P] [--gpus N] [--model M] [--strategies LIST] [--steps N] [-o FILE]`:
a run SIMULATED for a named machine (ddptui.model.profiles) by the step simulator
(ddptui.recording.simulated), written as an ordinary recording, then replayed in the timeline
UI (--headless: the figures beside seed 002's measured rows instead). `--seed-table`:
every row of seed 002's table simulated and printed beside what the seed measured.

Exit status: 0; 1 when --seed-table's median error is beyond P9c's tolerance; 2 for a bad
command line (one line on stderr: `ddptui: error: ...`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from ranks import spec

from ddptui.model import profiles as prof
from .common import CliError, Parser, check_writable_path, require_terminal
from .options import add_numeric

EPILOG = """\
Nothing here was measured. Each step is made by ddptui's step simulator for the profile:
per-layer compute from the layer's FLOPs at the profile's fp32 rate (split over the GPUs) plus
a fixed cost per layer, the optimizer, the step overhead data parallelism adds, and every
collective from the collective model benchmark P9c checks against seed 002 (a per-call host
cost, ring latency, bytes at the bus bandwidth), with jitter so it looks like a run. The
recording says SIMULATED and the profile in its header; the UI's title bar, headline and
figures panel, `summary`, its JSON and every export say so too.

profiles:
  a100-pcie     seed 002's 4x A100 80GB PCIe (calibrated: single rows within 2 %; naive,
                interleaved and ddp at 2 and 4 GPUs checked against its table)
  h100-nvlink   8x H100 SXM on NVLink 4 (extrapolated from the A100 profile: datasheet fp32
                rate, assumed 450 GB/s bus bandwidth; no measurement checks it)
Rows seed 002 has no row for (8 GPUs, the H100 node, fsdp, deep40) are extrapolations and
are listed as such.

examples:
  ddptui demo                                        # xlarge, 4 simulated A100s, in the UI
  ddptui demo --profile h100-nvlink --gpus 8 --model xlarge --strategies naive,ddp,fsdp
  ddptui demo --headless --gpus 2 --model large      # the figures beside seed 002's
  ddptui demo --seed-table                           # every seed 002 row, simulated
  ddptui serve runs/simulated-a100-pcie-xlarge-4gpus.ddptui    # then in a browser
"""

DEFAULT_STRATEGIES = ("naive", "interleaved", "ddp", "single")
CALIBRATION = ("single", "naive")  # the rows the A100 profile is fitted to (P9c's inputs)


def parser() -> Parser:
    p = Parser(prog="ddptui demo", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
               description="A SIMULATED run of a built-in model on a named GPU machine (no GPU, no torch), "
                           "recorded and replayed in the timeline UI: for talks without the hardware.")
    p.add_argument("--profile", choices=tuple(prof.PROFILES), default="a100-pcie",
                   help="the machine simulated (default a100-pcie: seed 002's 4x A100 80GB PCIe)")
    add_numeric(p, "--gpus", default=None, help="GPUs used (default: every GPU of the profile's node)")
    p.add_argument("--model", default="xlarge", metavar="NAME",
                   help="model: " + ", ".join(spec.MODELS) + " (default xlarge)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), metavar="LIST",
                   help="comma-separated, from " + ", ".join(spec.STRATEGIES)
                        + " (default " + ",".join(DEFAULT_STRATEGIES) + ")")
    add_numeric(p, "--steps", default=30, help="steps per strategy (default 30)")
    add_numeric(p, "--seed", default=0, help="the jitter's seed (default 0)")
    p.add_argument("--pace", metavar="S", type=_pace, default=0.5,
                   help="seconds of the recording's clock per step of every strategy (default 0.5: a "
                        "replay at 1x shows each step; the time between steps is idle, in no figure)")
    p.add_argument("-o", "--record", metavar="PATH",
                   help="where the recording goes (default --runs-dir/simulated-PROFILE-MODEL-NgpuS.ddptui)")
    p.add_argument("--runs-dir", default=os.environ.get("DDPTUI_RUNS_DIR", "runs"), metavar="DIR",
                   help="where recordings go by default (default ./runs)")
    p.add_argument("--headless", action="store_true",
                   help="no UI: write the recording, print its figures beside seed 002's")
    p.add_argument("--seed-table", action="store_true",
                   help="simulate every row of seed 002's table (A100, 2 and 4 GPUs) and print it beside "
                        "the measured one (no recording kept)")
    add_numeric(p, "--speed", default=1.0, help="(UI) playback speed (default 1)")
    p.add_argument("--loop", action="store_true", help="(UI) start over at the end (for talks)")
    p.add_argument("--title", metavar="TEXT", help="(UI) a title to show beside SIMULATED")
    return p


def _pace(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pace must be a number of seconds (got {text!r})") from None
    if not 0 <= v <= 60:
        raise argparse.ArgumentTypeError(f"--pace must be 0..60 s (got {text})")
    return v


def strategies_of(text: str) -> list[str]:
    out = []
    for s in (x.strip() for x in text.split(",")):
        if not s:
            continue
        if s not in spec.STRATEGIES:
            raise CliError(f"--strategies: unknown strategy {s!r} (choose from {', '.join(spec.STRATEGIES)})")
        if s not in out:
            out.append(s)
    if not out:
        raise CliError("--strategies is empty")
    return out


def check(a) -> tuple[prof.Profile, int, list[str]]:
    p = prof.PROFILES[a.profile]
    if a.model not in spec.MODELS:
        raise CliError(f"--model: unknown model {a.model!r} (choose from {', '.join(spec.MODELS)})")
    strategies = strategies_of(a.strategies)
    gpus = a.gpus if a.gpus is not None else p.gpus
    if gpus > p.gpus:
        raise CliError(f"--gpus {gpus}: profile {p.key} ({p.name}) has {p.gpus} GPUs")
    if gpus < 2 and any(s != "single" for s in strategies):
        raise CliError(f"--gpus {gpus}: data parallelism needs 2 GPUs or more (or --strategies single)")
    if a.title is not None and ("\n" in a.title or len(a.title) > 200):
        raise CliError("--title must be one line of at most 200 characters")
    return p, gpus, strategies


def simulate(p: prof.Profile, model: str, gpus: int, strategies: list[str], steps: int, seed: int,
             path: str, quiet: bool = False, pace: float = 0.5):
    """Write the simulated recording at `path` and read it back (as `summary` does)."""
    from ddptui.recording.loader import load
    from ddptui.recording.simulated import SimulatedRun, write

    def progress(k: int, n: int) -> None:
        if not quiet and (k == n or k % 10 == 0):
            print(f"ddptui demo: SIMULATED {model} on {p.name}, {gpus} GPUs: step {k}/{n}", file=sys.stderr, flush=True)

    write(path, SimulatedRun(p, model, gpus, strategies, seed=seed, pace_s=pace), steps, progress)
    return load(path)


def side_by_side(p: prof.Profile, model: str, gpus: int, rows: list[dict]) -> list[dict]:
    """Per strategy: the simulated median step beside seed 002's measured one (None: none)."""
    out = []
    for r in rows:
        s = r["strategy"]
        n = 1 if s == "single" else gpus
        meas = prof.seed_step_ms(model, n, s) if p.measured else None
        sim = r.get("step_ms_median")
        out.append({"model": model, "gpus": n, "strategy": s, "simulated_ms": sim, "seed002_ms": meas,
                    "err_pct": None if meas is None or sim is None else 100.0 * (sim - meas) / meas,
                    "extrapolated": p.extrapolated(model, n, s)})
    return out


def print_rows(rows: list[dict], file=None) -> None:
    out = file or sys.stdout
    print(f"{'model':<7} {'GPUs':>4} {'strategy':<12} {'simulated ms':>12} {'seed 002 ms':>11} {'error':>7}  note",
          file=out)
    for r in rows:
        sim = "–" if r["simulated_ms"] is None else f"{r['simulated_ms']:.3f}"
        meas = "–" if r["seed002_ms"] is None else f"{r['seed002_ms']:.3f}"
        err = "–" if r["err_pct"] is None else f"{r['err_pct']:+.1f} %"
        note = (f"extrapolation: {r['extrapolated']}" if r["extrapolated"] else
                "seed 002 row (calibration: the profile is fitted to it)" if r["strategy"] in CALIBRATION
                else "seed 002 row (predicted)")
        print(f"{r['model']:<7} {r['gpus']:>4} {r['strategy']:<12} {sim:>12} {meas:>11} {err:>7}  {note}", file=out)


def verdict(rows: list[dict]) -> tuple[float | None, bool]:
    errs = [abs(r["err_pct"]) for r in rows if r["err_pct"] is not None and r["strategy"] not in CALIBRATION]
    if not errs:
        return None, True
    med = statistics.median(errs)
    return med, med <= prof.TOLERANCE_PCT


def verdict_line(rows: list[dict]) -> str:
    med, ok = verdict(rows)
    if med is None:
        return "no predicted seed 002 row to check: every other figure above is an extrapolation"
    n = sum(1 for r in rows if r["err_pct"] is not None and r["strategy"] not in CALIBRATION)
    return (f"median |error| {med:.1f} % over the {n} predicted rows of seed 002 (interleaved, ddp) "
            f"({'within' if ok else 'beyond'} benchmark P9c's tolerance of {prof.TOLERANCE_PCT:g} %)")


def seed_table(a) -> int:
    p = prof.PROFILES["a100-pcie"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddptui-demo-") as d:
        for model in prof.SEED_MODELS:
            for n in (2, 4):
                got = simulate(p, model, n, list(DEFAULT_STRATEGIES), a.steps, a.seed,
                               os.path.join(d, f"{model}-{n}.ddptui"), quiet=True)
                rs = side_by_side(p, model, n, got.store.summaries())
                rows += [r for r in rs if r["strategy"] != "single" or n == 2]
                print(f"ddptui demo: simulated {model} at {n} GPUs", file=sys.stderr, flush=True)
    print(f"SIMULATED ({p.name} profile) beside seed 002's measured table; per step = Avg Epoch / "
          f"{prof.SEED_STEPS}; simulated: median step of {a.steps} steps")
    print_rows(rows)
    print(verdict_line(rows))
    return 0 if verdict(rows)[1] else 1


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if a.seed_table:
        return seed_table(a)
    p, gpus, strategies = check(a)
    if a.steps < 2:
        raise CliError("--steps must be 2 or more (the first step of each strategy is warm-up)")
    if a.record:
        path = check_writable_path(a.record, "--record")
    else:
        try:
            os.makedirs(a.runs_dir, exist_ok=True)
        except OSError as e:
            raise CliError(f"--runs-dir {a.runs_dir}: cannot create ({e.strerror})") from None
        path = check_writable_path(os.path.join(a.runs_dir, f"simulated-{p.key}-{a.model}-{gpus}gpus.ddptui"),
                                   "--runs-dir")
    if not a.headless:
        require_terminal("the replay UI", "use --headless to print the figures")
    got = simulate(p, a.model, gpus, strategies, a.steps, a.seed, path, pace=a.pace)
    print(f"ddptui demo: wrote {path} (SIMULATED: {p.name}, {gpus} GPUs; "
          f"replay it with `ddptui replay {path}`)", file=sys.stderr, flush=True)
    if a.headless:
        from ddptui.reports.report import report_run
        report_run(got.store, None, lambda dropped: {})
        print()
        print(f"SIMULATED beside seed 002 ({p.basis})")
        print_rows(side_by_side(p, a.model, gpus, got.store.summaries()))
        print(verdict_line(side_by_side(p, a.model, gpus, got.store.summaries())))
        return 0
    from ddptui.ui.launch import run_replay_app
    return run_replay_app(path, speed=a.speed, loop=a.loop, title=a.title)
