"""ddptui.instrument (ranks.scripts.user), per-rank recordings read as one run, and `ddptui run`."""
from __future__ import annotations

import json
import os
import time
import subprocess
import sys

import pytest

from tests.helpers import ROOT, assert_no_leftovers, pythonpath, run_main

PY = sys.executable
CNN = os.path.join(ROOT, "examples", "train_cnn.py")


def _env(**kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath(), **kw)
    env.pop("DDPTUI_SOCKET", None)
    return env


def test_import_does_not_load_textual():
    code = ("import sys, ddptui; f = ddptui.instrument; import ranks.scripts.user; "
            "assert callable(f); print('textual' in sys.modules, 'ddptui.ui.app' in sys.modules)")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]

def test_the_app_side_never_imports_torch():
    """torch is the ranks' (2–3 s of CPU to import): every CLI verb's module, and `ddptui run`
    up to launching its ranks, leave it out of the app's process."""
    code = ("import sys, pkgutil, importlib, ddptui.cli\n"
            "for m in pkgutil.iter_modules(ddptui.cli.__path__): importlib.import_module('ddptui.cli.' + m.name)\n"
            "from ddptui.cli import run\n"
            "try:\n"
            "    run.build(['--headless', '--', 'examples/train_cnn.py', '--steps', '1'])\n"
            "except Exception as e:\n"
            "    print('build failed:', e)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=_env(), timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# -- choosing layers (no process group needed) ------------------------------------------------
def _nets():
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ff = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU())

        def forward(self, x):
            return x + self.ff(self.attn(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.blocks = nn.ModuleList([Block(), Block()])
            self.shared = nn.Linear(8, 8)  # called twice a step
            self.alias = self.shared  # the same module under a second name
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            x = self.embed(x)
            for b in self.blocks:
                x = b(x)
            return self.head(self.shared(self.shared(x)))
    return Net


def test_choose_layers_auto_depth_names():
    from ranks.scripts.user import choose_layers
    net = _nets()()
    assert [n for n, _ in choose_layers(net)] == ["embed", "blocks.0", "blocks.1", "shared", "head"]
    assert [n for n, _ in choose_layers(net, 3)][:3] == ["embed", "blocks.0.attn", "blocks.0.ff"]
    got = choose_layers(net, ["blocks", "blocks.0", "blocks.0.attn", "alias", "shared"])
    assert [n for n, _ in got] == ["blocks", "blocks.0", "blocks.0.attn", "alias"]  # alias == shared
    with pytest.raises(ValueError, match="no module 'attn'.*blocks.0.attn"):
        choose_layers(net, ["attn"])
    with pytest.raises(ValueError):
        choose_layers(net, 0)


# -- one process, world 1: hooks, comm hook, no_sync, nested names ------------------------------
@pytest.fixture
def pg(tmp_path):
    import torch.distributed as dist

    from ranks.scripts import commhook, user
    real = dist.all_reduce
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield tmp_path
    for h in list(user._handles):
        h.close()
    user._handles.clear()
    dist.all_reduce = real
    commhook._orig_all_reduce = None
    dist.destroy_process_group()


def _train(tmp_path, layers, hook=None, accumulate=1, steps=4, bucket_cap_mb=0.001):
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddptui
    from ddptui.recording.loader import load
    torch.manual_seed(0)
    model = DDP(_nets()(), bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = ddptui.instrument(model, layers=layers, optimizer=opt, batch=16, record=str(tmp_path / "run"))
    if hook is not None:
        model.register_comm_hook(None, hook)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pass  # (autocast is exercised by the transformer example)
    for _ in range(steps):
        opt.zero_grad()
        for m in range(accumulate):
            ctx = model.no_sync() if m < accumulate - 1 else _Null()
            with h.step(), ctx:
                F.cross_entropy(model(x), y).backward()
                if m == accumulate - 1:
                    opt.step()
    h.close()
    return h, load(str(tmp_path / "run"))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _kinds(got, step):
    from ranks import wire
    b = got.store.raw["ddp"][step][0]
    return [(wire.KIND_NAMES[k], b.idx[i]) for i, k in enumerate(b.kind)]


@pytest.mark.slow  # (a real DDP)
def test_a_scripts_steps_are_resolved_off_the_training_thread(pg, monkeypatch):
    """A user's steps are handed to the sink unresolved and resolved on its thread (on CUDA an
    elapsed_time per mark: hundreds of µs a step the training thread no longer spends), their
    layers in forward order and micro-steps kept, as when resolved in place; a step that cannot
    be resolved is dropped and counted, and the recording goes on."""
    import threading

    from ranks.scripts.userlayers import UserRecorder
    where, real = [], UserRecorder._resolve
    fail = {"at": 2}

    def resolve(self, r, yield_every=0):
        where.append(threading.current_thread().name)
        if r.step == fail["at"]:
            time.sleep(0.05)  # (resolved after the script closed: the Bye was made by then)
            raise RuntimeError("a step that cannot be resolved")
        return real(self, r, yield_every)
    monkeypatch.setattr(UserRecorder, "_resolve", resolve)
    for at in (2, 4):
        fail["at"], where[:] = at, []
        h, got = _train(pg / str(at), "auto", accumulate=2, steps=5)
        assert where and set(where) == {"ddptui-file"}  # never the training thread
        assert got.store.complete_steps("ddp") == [k for k in range(5) if k != at]  # the rest kept
        sink = h.session.sink
        assert sink.resolve_errors == 1 and sink.dropped_frames == 1 and sink.dropped_spans > 0
        assert got.store.dropped_spans() == [(0, sink.dropped_spans)]  # in the recording's Bye
        n = len(h.layers)
        kinds = _kinds(got, 3 if at != 3 else 1)
        assert sum(1 for x in kinds if x[0] == "forward") == 2 * n  # both micro-steps' layers
        assert sorted({i for kd, i in kinds if kd == "forward"}) == list(range(n))  # forward order


def test_a_recording_goes_on_past_a_step_that_cannot_be_encoded(tmp_path):
    """A rank's own recording (no app): a step whose span cannot be encoded (ends more than
    2^32 µs after its base) is dropped and counted, and the recording goes on and closes."""
    from ranks import frames
    from ranks.scripts.user import FileSink
    from ddptui.recording.loader import load
    s = FileSink(str(tmp_path / "rank0.ddptui"), 0, {"ddptui": "0.1.0", "world": 1, "user": True})
    s.send_now(frames.Hello(rank=0, world=1, layers=["a"]))
    base = 10**12

    class Step:  # (a finished step handed over unresolved, as _emit hands it)
        n_spans = 1

        def __call__(self):
            return "ddp", 0, base, [0], [0], [base], [base + (2**32 + 5) * 1000], []
    s.put(Step(), n_spans=1)
    s.put(("ddp", 1, base, [0], [0], [base], [base + 1000], []), n_spans=1)
    s.send_now(frames.Bye(rank=0, why="done"))
    s.close(timeout=5)
    assert not s._t.is_alive() and s.resolve_errors == 1 and s.dropped_frames == 1
    got = load(str(tmp_path / "rank0.ddptui"))
    assert sorted(got.store.raw["ddp"]) == [1] and got.store.dropped_spans() == [(0, 1)]


def test_a_users_micro_steps_let_go_of_the_gil_as_they_are_resolved(monkeypatch):
    """Resolved off the training thread, a step lets go of the GIL every YIELD_EVERY marks, its
    earlier micro-steps' marks included (with accumulation, most of them)."""
    from ranks.core import resolve as instrument  # (where _let_go lives)
    from ranks.core.instrument import CpuClock
    from ranks.scripts.userlayers import UserRecorder
    calls = [0]
    monkeypatch.setattr(instrument, "_let_go", lambda: calls.__setitem__(0, calls[0] + 1))
    layers, micro = 10, 8
    rec = UserRecorder(CpuClock(), layers)
    rec.begin("ddp", 0)
    for m in range(micro):
        if m:
            rec.micro()
        for i in range(layers):
            rec.fwd_begin(i); rec.fwd_end(i)
        for i in reversed(range(layers)):
            rec.bwd_begin(i); rec.bwd_end(i)
    rec.cur.synced = 1
    rec.end()
    (item,) = rec.poll(lazy=True)
    out = item()
    assert item.n_spans == len(out[3])
    assert calls[0] >= 2 * len(out[3]) // instrument.YIELD_EVERY - 2


@pytest.mark.slow  # (a real DDP)
def test_fp16_hook_is_wrapped_timed_and_halves_bytes(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    h0, plain = _train(pg / "a", "auto")
    h1, fp16 = _train(pg / "b", "auto", hook=default_hooks.fp16_compress_hook)
    b0, b1 = plain.store.bucket_rows("ddp"), fp16.store.bucket_rows("ddp")
    assert len(b0) == len(b1) > 1
    assert [b["params"] for b in b0] == [b["params"] for b in b1]
    assert [b["bytes"] // 2 for b in b0] == [b["bytes"] for b in b1]
    assert sum(b["bytes"] for b in b0) == sum(plain.store.ddp_reported("ddp"))
    comm = [k for k in _kinds(fp16, 3) if k[0] == "allreduce"]
    assert len(comm) == len(b1)  # every bucket timed through the user's hook
    names = sorted(n for b in b1 for n in b["params"])
    assert names == sorted(h1.params)


@pytest.mark.slow  # (a real DDP)
def test_no_sync_micro_steps_are_drawn_inside_their_step(pg):
    """`with h.step()` blocks under no_sync() are micro-steps: a step is one synchronisation
    (one optimizer step), each micro-step's forward and backward drawn inside it."""
    h, got = _train(pg, "auto", accumulate=2, steps=3)
    assert got.store.complete_steps("ddp") == list(range(3))
    n = len(h.layers)
    for k in range(3):
        kinds = _kinds(got, k)
        comm = [x[1] for x in kinds if x[0] == "allreduce"]
        assert comm and len(comm) == len(set(comm))  # each bucket once, in the step that syncs
        assert sum(1 for x in kinds if x[0] == "forward") == 2 * n  # both micro-steps' layers
        assert sum(1 for x in kinds if x[0] == "backward") == 2 * n
        b = got.store.raw["ddp"][k][0]
        fwd0 = [b.t0[i] for i, kd in enumerate(b.kind) if kd == 0 and b.idx[i] == 0]
        assert len(fwd0) == 2 and fwd0[0] < fwd0[1]  # in the order they ran


@pytest.mark.slow  # (a real DDP)
def test_nested_and_shared_module_names(pg):
    h, got = _train(pg, ["blocks", "blocks.0", "blocks.0.attn", "alias", "head", "embed"])
    assert got.meta["layers"] == h.layers
    # forward order, whatever order they were named in
    assert h.layers == ["embed", "blocks", "blocks.0", "blocks.0.attn", "alias", "head"]
    spans = {}
    for kind, idx in _kinds(got, 2):
        spans.setdefault(kind, set()).add(h.layers[idx] if kind in ("forward", "backward") else idx)
    assert spans["forward"] == set(h.layers) and spans["backward"] == set(h.layers)
    b = got.store.raw["ddp"][2][0]
    fwd = {h.layers[b.idx[i]]: (b.t0[i], b.t1[i]) for i in range(len(b.kind)) if b.kind[i] == 0}
    assert fwd["blocks"][0] <= fwd["blocks.0"][0] <= fwd["blocks.0.attn"][0]  # nested inside
    assert fwd["blocks.0.attn"][1] <= fwd["blocks.0"][1] <= fwd["blocks"][1]


# -- torchrun: ddptui run, errors, plain torchrun ------------------------------------------
def _ddptui(args, timeout=90, **env):
    return subprocess.run([PY, "-m", "ddptui", *args], capture_output=True, text=True,
                          env=_env(**env), timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_run_headless_cnn_layers_buckets_and_a_script_that_raises(tmp_path):
    """`ddptui run --headless` on the CNN example, whose rank 1 raises at its sixth step (one
    run for both: each costs a torchrun): the five steps before are reported, with the layers
    by module name and DDP's buckets by parameter name (their bytes DDP's own); the error is
    named with its rank, the exit status is 1, nothing is left running."""
    js = tmp_path / "r.json"
    out = _ddptui(["run", "--headless", "--nproc-per-node", "2", "--no-record", "--json", str(js),
                   "--", "examples/train_cnn.py", "--steps", "6", "--raise-at", "5"])
    assert out.returncode == 1, out.stderr[-2000:]
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("ddptui: error:")]
    assert err and "rank 1: RuntimeError: boom at step 5" in err[-1], out.stderr[-2000:]
    d = json.loads(js.read_text())
    assert d["layers"] == ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]
    row = d["strategies"][0]
    assert row["strategy"] == "ddp" and row["steps"] == 5 and d["world_size"] == 2 and d["state"] == "failed"
    assert [b["bytes"] for b in row["buckets"]] == row["ddp_reported"]
    names = sorted(n for b in row["buckets"] for n in b["params"])
    assert "blocks.0.conv.weight" in names and len(names) == len(set(names)) == 16
    assert_no_leftovers()


@pytest.mark.slow
def test_plain_torchrun_per_rank_files_are_one_run(tmp_path):
    rec = tmp_path / "rec"
    out = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          CNN, "--steps", "4", "--accumulate", "2"], capture_output=True, text=True,
                         env=_env(DDPTUI_RECORD=str(rec)), timeout=90, cwd=str(tmp_path))
    # (the ranks' own lines, before torchrun's summary of a failure, name the cause)
    assert out.returncode == 0, "\n".join(
        ln for ln in out.stderr.splitlines() if "Warning" not in ln and "warn(" not in ln)[-8000:]
    assert sorted(os.listdir(rec)) == ["rank0.ddptui", "rank1.ddptui"]
    js = tmp_path / "s.json"
    got = run_main("summary", str(rec), "--json", str(js))  # (these verbs start no ranks: in-process)
    assert got.returncode == 0, got.stderr
    d = json.loads(js.read_text())
    # 4 optimizer steps of 2 micro-steps each: a step is a synchronisation (RankSession)
    assert d["world_size"] == 2 and d["state"] == "finished" and d["strategies"][0]["steps"] == 4
    assert d["layers"][0] == "stem"
    ex = run_main("export", str(rec), "-o", str(tmp_path / "t.json"))
    assert ex.returncode == 0 and "on 2 rank(s)" in ex.stdout


@pytest.mark.parametrize("args, says", [
    (["--nproc-per-node", "0", "--", "examples/train_cnn.py"], "--nproc-per-node must be 1..64"),
    (["--", "nowhere.py"], "nowhere.py: no such script"),
    (["--headless"], "SCRIPT"),
    (["--record", "x", "--no-record", "--", "examples/train_cnn.py"], "contradict"),
])
def test_run_bad_command_lines(args, says):
    out = run_main("run", *args, cwd=ROOT)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: error:") and says in lines[0], out.stderr


@pytest.mark.slow
def test_run_auto_instruments_a_script_that_knows_nothing_of_ddptui(user_lm_run):
    """--auto: a plain DDP script, no code change (conftest.user_lm_run: tests/scripts/tied.py, a
    tiny language model, rank 0 alone evaluating on 2 sequences every third iteration): its DDP
    is timed, layers and buckets named (the tied weight once, as the embedding's); its global
    batch is read from the training inputs (8 sequences a rank, summed over the 2 ranks; not
    the evaluation's), so samples/s is that over the step."""
    from .helpers import SCRIPT_ITERS
    doc = user_lm_run[0]
    assert doc["layers"] == ["wte", "h.0", "h.1", "h.2", "ln_f", "lm_head"]
    assert doc["batch"] == 16 and doc["batch_from"] == "inputs"
    s = doc["strategies"][0]
    assert s["steps"] == SCRIPT_ITERS and s["allreduce_calls_per_step"] >= 1
    assert s["samples_per_s"] == pytest.approx(16 / (s["step_ms_median"] / 1e3), rel=1e-6)
    names = sorted(p for b in s["buckets"] for p in b["params"])
    assert names == sorted(["wte.weight", "ln_f.weight", "ln_f.bias"] + [
        f"h.{i}.{m}.{w}" for i in range(3) for m in ("fc", "proj") for w in ("weight", "bias")])
    assert "global batch 16" in user_lm_run[2]


def test_auto_layers_open_wrappers_to_blocks():
    """layers="auto" goes through single-child wrappers (a LightningModule holding its model,
    an HF *ForCausalLM holding `model`/`transformer`) to a level of >= 4 blocks."""
    import torch.nn as nn

    from ranks.scripts.user import choose_layers

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = nn.Linear(16, 16), nn.Linear(16, 16)

    class Decoder(nn.Module):  # HF's LlamaModel: embed, layers.N, norm
        def __init__(self, n):
            super().__init__()
            self.embed_tokens = nn.Embedding(10, 16)
            self.layers = nn.ModuleList([Block() for _ in range(n)])
            self.norm = nn.LayerNorm(16)

    class CausalLM(nn.Module):  # HF's *ForCausalLM: model, lm_head
        def __init__(self, n):
            super().__init__()
            self.model, self.lm_head = Decoder(n), nn.Linear(16, 10)

    class Lit(nn.Module):  # a LightningModule: one child, its model
        def __init__(self, n):
            super().__init__()
            self.model = CausalLM(n)

    names = [n for n, _ in choose_layers(Lit(6))]
    assert names == ["model.model.embed_tokens"] + [f"model.model.layers.{i}" for i in range(6)] \
        + ["model.model.norm", "model.lm_head"]
    # nested single-child wrappers
    w = nn.Sequential()
    w.add_module("inner", nn.Module())
    w.inner.add_module("net", Decoder(4))
    assert [n for n, _ in choose_layers(w)][1:5] == [f"inner.net.layers.{i}" for i in range(4)]
    # a level of >= 4 blocks holding the parameters is kept whole, even when one of them
    # holds most (a stage that is a module of its own, not a container)
    class Stage(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.a, self.b = Block(), Block()
            self.big = nn.Linear(16 * n, 16 * n)

    stages = nn.Module()
    for i in range(4):
        stages.add_module(f"stage{i + 1}", Stage(i + 1))
    assert [n for n, _ in choose_layers(stages)] == ["stage1", "stage2", "stage3", "stage4"]
    wrapped = nn.Module()
    wrapped.body = stages
    wrapped.head = nn.Linear(16, 2)
    assert [n for n, _ in choose_layers(wrapped)] == [f"body.stage{i}" for i in range(1, 5)] + ["head"]
    # a model with no children is one layer
    assert [n for n, _ in choose_layers(nn.Linear(2, 2))] == ["model"]


def test_auto_layers_repeated_blocks_at_any_depth():
    """layers="auto" opens a model to its lists of repeated blocks wherever they sit: both
    stacks of an encoder-decoder, a stage's blocks with its downsampling beside them, every
    bottleneck of a ResNet's four Sequentials; a block with experts inside stays one; a
    module holding no parameters is no layer."""
    import torch.nn as nn

    from ranks.scripts.user import choose_layers

    class Block(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.attn, self.ff, self.drop = nn.Linear(d, d), nn.Linear(d, d), nn.Dropout()

    class Stack(nn.Module):  # T5Stack: its own embedding (the shared one), blocks, a norm
        def __init__(self, emb, n):
            super().__init__()
            self.embed_tokens = emb
            self.block = nn.ModuleList([Block() for _ in range(n)])
            self.final_layer_norm, self.dropout = nn.LayerNorm(16), nn.Dropout()

    class EncDec(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = nn.Embedding(10, 16)
            self.encoder, self.decoder = Stack(self.shared, 3), Stack(self.shared, 2)
            self.lm_head = nn.Linear(16, 10)

    assert [n for n, _ in choose_layers(EncDec())] == (
        ["shared"] + [f"encoder.block.{i}" for i in range(3)] + ["encoder.final_layer_norm"]
        + [f"decoder.block.{i}" for i in range(2)] + ["decoder.final_layer_norm", "lm_head"])

    class Stage(nn.Module):  # Swin's: its blocks, then a downsampling (not in the last stage)
        def __init__(self, n, down):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(n)])
            self.downsample = nn.Linear(16, 16) if down else None

    class Swin(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = nn.Conv2d(3, 16, 4)
            self.layers = nn.ModuleList([Stage(1, True), Stage(3, True), Stage(1, False)])
            self.pool, self.head = nn.AdaptiveAvgPool1d(1), nn.Linear(16, 2)

    assert [n for n, _ in choose_layers(Swin())] == [
        "embeddings", "layers.0.blocks.0", "layers.0.downsample", "layers.1.blocks.0",
        "layers.1.blocks.1", "layers.1.blocks.2", "layers.1.downsample", "layers.2.blocks.0", "head"]

    class Bottleneck(nn.Module):  # torchvision's: convolutions, a downsample in the first
        def __init__(self, first):
            super().__init__()
            self.conv1, self.bn1, self.conv2 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)
            self.downsample = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)) if first else None

    class ResNet(nn.Module):
        def __init__(self, depths=(3, 4, 6, 3)):
            super().__init__()
            self.conv1, self.bn1, self.relu = nn.Conv2d(3, 8, 7), nn.BatchNorm2d(8), nn.ReLU()
            for i, d in enumerate(depths, 1):
                self.add_module(f"layer{i}", nn.Sequential(*[Bottleneck(j == 0) for j in range(d)]))
            self.fc = nn.Linear(8, 10)

    names = [n for n, _ in choose_layers(ResNet())]
    assert names == ["conv1", "bn1"] + [f"layer{i}.{j}" for i, d in enumerate((3, 4, 6, 3), 1)
                                        for j in range(d)] + ["fc"]

    class ConvLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8)

    class HFBottleneck(nn.Module):  # HF's ResNet: its convolutions are a Sequential of one type
        def __init__(self):
            super().__init__()
            self.shortcut = nn.Identity()
            self.layer = nn.Sequential(ConvLayer(), ConvLayer(), ConvLayer())

    class HFStage(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.layers = nn.Sequential(*[HFBottleneck() for _ in range(n)])

    hf = nn.Module()
    hf.embedder = ConvLayer()
    hf.stages = nn.ModuleList([HFStage(2), HFStage(1)])
    assert [n for n, _ in choose_layers(hf)] == [
        "embedder", "stages.0.layers.0", "stages.0.layers.1", "stages.1.layers.0"]

    class Experts(nn.Module):  # a Mixtral-style sparse MLP: a router, a list of experts
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 4)
            self.experts = nn.ModuleList([nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 16)) for _ in range(4)])

    class MoELayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.block_sparse_moe, self.norm = nn.Linear(16, 16), Experts(), nn.LayerNorm(16)

    moe = nn.Module()
    moe.embed_tokens = nn.Embedding(10, 16)
    moe.layers = nn.ModuleList([MoELayer() for _ in range(3)])
    moe.rotary_emb = nn.Identity()  # (no parameters: no layer)
    moe.lm_head = nn.Linear(16, 10)
    assert [n for n, _ in choose_layers(moe)] == ["embed_tokens", "layers.0", "layers.1", "layers.2", "lm_head"]
    for layer in moe.layers:  # experts held by the decoder layer itself: still one block a layer
        layer.experts = layer.block_sparse_moe.experts
        del layer.block_sparse_moe
    assert [n for n, _ in choose_layers(moe)] == ["embed_tokens", "layers.0", "layers.1", "layers.2", "lm_head"]
    # the model itself a list of blocks
    assert [n for n, _ in choose_layers(nn.Sequential(Block(), Block()))] == ["0", "1"]


