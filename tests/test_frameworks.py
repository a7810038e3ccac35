"""Frameworks' DDP under `ddptui run --auto`, unchanged scripts: Lightning's Trainer(strategy="ddp")
and a Hugging Face causal LM in a plain DDP loop. Both are opened into their blocks, in forward
order, with DDP's buckets named. Lightning and transformers are test-only extras
(`pip install -e .[frameworks]`): each test skips with the reason when its library is absent."""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from ddptui.recording.reader import Reader
from ranks.wire import BWD, COMM, FWD, OPT, STEP, decode_spans

from .helpers import ROOT, assert_no_leftovers, run_cli

STEPS = 6


def _run(tmp_path, script, *script_args):
    out, rec = tmp_path / "run.json", tmp_path / "run.ddptui"
    r = run_cli("run", "--headless", "--auto", "--nproc-per-node", "2", "--record", str(rec),
                "--json", str(out), "--", os.path.join(ROOT, "examples", script),
                "--steps", str(STEPS), *script_args, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_leftovers()
    return json.loads(out.read_text()), rec


def _per_step(rec):
    """(rank, step) -> {kind: {layer index: (first start µs, last end µs)}} and COMM counts."""
    spans: dict = defaultdict(lambda: defaultdict(dict))
    comms: dict = defaultdict(int)
    for _, f in Reader(str(rec)):
        if f.get("t") != "spans":
            continue
        b = decode_spans(f)
        for kind, idx, t0, t1 in zip(b.kind, b.idx, b.t0, b.t1):
            if kind == COMM:
                comms[(b.rank, b.step)] += 1
            elif kind in (FWD, BWD, OPT, STEP):
                spans[(b.rank, b.step)][kind][idx] = (t0, t1)
    return spans, comms


def _check(doc, rec, layers, params, first_bucket_has, no_backward=()):
    assert doc["layers"] == layers  # >= 4 named blocks, in the order the forward pass runs them
    s = doc["strategies"][0]
    assert s["strategy"] == "ddp" and s["steps"] == STEPS and doc["world_size"] == 2
    buckets = s["buckets"]
    names = [p for b in buckets for p in b["params"]]
    assert sorted(names) == sorted(params)  # every parameter in exactly one bucket, by name
    assert first_bucket_has in buckets[0]["params"]  # DDP fills buckets from the last layer back
    assert [b["bytes"] for b in buckets] == s["ddp_reported"]
    spans, comms = _per_step(rec)
    assert {r for r, _ in spans} == {0, 1}
    assert len(spans) == 2 * STEPS
    for key, by_kind in spans.items():
        # every block timed forward and backward, every step, on both ranks
        assert sorted(by_kind[FWD]) == list(range(len(layers))), key
        assert sorted(by_kind[BWD]) == [i for i, n in enumerate(layers) if n not in no_backward], key
        starts = [by_kind[FWD][i][0] for i in range(len(layers))]
        assert starts == sorted(starts), (key, starts)  # forward order
        # the optimizer's span: its update, after the backward, inside the step (under
        # Lightning the forward and backward run inside optimizer.step(closure))
        (o0, o1), = by_kind[OPT].values()
        (s0, s1), = by_kind[STEP].values()
        assert max(t1 for _, t1 in by_kind[BWD].values()) <= o0 <= o1 <= s1, key
        if key[1] > 0:  # (DDP's first step runs on its initial bucket assignment; it rebuilds after it)
            assert comms[key] == len(buckets), key  # one AllReduce per bucket per step


@pytest.mark.slow
def test_lightning_trainer_ddp_opened_into_blocks(tmp_path):
    pytest.importorskip("lightning", reason="Lightning is a test-only extra: pip install -e .[frameworks]")
    import sys
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        from train_lightning import LanguageModel
    finally:
        sys.path.pop(0)
    params = ["model." + n for n, _ in LanguageModel().model.named_parameters()]
    doc, rec = _run(tmp_path, "train_lightning.py")
    layers = ["model.embedding", "model.pos_encoder", "model.transformer.encoder",
              "model.transformer.decoder", "model.decoder"]
    _check(doc, rec, layers, params, "model.decoder.weight")
    assert len(doc["strategies"][0]["buckets"]) >= 2


@pytest.mark.slow
def test_hf_causal_lm_plain_ddp_opened_into_decoder_layers(tmp_path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is a test-only extra: pip install -e .[frameworks]")
    import torch
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=64)
    params = [n for n, _ in transformers.LlamaForCausalLM(cfg).named_parameters()]
    doc, rec = _run(tmp_path, "train_hf_causal_lm.py")
    layers = (["model.embed_tokens", "model.rotary_emb"] + [f"model.layers.{i}" for i in range(4)]
              + ["model.norm", "lm_head"])
    # rotary_emb turns positions into cos/sin: nothing in it needs a gradient, so no backward
    _check(doc, rec, layers, params, "lm_head.weight", no_backward={"model.rotary_emb"})
    assert len(doc["strategies"][0]["buckets"]) >= 3
