"""Command line: `ddptui` (live UI), `--headless`, and the parser of every verb (each in its own module)."""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys

from ranks import spec

from ddptui import __version__
from .common import CliError, Parser, check_environment, json_target, record_path, sigterm_to_interrupt, tune_gc
from .common import open_live_ui, require_terminal
from .options import add_numeric, run_parent

SUBCOMMANDS = ("replay", "export", "summary", "bench", "verify", "serve", "run", "join", "whatif", "demo",
               "attach")

EPILOG = """\
commands:
  ddptui [options]                 live: launch torchrun ranks and open the timeline UI
  ddptui --headless [options]      live, no UI: progress on stderr, figures on stdout
  ddptui replay FILE               replay a recording in the same UI (--headless: figures)
  ddptui export FILE -o trace.json Chrome/Perfetto trace of a recording
  ddptui summary FILE [--json P]   per-strategy figures of a recording
  ddptui summary DIR               Flight Recorder dumps: who never issued which collective
  ddptui bench [options]           the seeds' benchmark table with the cost model
  ddptui verify [options]          check every span against torch.profiler on this machine
  ddptui serve FILE | --attach     the UI in a browser: a replay, or a read-only view of a live run
  ddptui run [opts] -- SCRIPT ...  your own DDP script under torchrun, live (ddptui.instrument)
  ddptui attach HOST:PORT          a running job with PyTorch's debug server: its collectives, a hang named
  ddptui join ADDR:PORT --token-file F   another node of a multi-node run (see --nnodes)
  ddptui whatif FILE [--bucket-cap 1,5,25,100] [--world 2,4,8]   predicted step under other settings
  ddptui demo [--profile a100-pcie|h100-nvlink] [--gpus N] [--model M]   a SIMULATED run, replayed

examples:
  ddptui --gpus 2 --model xlarge
  ddptui --headless --gpus 2 --model small --steps 10 --json out.json
  ddptui replay demo/cpu-medium-2ranks.ddptui
"""


def live_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddptui", description="See data-parallel training: per-layer compute and "
                "per-AllReduce timelines of naive data parallelism vs PyTorch DDP, live.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                parents=[run_parent()])
    p.add_argument("--version", action="version", version=f"ddptui {__version__}")
    add_numeric(p, "--ranks", default=None,
                help="ranks to start (default: one per GPU); more ranks than GPUs runs gloo with CUDA tensors")
    p.add_argument("--model", default="small", metavar="NAME",
                   help="model: " + ", ".join(spec.MODELS) + " (default small)")
    p.add_argument("--strategies", default=",".join(spec.DEFAULT_STRATEGIES), metavar="LIST",
                   help="comma-separated, from " + ", ".join(spec.STRATEGIES + spec.BUILTIN_PIPELINES)
                        + " (default naive,ddp; gpipe and 1f1b: the model's blocks as one pipeline stage a rank)")
    add_numeric(p, "--microbatches", default=spec.DEFAULT_MICROBATCHES,
                help=f"the pipelines' (gpipe, 1f1b) microbatches a step, of the global batch (default "
                     f"{spec.DEFAULT_MICROBATCHES})")
    add_numeric(p, "--steps", default=None,
                help="steps per strategy (default: 10 headless, until you quit in the UI; 0: until "
                     "Ctrl-C, then the report)")
    p.add_argument("--headless", action="store_true", help="no UI: progress on stderr, table on stdout")
    p.add_argument("--record", metavar="PATH", help="record to PATH (default: a new file in --runs-dir)")
    p.add_argument("--no-record", action="store_true", help="do not record this run")
    p.add_argument("--runs-dir", default=os.environ.get("DDPTUI_RUNS_DIR", "runs"), metavar="DIR",
                   help="where recordings go by default (default ./runs)")
    add_numeric(p, "--seed", default=42, help="seed of the initial weights and the data (default 42)")
    add_numeric(p, "--lr", default=0.01, help="SGD learning rate (default 0.01)")
    add_numeric(p, "--queue-size", default=256,
                help="frames each rank buffers for a slow app before dropping them (default 256)")
    p.add_argument("--slow-rank", default=None, metavar="R:MS[:LAYER]",
                   help="a straggler on demand: rank R's backward of LAYER (default the middle layer) "
                        "takes MS ms longer every step — on GPU as device work on the rank's stream "
                        "(the GPU timeline shows it), on CPU as a busy wait. e.g. 1:40:fc2")
    from .join import add_node0_options  # multi-node: node 0's options
    add_node0_options(p)
    return p