@pytest.mark.slow  # (a real DDP)
def test_optimizer_step_with_a_closure_times_only_the_update(pg):
    """optimizer.step(closure) (Lightning's automatic optimization, LBFGS): the forward and
    backward run inside step(); the optimizer's span starts when the closure returns."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddptui
    from ddptui.recording.loader import load
    from ranks import wire
    torch.manual_seed(0)
    model = DDP(_nets()(), bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = ddptui.instrument(model, optimizer=opt, batch=16, record=str(pg / "run"))
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        time.sleep(0.02)  # the closure's own work after backward: not the optimizer's
        return loss
    for _ in range(3):
        opt.step(closure)  # positional
        opt.step(closure=closure)  # keyword
    h.close()
    got = load(str(pg / "run"))
    assert got.store.complete_steps("ddp") == list(range(6))
    lengths = []
    for k in range(6):
        b = got.store.raw["ddp"][k][0]
        span = {wire.KIND_NAMES[kd]: (b.t0[i], b.t1[i]) for i, kd in enumerate(b.kind)
                if wire.KIND_NAMES[kd] in ("optimizer", "step")}
        bwd_end = max(b.t1[i] for i, kd in enumerate(b.kind) if wire.KIND_NAMES[kd] == "backward")
        o0, o1 = span["optimizer"]
        assert o0 >= bwd_end + 15_000 and o1 <= span["step"][1], (k, o0, o1, bwd_end)
        lengths.append(o1 - o0)
    # the update alone (~50 µs), not the closure's 20 ms sleep: the median (the first step pays
    # PyTorch's one-off imports, 121 ms once on a loaded CI host)
    assert sorted(lengths)[len(lengths) // 2] < 15_000, lengths


@pytest.mark.slow  # (a real DDP)
def test_two_ddp_modules_named_by_where_they_are_held(pg):
    """Two DDP modules of one rank, instrumented one after the other, are one picture: one
    recording, one step per synchronisation spanning both, layers and parameters named after
    the module's attribute path (found from whoever holds it: here a model local to a
    function), else after its class and an index."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddptui
    from ddptui.recording.loader import load

    def train(run, held_by_a_model):
        torch.manual_seed(0)
        bot, top = nn.Sequential(nn.Linear(4, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 2))
        if held_by_a_model:
            net = nn.Module()
            net.enc, net.head = DDP(bot), DDP(top)
            mods = [net.enc, net.head]
        else:
            mods = [DDP(bot), DDP(top)]
        opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=0.1)
        hs = [ddptui.instrument(m, optimizer=opt, record=str(run)) for m in mods]
        x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(mods[1](mods[0](x)), y).backward()
            opt.step()
        hs[0].close()
        return hs, load(str(run))

    hs, got = train(pg / "a", True)
    assert sorted(os.listdir(pg / "a")) == ["rank0.ddptui"]
    assert got.meta["layers"] == ["enc.0", "enc.1", "head.0"]
    assert hs[0].layers == ["enc.0", "enc.1"] and hs[1].params == ["head.0.weight", "head.0.bias"]
    assert got.store.complete_steps("ddp") == [0, 1, 2]
    rows = got.store.summary("ddp")["buckets"]
    assert sorted(p for b in rows for p in b["params"]) == sorted(hs[0].params + hs[1].params)
    assert len({b["index"] for b in rows}) == len(rows) == 2
    for k in range(3):
        assert len([x for x in _kinds(got, k) if x[0] == "allreduce"]) == 2  # both modules' buckets
    _, got = train(pg / "b", False)
    assert got.meta["layers"] == ["Sequential0.0", "Sequential0.1", "Sequential1.0"]


