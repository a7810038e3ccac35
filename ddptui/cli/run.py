"""`ddptui run [--nproc-per-node N] [--headless] [--record P | --no-record] [--json P]
[--auto] [--layers SPEC] -- SCRIPT ARGS...`: your own training script under torchrun, live.

The script builds its DistributedDataParallel model and calls `ddptui.instrument` (or, with
--auto, is left unchanged: ranks.scripts.userboot instruments every DDP it constructs). Its ranks
stream to the app like the built-in workers: one pane (the `ddp` strategy), lanes per rank,
layers named by module name, buckets with parameter names, the same figures, straggler
figures and recordings. Exit status: 0 when the script finished, 1 when it failed (the
error is shown with its rank), 2 for a bad command line, 130 when interrupted.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from ranks import spec

from .common import CliError, JSON_METAVAR, json_target, Parser, sigterm_to_interrupt, check_environment, record_path
from .common import open_live_ui, require_terminal
from .options import add_numeric
from ddptui.live.output import CHOICES as OUTPUT_CHOICES
from ddptui.live.session import LiveRun, RunOptions


def parser() -> Parser:
    p = Parser(prog="ddptui run", description="Run your own DDP or FSDP2 training script under torchrun "
                "and show its layers, buckets and collectives live (ddptui.instrument in the script, "
                "or --auto). docs/your-script.md.")
    add_numeric(p, "--nproc-per-node", default=2, help="ranks to start on this host (default 2)")
    p.add_argument("--headless", action="store_true", help="no UI: progress on stderr, figures on stdout")
    p.add_argument("--record", metavar="PATH", help="record to PATH (default: a new file in --runs-dir)")
    p.add_argument("--no-record", action="store_true", help="do not record this run")
    p.add_argument("--runs-dir", default=os.environ.get("DDPTUI_RUNS_DIR", "runs"), metavar="DIR",
                   help="where recordings go by default (default ./runs)")
    p.add_argument("--json", metavar=JSON_METAVAR, help="also write the figures as JSON to PATH (-: to stdout, the text report to stderr)")
    p.add_argument("--auto", action="store_true",
                   help="no code change: instrument every DistributedDataParallel and FSDP2 root "
                        "(fully_shard) the script builds, and time every optimizer step")
    p.add_argument("--layers", default="auto", metavar="SPEC",
                   help="with --auto: auto, a depth, or comma-separated module names (default auto)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cpu hides the GPUs from the script (default auto)")
    p.add_argument("--threads", type=int, default=1, help="OMP threads per CPU rank (default 1)")
    p.add_argument("--output", choices=OUTPUT_CHOICES, default="0",
                   help="with --headless: whose output (the script's prints, stdout and stderr) to pass "
                        "through, each line prefixed [rankN]: as torchrun does: 0 (rank 0, the default), "
                        "all, or none. Every rank's is recorded and shown in the UI (key o) either way")
    p.add_argument("script", metavar="SCRIPT", help="the training script (after --)")
    p.add_argument("args", nargs="*", metavar="ARGS", help="its arguments")
    return p


class UserRun(LiveRun):
    """A LiveRun whose ranks are the user's script (ranks.scripts.userboot) rather than ranks.builtin.worker;
    what the model is (layers, parameters, batch) comes from the ranks' hello. The script owns
    its DDP: the UI's bucket-cap and straggler keys do not apply (owns_ddp)."""
    owns_ddp = True

    def __init__(self, opts: RunOptions, plan, script: str, script_args: list[str], env: dict):
        super().__init__(opts, plan)
        self.script, self.script_args, self.extra_env = script, script_args, env
        self.cwd = os.getcwd()

    def meta(self) -> dict:
        from ddptui import __version__
        return {"ddptui": __version__, "created": time.time(),
                "model": os.path.basename(self.script), "strategies": [spec.USER_STRATEGY],
                "world": self.plan.ranks, "steps": 0, "device": self.plan.device,
                "gpus": self.plan.gpus, "note": self.plan.note, "user": True,
                "script": [os.path.basename(self.script), *self.script_args]}

    def command(self, worker_args: list[str]) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(self.plan.ranks), "-m", "ranks.scripts.userboot",
                self.script, *self.script_args]

    def start(self) -> None:
        saved = {k: os.environ.get(k) for k in self.extra_env}
        os.environ.update(self.extra_env)  # LiveRun.start copies the environment
        try:
            super().start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def set_bucket_cap(self, mb: float) -> int:  # the script owns its DDP: not re-wrapped
        self.store.add_log("bucket_cap_mb is the script's own in ddptui run", "warn")
        return 0

    def set_straggler(self, ms: float, rank=None, layer=None) -> int:
        self.store.add_log("the straggler key does not apply to ddptui run", "warn")
        return 0

    def stop(self, why: str = "stopped by user", grace: float = 2.0) -> None:
        super().stop(why, grace)


def build(argv: list[str]):
    from ddptui.live.launcher import plan as make_plan
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
        if not rest:
            raise CliError("no script after --")
        a = parser().parse_args(own + ["--", rest[0]])
        a.args = rest[1:]
    else:
        a = parser().parse_args(argv)
    script = os.path.abspath(a.script)
    if not os.path.isfile(script):
        raise CliError(f"{a.script}: no such script")
    if a.record and a.no_record:
        raise CliError("--record and --no-record contradict each other")
    if not 1 <= a.threads <= 256:
        raise CliError(f"--threads must be 1..256 (got {a.threads})")
    check_environment()
    try:
        plan = make_plan(a.nproc_per_node, None, a.device)
    except ValueError as e:
        raise CliError(str(e).replace("--gpus", "--nproc-per-node")) from None
    plan.note = plan.note.replace("--gpus", "--nproc-per-node")
    record = record_path(a, os.path.splitext(os.path.basename(script))[0], plan.ranks)
    a.json = json_target(a.json)
    opts = RunOptions(model=os.path.basename(script), strategies=[spec.USER_STRATEGY], steps=0,
                      threads=a.threads, record=record, hang_s=120.0)
    env = {"DDPTUI_AUTO": "1", "DDPTUI_LAYERS": a.layers} if a.auto else {}
    return a, opts, plan, UserRun(opts, plan, script, a.args, env)


def main(argv: list[str]) -> int:
    a, opts, plan, run = build(argv)
    if a.headless:
        signal.signal(signal.SIGTERM, sigterm_to_interrupt)
        return headless(run, opts, a.json, a.output)
    require_terminal("the live UI", "use --headless to run without one")
    return open_live_ui(opts, plan, run)


def headless(run: UserRun, opts: RunOptions, json_path: str | None, output: str = "0") -> int:
    """The live headless run's loop (progress, figures, JSON) around a UserRun; `output`: whose
    output to pass through (ddptui.live.output.pass_through)."""
    from ddptui.live.headless import Progress, _report
    from ddptui.live.loop import watch
    from ddptui.live.output import pass_through
    # (--json -: stdout is the JSON's alone, the script's own prints go to stderr)
    run.on_output = pass_through(output, out=sys.stderr if json_path == "-" else None)
    prog = Progress(run.store)
    if opts.record:
        prog.say(f"recording to {opts.record}")
    try:
        watch(run, prog, 0, prog.say)
    except KeyboardInterrupt:
        _report(run.store, sys.stdout, json_path, run, opts)
        return 130
    failed = run.state == "failed"
    if failed:
        print(f"ddptui: error: {run.message}", file=sys.stderr, flush=True)
    _report(run.store, sys.stdout, json_path, run, opts)
    return 1 if failed else 0
