#!/usr/bin/env python
"""Graph breaks and graphs, alone and under ddptui: the compiled training scripts of issue 58,
each run on 2 CPU ranks (gloo) with torchrun alone, then under `ddptui run --auto --headless`,
counted by torch._dynamo itself (its `graph_break` and `unique_graphs` counters, what
`TORCH_LOGS=graph_breaks` prints) on rank 0. Goal: equal counts in every row (no graph break,
no graph of ddptui's).

    (a) nanogpt   karpathy/nanoGPT's own train.py and model.py, compile=True (a checkout given
                  with --nanogpt DIR; its CUDA-only DDP lines made CPU-able in a copy, a tiny
                  dataset made for it), 2 layers, gradient accumulation 4
    (b) hf        a Hugging Face GPT-2 (transformers, a 2-layer config: no download),
                  DDP(torch.compile(model)), called with keyword arguments as the Trainer does
    (c) inside    DDP(torch.compile(model)), nanoGPT's way (tests/scripts/compiled.py)
    (d) outside   torch.compile(DDP(model))
    (e) fsdp2     FSDP2 over blocks each compiled first, torchtitan's way (tests/scripts/fsdp2.py)

    python benchmarks/graph_breaks.py                          # (b)-(e); (a) with --nanogpt
    python benchmarks/graph_breaks.py --nanogpt ~/nanoGPT --backend inductor
    python benchmarks/graph_breaks.py --only outside,fsdp2

Dynamo's counts do not depend on the backend: aot_eager (no code generation) by default.
P6's overhead for a compiled step, with its own counts beside it:
`python benchmarks/p6_user_overhead.py --compile inductor`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from _common import ROOT, env_for_ranks

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
CASES = ("nanogpt", "hf", "inside", "outside", "fsdp2")
LABEL = {
    "nanogpt": "(a) nanoGPT train.py, compile=True",
    "hf": "(b) HF GPT-2, DDP(compile(model))",
    "inside": "(c) DDP(compile(model))",
    "outside": "(d) compile(DDP(model))",
    "fsdp2": "(e) FSDP2 over compiled blocks",
}

# nanoGPT's train.py binds its DDP ranks to CUDA devices: on CPU, the same lines without them
_NANO_PATCH = [
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    if device != 'cpu':\n        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)\n"),
    ("    model = DDP(model, device_ids=[ddp_local_rank])",
     "    model = DDP(model, device_ids=None if device == 'cpu' else [ddp_local_rank])"),
]
_NANO_RUN = '''# runs nanoGPT's train.py (its arguments passed on), then prints Dynamo's counts (rank 0)
import functools, os, runpy, sys
import torch
sys.argv = ["train.py", *sys.argv[1:]]
torch.compile = functools.partial(torch.compile, backend=os.environ["GB_BACKEND"])
try:
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), run_name="__main__")
finally:
    if os.environ.get("RANK", "0") == "0":
        from torch._dynamo.utils import counters
        print(f"GRAPH_BREAKS {sum(counters['graph_break'].values())}")
        print(f"GRAPHS {counters['stats']['unique_graphs']}")
        for why, n in counters["graph_break"].items():
            print(f"BREAK {n} {why[:200]!r}")
'''


def nanogpt_dir(src: str, tmp: str) -> tuple[str | None, str]:
    """A runnable copy of nanoGPT (train.py, model.py, configurator.py from `src`) with a tiny
    dataset beside it: (its runner, '') or (None, why not)."""
    import pickle

    import numpy as np
    d = os.path.join(tmp, "nanogpt")
    os.makedirs(os.path.join(d, "data", "tiny"))
    for f in ("train.py", "model.py", "configurator.py"):
        if not os.path.exists(os.path.join(src, f)):
            return None, f"no {f} in {src}"
        shutil.copy(os.path.join(src, f), d)
    path = os.path.join(d, "train.py")
    text = open(path).read()
    for old, new in _NANO_PATCH:
        if old not in text:
            return None, f"its train.py has no line {old.strip()!r} to run it on CPU ranks"
        text = text.replace(old, new)
    open(path, "w").write(text)
    r = np.random.default_rng(0)
    r.integers(0, 128, 20000).astype(np.uint16).tofile(os.path.join(d, "data", "tiny", "train.bin"))
    r.integers(0, 128, 4000).astype(np.uint16).tofile(os.path.join(d, "data", "tiny", "val.bin"))
    with open(os.path.join(d, "data", "tiny", "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": 128}, f)
    run = os.path.join(d, "run_nanogpt.py")
    open(run, "w").write(_NANO_RUN)
    return run, ""


def case_cmd(case: str, a, tmp: str) -> tuple[list[str] | None, str]:
    """(the script and its arguments, '') or (None, why it is skipped)."""
    be, it = ("--backend", a.backend), ("--iters", str(a.iters))
    if case == "nanogpt":
        if not a.nanogpt:
            return None, "no nanoGPT checkout given (--nanogpt DIR: karpathy/nanoGPT's train.py, model.py, configurator.py)"
        run, why = nanogpt_dir(os.path.abspath(os.path.expanduser(a.nanogpt)), tmp)
        if run is None:
            return None, why
        return [run, "--dataset=tiny", "--device=cpu", "--compile=True", "--dtype=float32", "--n_layer=2",
                "--n_head=2", "--n_embd=64", "--block_size=32", "--batch_size=4", f"--max_iters={a.iters}",
                "--eval_interval=1000", "--eval_iters=2", "--log_interval=1", "--gradient_accumulation_steps=4",
                "--backend=gloo", f"--out_dir={os.path.join(tmp, 'nanogpt-out')}", "--always_save_checkpoint=False",
                "--dropout=0.0", "--bias=False", "--warmup_iters=0"], ""
    if case == "hf":
        try:
            import transformers  # noqa: F401
        except ImportError:
            return None, "transformers is not installed (pip install transformers: a model built from a config, no download)"
        return [os.path.join(SCRIPTS, "compiled.py"), "--model", "gpt2", *be, *it], ""
    if case in ("inside", "outside"):
        return [os.path.join(SCRIPTS, "compiled.py"), "--wrap", case, *be, *it], ""
    return [os.path.join(SCRIPTS, "fsdp2.py"), "--compile", *be, *it], ""


def counts(text: str) -> tuple[int, int] | None:
    b = re.search(r"GRAPH_BREAKS (\d+)", text)
    g = re.search(r"GRAPHS (\d+)", text)
    return (int(b.group(1)), int(g.group(1))) if b and g else None


def run(cmd: list[str], under: bool, a, tmp: str, tag: str) -> tuple[tuple[int, int] | None, float, str]:
    env = env_for_ranks()
    env["GB_BACKEND"] = a.backend
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, f"inductor-{tag}")  # (no graph of an earlier run)
    if under:
        full = [sys.executable, "-m", "ddptui.cli.main", "run", "--auto", "--headless", "--nproc-per-node", "2",
                "--no-record", "--", *cmd]
    else:
        full = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *cmd]
    t0 = time.monotonic()
    r = subprocess.run(full, env=env, cwd=os.path.dirname(cmd[0]), capture_output=True, text=True,
                       timeout=a.timeout)
    out = r.stdout + r.stderr
    return (counts(out) if r.returncode == 0 else None), time.monotonic() - t0, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(CASES), help=f"cases, comma-separated ({', '.join(CASES)})")
    p.add_argument("--nanogpt", metavar="DIR", help="a karpathy/nanoGPT checkout, for (a)")
    p.add_argument("--backend", default="aot_eager", help="torch.compile's backend (default aot_eager)")
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--timeout", type=int, default=900, help="seconds a run may take")
    a = p.parse_args(argv)
    cases = [c for c in a.only.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"unknown case(s) {bad}")
    print(f"graph breaks / graphs on rank 0, torch._dynamo's counters; 2 CPU ranks, backend {a.backend}, "
          f"{a.iters} iterations")
    print(f"{'script':38} {'alone':>10} {'ddptui':>10}  equal")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ddptui-gb-") as tmp:
        for c in cases:
            cmd, why = case_cmd(c, a, tmp)
            if cmd is None:
                print(f"{LABEL[c]:38} skipped: {why}")
                continue
            got = []
            for under in (False, True):
                n, secs, out = run(cmd, under, a, tmp, f"{c}-{int(under)}")
                if n is None:
                    print(f"{LABEL[c]:38} {'under ddptui' if under else 'alone'}: failed ({secs:.0f} s)\n{out[-2500:]}",
                          file=sys.stderr)
                got.append(n)
            if None in got:
                print(f"{LABEL[c]:38} failed (see above)")
                failed += 1
                continue
            same = got[0] == got[1]
            failed += not same
            print(f"{LABEL[c]:38} {'%d / %d' % got[0]:>10} {'%d / %d' % got[1]:>10}  {'yes' if same else 'NO'}",
                  flush=True)
    print(f"GRAPH_BREAKS: {'equal in every row run' if not failed else f'{failed} row(s) differ or failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