def test_user_recorder_on_the_cuda_path_micro_steps_and_fewer_calls():
    """(tests/cuda_sim.py's stand-in for torch.cuda) UserRecorder with CUDA events: micro-steps
    keep their spans, in order, against the step's start; a layer that makes fewer backward
    calls than the last time it ran keeps a span (its end marked at its first call); a
    dropped step and resolved steps hand every event back (the pool stays flat)."""
    from ranks.core.instrument import CudaClock
    from ranks.scripts.userlayers import UserRecorder
    from ranks.wire import BWD, FWD, STEP
    from tests.cuda_sim import SimCuda
    sim = SimCuda()
    clock = CudaClock("cuda:0", torch_cuda=sim, host_ns=sim.host_ns)
    rec = UserRecorder(clock, 0)
    rec.add_layers(2)

    def micro(calls):
        starts = []
        for i in range(2):
            starts.append(sim.now)
            rec.fwd_begin(i); sim.host_work(1_000); rec.fwd_end(i)
        for i in reversed(range(2)):
            rec.bwd_begin(i)
            for _ in range(calls):
                sim.host_work(1_000)
                rec.bwd_end(i)
        return starts

    pools = []
    for step, calls in enumerate((3, 3, 1, 3)):
        rec.begin("ddp", step)
        s0 = micro(calls)
        assert rec.bwd_since()
        rec.micro()
        assert not rec.bwd_since()
        s1 = micro(calls)
        rec.comm_issue(0)
        rec.comm_done(rec.cur, 0)
        rec.end()
        (item,) = rec.poll(wait=True)
        _, _, base, kinds, idxs, t0s, t1s, _ = item
        assert kinds.count(FWD) == kinds.count(BWD) == 4 and kinds[0] == STEP
        fwd0 = [t for k, i, t in zip(kinds, idxs, t0s) if k == FWD and i == 0]
        assert [abs(a - b) < 2_000 for a, b in zip(fwd0, (s0[0], s1[0]))] == [True, True]
        rec.begin("ddp", step + 1)  # a step that synchronised nothing: dropped
        micro(calls)
        rec.discard()
        pools.append(clock.allocated)
    assert pools[-1] == pools[1], pools  # no event lost: the pool stays flat


