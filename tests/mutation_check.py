#!/usr/bin/env python
"""The suite's own mutation check: two dozen deliberate faults in the instrument, the figures,
the verdicts and the doors, each put into a revision's code in turn (a git worktree of it),
and the tests that should catch it run against it. A fault its tests pass is a hole in the
suite; run on two revisions (`--vs`), a fault the old suite caught and the new one does not
is a check a consolidation of the suite lost.

    python tests/mutation_check.py                        # this checkout's HEAD
    python tests/mutation_check.py --vs c0bbed7           # HEAD and c0bbed7, side by side
    python tests/mutation_check.py --only overlap,token   # some faults

Each fault names the text it changes (found in the first of its paths that a revision has;
a revision without it: "n/a", the feature is not there) and the test files that should catch
it (those a revision lacks are left out). The tests run with this interpreter, the worktree
first on the path (its own `ddptui` and `ranks`), one pytest process a fault and revision,
`-x`: caught is a non-zero exit. A table at the end; exit 1 when a fault the suite exists to
catch passes on the newest revision. Not part of `bin/test` (it runs every test file it names
once per fault): a contributor's check after a change to the suite.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Fault:
    key: str
    what: str
    paths: tuple[str, ...]
    find: str
    put: str
    tests: tuple[str, ...]
    k: str = ""  # a pytest -k expression, where a file holds more than the fault's tests


FAULTS = [
    Fault("overlap", "overlap % inverted (the exposed share shown as hidden)", ("ddptui/model/figures.py",),
          "100.0 * (1.0 - exposed_ms / comm_ms)", "100.0 * (exposed_ms / comm_ms)", ("tests/test_figures.py",)),
    Fault("bus", "a doubled price: bus bandwidth 2x", ("ddptui/model/figures.py",),
          "nbytes * 2 * (world - 1) / world", "nbytes * 4 * (world - 1) / world", ("tests/test_figures.py",)),
    Fault("compute", "communication counted as compute", ("ddptui/model/columns.py",),
          "kind[i] == FWD or kind[i] == BWD or kind[i] == PASS]",
          "kind[i] == FWD or kind[i] == BWD or kind[i] == PASS or kind[i] == COMM]", ("tests/test_figures.py",)),
    Fault("kinds", "a span of an unknown kind let in", ("ranks/wire.py",),
          "if kind.translate(None, _KNOWN_KINDS):", "if False:", ("tests/test_figures.py", "tests/test_bad_frames.py")),
    Fault("token", "a client without the run's token let in", ("ddptui/ingest/collector.py",),
          "or not hmac.compare_digest(tok.encode(), self.token.encode())", "or False",
          ("tests/test_faults.py",), "hostile"),
    Fault("headline", "DDP said faster when it is slower", ("ddptui/ui/widgets/headline.py",),
          "        elif v > 1:", "        elif v < 1:", ("tests/test_headline.py",)),
    Fault("hang", "a hang named for the collective fewest ranks are stuck in", ("ddptui/model/hang.py",),
          "max(votes.items(), key=lambda kv: (len(kv[1]), -kv[0][1]))",
          "min(votes.items(), key=lambda kv: (len(kv[1]), -kv[0][1]))",
          ("tests/test_hang.py", "tests/test_coll_app.py"), "hang or stall or stuck or never or most"),
    Fault("culprit", "the straggler named is the rank that arrived last least often", ("ddptui/model/stragglers.py",),
          "rank = max(counts, key=lambda r: (counts[r], -r))", "rank = min(counts, key=lambda r: (counts[r], -r))",
          ("tests/test_stragglers.py", "tests/test_aggregate.py"), "(culprit or most_often) and not real"),
    Fault("whatif", "what-if's ring: every collective's bytes counted twice", ("ddptui/model/whatif.py",),
          "return 2 * (n - 1) / n if n > 1 else 0.0", "return 4 * (n - 1) / n if n > 1 else 0.0",
          ("tests/test_whatif.py",)),
    Fault("naive-idx", "naive's AllReduce of a parameter drawn as the next one's (the instrument, real ranks)",
          ("ranks/builtin/strategies.py", "ranks/strategies.py"),
          "            slot = rec.comm_issue(i)\n            with rec.issuing(slot):",
          "            slot = rec.comm_issue(min(i + 1, len(self.params) - 1))\n            with rec.issuing(slot):",
          ("tests/test_pipeline.py",)),
    Fault("wait", "a dropped wait: the compute's waits for a collective lost (real ranks)",
          ("ranks/core/recorder.py", "ranks/recorder.py"),
          "for j, tok in r.waits:", "for j, tok in ():",
          ("tests/test_collectives.py",), "functional_collective_ends or every_public"),
    Fault("bubble", "a pipeline's bubble from its compute, not its microbatches (real ranks)",
          ("ddptui/model/figures.py",), "        if kind[i] == MB:\n            for pa, pz in pipes:",
          "        if kind[i] == PIPE:\n            for pa, pz in pipes:", ("tests/test_pipelining.py",),
          "bubble or microbatches_are"),
    Fault("1f1b", "the built-in 1f1b runs GPipe's schedule (its microbatches in the wrong order, real ranks)",
          ("ranks/builtin/strategies.py",), '    name = "1f1b"\n    schedule = "Schedule1F1B"',
          '    name = "1f1b"\n    schedule = "ScheduleGPipe"', ("tests/test_pipeline.py", "tests/test_pipelining.py"),
          "pipelines_take_turns or built_in_workers"),
    Fault("eval", "a user's script: rank 0's evaluation before a step not drawn (real ranks, --auto)",
          ("ranks/scripts/user.py",), "            else:  # in the next step's frame, before its start\n"
          "                self.others.append(span)", "            else:  # in the next step's frame, before its start\n"
          "                pass", ("tests/test_user_scripts.py",), "rank0_only"),
    Fault("fr-acc", "NCCL's timing under accumulation: every backward's buckets awaited (real ranks, --auto)",
          ("ranks/scripts/user.py",), "sync = self.frb.armed = bool(self.ddp.require_backward_grad_sync)",
          "sync = self.frb.armed = True", ("tests/test_flightrec.py",), "never_rebuilds"),
    Fault("held", "a rank waits for the stalled app's room (100 ms a frame) before it drops (real ranks)",
          ("ranks/core/emitter.py",), "            self.q.put_nowait(frame)\n            return True",
          "            self.q.put(frame, timeout=0.1)\n            return True", ("tests/test_faults.py",), "stalled"),
    Fault("p2p-hang", "a hung pipeline stage named without the microbatch its neighbour waits on (real ranks)",
          ("ddptui/model/hang.py",), 'return f"{self.op} #{self.seq} of {p2p_text(self.op, self.p2p)} ({mb})"',
          'return f"{self.op} #{self.seq} ({mb})"', ("tests/test_pipelining.py",), "hung_stage"),
    Fault("gone", "a join that outlives its node 0 (the control connection's end not taken as node 0 gone)",
          ("ddptui/cli/join.py",), 'if not data:\n                    return self._end("node 0 went away")',
          'if not data:\n                    continue', ("tests/test_doors.py", "tests/test_multinode.py"),
          "node0_goes_away"),
    Fault("shift", "a shifted DDP step: rank 1's steps of a user's script numbered one on (real ranks, --auto)",
          ("ranks/scripts/user.py",), "        self.rec.begin(self.strategy, self.k)",
          "        self.rec.begin(self.strategy, self.k + (self.rank == 1))", ("tests/test_user_scripts.py",),
          "rank0_only"),
    Fault("quiet", "attach: a hang's quiet time counted from the poll that saw it (named a poll's gap late)",
          ("ddptui/model/frwatch.py",), "                idle = min(idle, now_s - got.polled_s)",
          "                idle = 0.0", ("tests/test_attach.py",), "polled_less"),
    Fault("interleaved", "what-if's interleaved 1F1B: a rank's backwards in the forwards' stage order",
          ("ddptui/model/pipewhatif.py",), "        st = (v - 1 - ((step - warm) // per_round) % v) * p + r",
          "        st = (((step - warm) // per_round) % v) * p + r", ("tests/test_pipelining.py",),
          "plan_where or torchs_own"),
    Fault("capture", "a layer mark inside a CUDA graph's capture run, not skipped (recorded into the graph)",
          ("ranks/core/markop.py",), "    if _capturing(x):", "    if False:", ("tests/test_compiled.py",),
          "cuda_graph"),
    Fault("sigterm", "a headless run's SIGTERM not taken as Ctrl-C (the ranks, the report, the recording left)",
          ("ddptui/cli/main.py",), "            signal.signal(signal.SIGTERM, sigterm_to_interrupt)\n",
          "", ("tests/test_faults.py",), "stalled or interrupt"),
    Fault("tail", "attach's tail read cuts away a collective in flight older than it (the hang missed)",
          ("ddptui/model/frverdict.py",), "            if _open_behind(d):", "            if False:",
          ("tests/test_attach.py",), "behind_the_tail"),
    Fault("regone", "attach's 'drawn before' holds back a group made again under its name (no time bound)",
          ("ddptui/recording/frstream.py",), "key[2] <= g[0] and first[key] <= g[1]", "key[2] <= g[0]",
          ("tests/test_attach.py",), "made_again"),
]


def worktree(rev: str, where: str) -> str:
    path = os.path.join(where, rev.replace("/", "_"))
    p = subprocess.run(["git", "worktree", "add", "--detach", path, rev], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"mutation_check: cannot check out {rev}: {p.stderr.strip().splitlines()[-1] if p.stderr else ''}")
    return path


def run_fault(tree: str, f: Fault, timeout: float) -> tuple[str, float]:
    """'caught' | 'MISSED' | 'n/a (why)', seconds."""
    path = next((os.path.join(tree, p) for p in f.paths if os.path.exists(os.path.join(tree, p))), None)
    if path is None:
        return "n/a (no file)", 0.0
    with open(path) as fh:
        text = fh.read()
    if f.find not in text:
        return "n/a (not there)", 0.0
    tests = [t for t in f.tests if os.path.exists(os.path.join(tree, t))]
    if not tests:
        return "n/a (no test file)", 0.0
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", CI="true")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not heavy", *tests]
    if f.k:
        cmd += ["-k", f.k]
    t0 = time.monotonic()
    try:
        with open(path, "w") as fh:
            fh.write(text.replace(f.find, f.put, 1))
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = -1
    finally:
        with open(path, "w") as fh:
            fh.write(text)
    secs = time.monotonic() - t0
    if rc == 5:  # (no test selected)
        return "n/a (no test)", secs
    return ("caught" if rc != 0 else "MISSED"), secs


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--rev", default="HEAD", help="the revision whose suite is checked (default HEAD)")
    a.add_argument("--vs", default=None, metavar="REV", help="and this one's, side by side")
    a.add_argument("--only", default=None, metavar="KEY,...", help="these faults: " + ",".join(f.key for f in FAULTS))
    a.add_argument("--timeout", type=float, default=600.0, help="seconds a fault's tests may take")
    args = a.parse_args()
    faults = FAULTS
    if args.only:
        keys = args.only.split(",")
        bad = [k for k in keys if k not in {f.key for f in FAULTS}]
        if bad:
            print(f"mutation_check: unknown fault {bad[0]!r}; choose from " + ", ".join(f.key for f in FAULTS),
                  file=sys.stderr)
            return 2
        faults = [f for f in FAULTS if f.key in keys]
    revs = [args.rev] + ([args.vs] if args.vs else [])
    where = tempfile.mkdtemp(prefix="ddptui-mutation-")
    trees = {}
    try:
        for rev in revs:
            trees[rev] = worktree(rev, where)
        rows = []
        for f in faults:
            got = []
            for rev in revs:
                print(f"mutation_check: {f.key} on {rev} …", file=sys.stderr, flush=True)
                got.append(run_fault(trees[rev], f, args.timeout))
            rows.append((f, got))
    finally:
        for rev, tree in trees.items():
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
    head = "| fault | what | " + " | ".join(revs) + " |"
    print(head)
    print("|" + "---|" * (2 + len(revs)))
    for f, got in rows:
        print(f"| {f.key} | {f.what} | " + " | ".join(f"{r} ({s:.0f} s)" if s else r for r, s in got) + " |")
    lost = [f.key for f, got in rows if len(got) > 1 and got[1][0] == "caught" and got[0][0] != "caught"]
    missed = [f.key for f, got in rows if got[0][0] == "MISSED"]
    if lost:
        print(f"caught by {revs[1]}'s suite, not by {revs[0]}'s: {', '.join(lost)}")
    if missed:
        print(f"not caught by {revs[0]}'s suite: {', '.join(missed)}")
    return 1 if missed or lost else 0


if __name__ == "__main__":
    sys.exit(main())