def build_live(argv: list[str]):
    from ddptui.live.launcher import plan as make_plan
    from ddptui.live.session import RunOptions

    a, extra = live_parser().parse_known_args(argv)
    words = [x for x in extra if not x.startswith("-")]
    if words and len(words) == len(extra):
        near = difflib.get_close_matches(words[0], SUBCOMMANDS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise CliError(f"unknown command {words[0]!r}{hint}; commands: " + ", ".join(SUBCOMMANDS))
    if extra:
        raise CliError("unrecognized arguments: " + " ".join(extra))
    if a.model not in spec.MODELS:
        raise CliError(f"unknown model {a.model!r}; choose from " + ", ".join(spec.MODELS))
    try:
        strategies = spec.parse_strategies(a.strategies)
    except ValueError as e:
        raise CliError(str(e)) from None
    check_environment()
    try:
        plan = make_plan(a.gpus, a.ranks, a.device)
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.slow_rank is not None:
        try:
            spec.parse_slow_rank(a.slow_rank, a.model, plan.ranks)
        except ValueError as e:
            raise CliError(str(e)) from None
    if a.batch_size % plan.ranks:
        raise CliError(f"--batch-size {a.batch_size} must divide evenly across {plan.ranks} ranks")
    pipes = [s for s in strategies if s in spec.BUILTIN_PIPELINES]
    if pipes:  # (the model's blocks, one stage a rank; microbatches of the global batch)
        blocks = len(spec.MODEL_WIDTHS[a.model]) - 1
        if plan.ranks < 2:
            raise CliError(f"{pipes[0]} needs 2 ranks or more (one pipeline stage a rank)")
        if blocks < plan.ranks:
            raise CliError(f"{pipes[0]}: model {a.model}'s {blocks} blocks cannot make {plan.ranks} stages "
                           f"(one a rank); choose a model with more, or fewer ranks")
        if a.batch_size % a.microbatches:
            raise CliError(f"--batch-size {a.batch_size} must divide evenly into --microbatches {a.microbatches}")
        if "1f1b" in pipes and a.microbatches < plan.ranks:
            raise CliError(f"1f1b needs --microbatches at least the stages' count ({plan.ranks}); got {a.microbatches}")
    multinode = None
    if a.nnodes is not None:  # node 0 of a multi-node run (ddptui/live/multinode.py)
        from .join import node0_plan
        try:
            multinode, plan = node0_plan(a, plan)
        except ValueError as e:
            raise CliError(str(e)) from None
        if a.batch_size % plan.ranks:
            raise CliError(f"--batch-size {a.batch_size} must divide evenly across {plan.ranks} ranks")
    steps = a.steps if a.steps is not None else (10 if a.headless else 0)
    record = record_path(a, a.model, plan.ranks)
    a.json = json_target(a.json)
    opts = RunOptions(model=a.model, strategies=strategies, steps=steps, batch_size=a.batch_size,
                      bucket_cap_mb=a.bucket_cap_mb, seed=a.seed, lr=a.lr, pg_timeout=a.pg_timeout,
                      threads=a.threads, record=record, hang_s=max(30.0, a.pg_timeout + 10),
                      extra_worker_args=["--queue-size", str(a.queue_size)]
                      + (["--slow-rank", a.slow_rank] if a.slow_rank else [])
                      + (["--layer-every", a.layer_every] if a.layer_every != "auto" else [])
                      + (["--microbatches", str(a.microbatches)]
                         if any(s in spec.BUILTIN_PIPELINES for s in strategies) else []),
                      multinode=multinode)
    return a, opts, plan


def main(argv: list[str] | None = None) -> int:
    # a run must stop on Ctrl-C and SIGTERM: a parent that blocked them (threads, libraries)
    # hands its mask down to the processes it starts; unblocking is what a terminal gives
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if argv is None:  # the process's own command line (not a caller's in-process call)
        tune_gc()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            cmd = argv.pop(0)
            mod = importlib.import_module(f"ddptui.cli.{cmd}")
            return int(mod.main(argv) or 0)
        a, opts, plan = build_live(argv)
        if a.headless:
            from ddptui.live.headless import run_headless
            signal.signal(signal.SIGTERM, sigterm_to_interrupt)
            return run_headless(opts, plan, a.json)
        require_terminal("the live UI", "use --headless to run without one")
        return open_live_ui(opts, plan)
    except CliError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddptui: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # its reader closed stdout (`ddptui summary DIR | head`): stop quietly
        try:  # (and let the interpreter's last flush of stdout go nowhere, not into a second error)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141  # (128 + SIGPIPE, as a tool the pipe stopped exits)


if __name__ == "__main__":  # `python -m ddptui.cli.main`: run the package's module, not a copy
    from ddptui.cli.main import main as _main
    sys.exit(_main())