def test_a_scripts_bucket_cap_reads_as_it_gave_it():
    """DDP keeps bucket_cap_mb as int(MB * 2**20) bytes: 0.05 came back as 0.0499992 on the
    pane's header and the what-if's; the shortest decimal that DDP would keep as the same
    bytes is the script's number."""
    from types import SimpleNamespace

    from ranks.scripts.user import _cap_mb
    for mb in (0.05, 25, 1.5, 0.001, 3.7, 100, 0.25):
        assert _cap_mb(SimpleNamespace(bucket_bytes_cap=int(mb * 1024 * 1024))) == mb
    assert _cap_mb(SimpleNamespace(bucket_bytes_cap=0)) is None and _cap_mb(object()) is None


AUTO_AND_OWN_CALL = """
import sys, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import ddptui
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
h = ddptui.instrument(model, optimizer=opt, batch=16)
again = ddptui.instrument(model, optimizer=opt, batch=16)
assert again is h and h.by_auto
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
for _ in range(3):
    with h.step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
dist.destroy_process_group()
"""


@pytest.mark.slow  # (a real rank's process: torch and DDP started)
def test_auto_steps_aside_for_a_scripts_own_instrument_call(tmp_path):
    """`ddptui run --auto` on a script that calls ddptui.instrument itself: the script's call
    returns the handle --auto made (its batch taken), one line says --auto is not needed, no
    traceback, and the steps are recorded once (userboot's --auto, in one real process)."""
    from ddptui.recording.loader import load
    script = tmp_path / "own.py"
    script.write_text(AUTO_AND_OWN_CALL)
    env = _env(DDPTUI_AUTO="1", DDPTUI_RECORD=str(tmp_path / "run"), RANK="0", WORLD_SIZE="1")
    out = subprocess.run([PY, "-m", "ranks.scripts.userboot", str(script), str(tmp_path / "store")],
                         capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "instrumented already" not in out.stderr
    assert out.stderr.count("--auto is not needed") == 1, out.stderr
    got = load(str(tmp_path / "run"))
    assert got.store.complete_steps("ddp") == [0, 1, 2]
    assert got.meta["batch"] == 16
    assert got.store.ranks[0].device == "cpu"


def test_an_error_before_the_first_step_still_names_the_device(pg):
    """A script's error before its first step (the hello sent then, minimal): the app's
    `rank N connected:` line names the device, not an empty one."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddptui
    from ddptui.recording.loader import load
    h = ddptui.instrument(DDP(nn.Linear(4, 2)), record=str(pg / "run"))
    h.error(RuntimeError("boom"))
    got = load(str(pg / "run"))
    assert got.store.ranks[0].device == "cpu"
    assert any("rank 0 connected: cpu, gloo" in t for _, _, t in got.store.log), got.store.log


@pytest.mark.slow
@pytest.mark.heavy  # CI: tests/test_mesh2d.py::test_collectives_are_split_by_mesh_dimension (its mesh's ranks say gloo)
def test_a_device_mesh_groups_backend_is_named(tmp_path):
    """init_device_mesh makes the process group without naming a backend (dist.get_backend():
    "undefined"): the ranks say the backend their collectives run on. Heavy (a run of its own):
    in CI, tests/test_mesh2d.py::test_collectives_are_split_by_mesh_dimension checks the same
    on its 2D mesh's run ("connected: cpu, gloo", never "undefined")."""
    js = tmp_path / "m.json"
    out = _ddptui(["run", "--auto", "--headless", "--nproc-per-node", "2", "--no-record", "--json", str(js),
                   "--", "tests/scripts/mesh_ddp.py", "--iters", "6"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "connected: cpu, gloo" in out.stderr and "undefined" not in out.stderr
    d = json.loads(js.read_text())
    assert d["backend"] == "gloo" and d["strategies"][0]["steps"] >= 5
    assert_no_leftovers()
