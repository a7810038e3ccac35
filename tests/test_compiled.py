"""Compiled models under ddptui: the layer marks are ops torch.compile keeps in its graph
(ranks/core/markop.py), so a compiled model gets no graph break of ddptui's, and its layers
are timed, in its forward and its compiled backward, named as the user named them.

Real torchrun ranks on gloo, the scripts run alone and under `ddptui run --auto`, each
printing torch._dynamo's own counts (graph breaks, graphs compiled). Dynamo's counts do not
depend on the backend: most runs use `aot_eager` (Dynamo and AOTAutograd, no code
generation: seconds), the first runs Inductor end to end under ddptui (its C++ build, a
fresh cache)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .helpers import ROOT, SPAN_BWD, SPAN_FWD, cli_env, run_script, spans_of, step_batches

pytestmark = [pytest.mark.slow]


def counts(text: str) -> tuple[int, int, list[str]]:
    """(graph breaks, graphs, the breaks' reasons) a script's rank 0 printed."""
    b = re.search(r"GRAPH_BREAKS (\d+)", text)
    g = re.search(r"GRAPHS (\d+)", text)
    assert b and g, text[-3000:]
    return int(b.group(1)), int(g.group(1)), re.findall(r"BREAK \d+ (.*)", text)


# Inductor's probes of the C++ compiler for each vector instruction set the CPU lists (a small
# program built per set: ~6 of a run's ~23 CPU-s here, before its kernels) skipped: the sets
# /proc/cpuinfo names are taken as they are. The kernels are built and run as ever; what
# these tests are about, ddptui's marks in the generated code, does not depend on the set.
INDUCTOR_ENV = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}


def alone(tmp_path, script: str, *args: str) -> str:
    """The script run alone under torchrun (2 ranks, gloo): what it printed."""
    env = cli_env({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-alone"), **INDUCTOR_ENV})
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        os.path.join(ROOT, "tests", "scripts", script), *args],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


ALONE = os.path.join(ROOT, "tests", "data", "compiled-alone.json")


def alone_key(script: str, *args: str) -> str:
    """What Dynamo's counts of a script alone depend on: torch, Python, the script's text, its
    arguments (the backend among them)."""
    import hashlib

    import torch
    with open(os.path.join(ROOT, "tests", "scripts", script), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"torch {torch.__version__} · python {sys.version_info[0]}.{sys.version_info[1]} · {script} {digest} · {' '.join(args)}"


def alone_counts(tmp_path, script: str, *args: str) -> tuple[int, int]:
    """Dynamo's counts of the script run alone (`alone`): (graph breaks, graphs), a function of torch, Python, the
    script and its arguments only, so read from tests/data/compiled-alone.json where that very
    key is there (the suite's run saves three torchrun launches), else run. `bin/test --all`
    always runs them, and checks the table: a stale entry fails there.
    `python -m tests.test_compiled` writes the table for this torch."""
    key = alone_key(script, *args)
    table = {}
    if os.path.exists(ALONE):
        import json
        with open(ALONE) as f:
            table = json.load(f)
    got = table.get(key)
    if got is not None and not os.environ.get("DDPTUI_TEST_ALL"):
        return got[0], got[1]
    ran = counts(alone(tmp_path, script, *args))[:2]
    if got is not None:
        assert tuple(got) == ran, f"{ALONE} is stale for {key}: {got} against {ran}"
    return ran


# (script, args) of every alone run the tests compare with
ALONE_RUNS = [("compiled.py", ("--backend", "aot_eager", "--iters", "8", "--traced-coll", "--blocks", "1")),
              ("compiled.py", ("--backend", "aot_eager", "--iters", "6", "--wrap", "outside")),
              ("fsdp2.py", ("--compile", "--backend", "aot_eager", "--iters", "6"))]


def layers_timed(got, strategy: str, n_layers: int, apart=None, ranks=None) -> None:
    """Every step after the first has a forward and a backward span of every layer, the
    backward's in reverse order, one after another (`apart`: the layers held to it, default
    all), on every rank (`ranks`: those held to it)."""
    batches = step_batches(got, strategy)
    assert len(batches) >= 4
    for k, by_rank in batches.items():
        if k == 0:
            continue
        for r, b in by_rank.items():
            if ranks is not None and r not in ranks:
                continue
            fwd = spans_of(b, SPAN_FWD)
            bwd = spans_of(b, SPAN_BWD)
            assert sorted(i for i, _, _ in fwd) == list(range(n_layers)), (k, fwd)
            assert sorted(i for i, _, _ in bwd) == list(range(n_layers)), (k, bwd)
            order = sorted(bwd, key=lambda s: s[1])
            assert [i for i, _, _ in order] == list(range(n_layers - 1, -1, -1)), (k, order)
            for (i, a0, a1), (j, b0, _) in zip(order, order[1:]):
                # (µs; where one layer's output is the next one's input, the eager hooks on that
                # one gradient mark the lower layer's start a moment before the upper's end)
                if apart is None or (i in apart and j in apart):
                    assert b0 >= a1 - 100, f"step {k}: backward spans overlap ({order})"


INDUCTOR_ARGS = ("--iters", "8", "--traced-coll", "--blocks", "1")


@pytest.fixture(scope="module")
def inductor_run(tmp_path_factory):
    """nanoGPT's way, DDP(torch.compile(model)) with one block (Inductor builds a kernel of C++
    for each fused op of each block: one block, a third fewer builds), under ddptui on
    Inductor's real build (a fresh cache: none of an earlier run's graphs), on one rank: each
    rank builds the same code, and a second rank cost 10-12 CPU-s more here (compiled models
    on two ranks: torch.compile(DDP) and FSDP2's compiled blocks below, verify's DDP of
    compiled blocks; the ranks' traced collectives merged: tests/test_store.py):
    (its JSON, the recording, what it printed, its folder)."""
    d = tmp_path_factory.mktemp("inductor")
    doc, got, out = run_script(d / "under", "compiled.py", "--backend", "inductor", *INDUCTOR_ARGS,
                               timeout=300, env={"TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"), **INDUCTOR_ENV}, nproc=1)
    return doc, got, out, d


def test_a_compiled_model_in_ddp_gets_no_graph_break_of_ddptuis(inductor_run, tmp_path):
    """nanoGPT's way, DDP(torch.compile(model)), under ddptui on Inductor's real build (ddptui's
    marks in the generated code): as many breaks and graphs as alone (before: 5 breaks at
    ddptui's hooks, 4 graphs; alone on aot_eager, seconds to build: Dynamo's counts are not the
    backend's to add or take), every layer timed, named without `_orig_mod.`. Its
    forward all_reduces a statistic with a functional collective, which torch.compile traces
    into its graph: ddptui cannot time it there, and the summary, its JSON and the recording's
    summary say so, which and how many a step."""
    doc, got, out, d = inductor_run
    base = alone_counts(tmp_path, "compiled.py", "--backend", "aot_eager", *INDUCTOR_ARGS)
    under = counts(out)
    assert under[:2] == base == (0, 1), (base, under)
    names = got.store.meta.layers
    assert names and not any("_orig_mod" in n for n in names), names
    assert "h.0" in names and "lm_head" in names, names
    layers_timed(got, "ddp", len(names))
    (ddp,) = doc["strategies"]
    assert ddp["steps"] == 8
    assert ddp["traced_collectives"] == {"all_reduce": {"per_step": 1.0, "bytes_per_step": 4, "ranks": [0]}}
    line = "ddp: collectives inside compiled graphs, a step: all_reduce ×1: torch.compile traced them"
    assert line in out
    from .helpers import run_main
    summ = run_main("summary", str(d / "under" / "run.ddptui"))
    assert summ.returncode == 0 and line in summ.stdout, summ.stdout[-2000:]


OUTSIDE_ARGS = ("--backend", "aot_eager", "--iters", "6", "--wrap", "outside")


@pytest.fixture(scope="module")
def outside_run(tmp_path_factory):
    """torch.compile(DDP(model)) on aot_eager under ddptui, rank 1's marks seeing a CUDA graph's
    capture (the DDPTUI_GRAPH_CAPTURE seam on that rank only; rank 0's run): (its JSON, the
    recording, what it printed)."""
    d = tmp_path_factory.mktemp("outside")
    return run_script(d / "under", "compiled.py", *OUTSIDE_ARGS, env={"DDPTUI_GRAPH_CAPTURE": "rank:1"})


def test_a_compiled_ddp_module_breaks_only_where_ddp_itself_does(outside_run, tmp_path):
    """torch.compile(DDP(model)): DDP's own forward breaks the graph (its reducer, its
    `_inside_ddp_forward`); under ddptui as many breaks and graphs as alone (before: 8 more, at
    `time.monotonic_ns` in ddptui's hooks; then 1 more break and 2 more graphs: any hook on
    the DDP module changes what Dynamo does there, so ddptui's move to the compiled wrapper),
    none of them ddptui's, and its buckets are still timed (every layer on rank 0: rank 1's
    stream stands for a CUDA graph's capture, below)."""
    base = alone_counts(tmp_path, "compiled.py", *OUTSIDE_ARGS)
    doc, got, out = outside_run
    under = counts(out)
    assert under[:2] == base, (base, under)
    assert under[0] >= 1, "DDP compiled whole breaks its own graph"
    ddps = ("Reducer", "Logger", "DistributedDataParallel")
    assert all(any(w in why for w in ddps) for why in under[2]), under[2]
    assert not any("monotonic" in why or "ranks/" in why for why in under[2]), under[2]
    layers_timed(got, "ddp", len(got.store.meta.layers), ranks=(0,))
    (ddp,) = [s for s in doc["strategies"] if s["strategy"] == "ddp"]
    assert ddp["steps"] == 6
    assert ddp["bucket_timing"]["untimed"] == 0, ddp["bucket_timing"]


def test_marks_inside_a_cuda_graph_capture_are_skipped_and_said(outside_run):
    """Under CUDA graphs a compiled graph is captured once and replayed with no Python: a mark
    that runs while its stream is capturing would be recorded into the graph and never run
    again. Each such mark is skipped and counted, and the summary and its JSON say how many, of
    the rank whose stream captured (the seam DDPTUI_GRAPH_CAPTURE stands for a capturing stream
    on a CPU: rank 1 of a compiled DDP module's run, whose rank 0 is timed), and that rank has no
    layer span drawn as if timed."""
    doc, got, out = outside_run
    (ddp,) = [s for s in doc["strategies"] if s["strategy"] == "ddp"]
    skipped = ddp["cuda_graph_marks"]["skipped"]
    n_layers = len(got.store.meta.layers)
    assert set(skipped) == {"1"} and skipped["1"] >= 6 * n_layers * 2, (skipped, n_layers)
    assert "layer marks skipped inside a CUDA graph's capture" in out
    for k, by_rank in step_batches(got, "ddp").items():
        b = by_rank.get(1)
        assert b is None or not (spans_of(b, SPAN_FWD) or spans_of(b, SPAN_BWD)), k


def test_compiled_blocks_under_fsdp2_get_no_graph_break_of_ddptuis(tmp_path):
    """torchtitan's way: each block compiled, then sharded: the same counts alone and under
    ddptui, and every block's forward and backward timed."""
    args = ("--compile", "--backend", "aot_eager", "--iters", "6")
    base = alone_counts(tmp_path, "fsdp2.py", *args)
    doc, got, out = run_script(tmp_path / "under", "fsdp2.py", *args)
    assert counts(out)[:2] == base, (base, counts(out))
    names = got.store.meta.layers
    assert "layers.0" in names and not any("_orig_mod" in n for n in names), names
    # (the compiled blocks one after another; the eager norm and output layer, two hooks on one
    # gradient, were seen 0.4 ms apart on loaded cores)
    layers_timed(got, "fsdp", len(names), apart={i for i, n in enumerate(names) if n.startswith("layers.")})


if __name__ == "__main__":  # python -m tests.test_compiled: the alone counts of this torch, written
    import json
    import tempfile
    table = {}
    if os.path.exists(ALONE):
        with open(ALONE) as f:
            table = json.load(f)
    # (this torch's entries of an earlier script or arguments dropped; other torches' kept)
    keys = {alone_key(script, *args) for script, args in ALONE_RUNS}
    here = next(iter(keys)).split(" · ")[:2]
    table = {k: v for k, v in table.items() if k in keys or k.split(" · ")[:2] != here}
    for script, args in ALONE_RUNS:
        with tempfile.TemporaryDirectory() as d:
            from pathlib import Path
            table[alone_key(script, *args)] = list(counts(alone(Path(d), script, *args))[:2])
            print(alone_key(script, *args), table[alone_key(script, *args)])
    with open(ALONE, "w") as f:
        json.dump(table, f, indent=0, ensure_ascii=False)
        f.write("\n")
