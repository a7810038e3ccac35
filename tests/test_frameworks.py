"""Frameworks' models under `ddptui run --auto`, unchanged scripts: the models people train,
opened into their blocks (`ranks.scripts.userlayers.auto_layers`), with the global batch read from
their inputs.

The layer choice alone, on models built from configs (nothing downloaded): BERT, RoBERTa,
DistilBERT, T5, BART, Whisper, GPT-2, Llama, Mixtral, ViT, Swin, ConvNeXt, a ResNet (Hugging
Face's: torchvision cannot be installed beside the CPU torch these tests run on) and a
Lightning-wrapped BERT. Real 2-rank runs where they add something: Hugging Face's `Trainer`
fine-tuning a BERT with gradient accumulation (its DDP made by the Trainer, its inputs keyword
arguments), the same script's `accelerate` loop, a T5 in a plain DDP loop (encoder and
decoder blocks in the order they run, the shared embedding it never calls not drawn), a Llama
in a plain loop, Lightning's Trainer. Lightning, transformers and accelerate are test-only
extras (`pip install -e .[frameworks]`): each test skips with the reason when its library is
absent."""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from ranks.wire import BWD, COMM, FWD, OPT, STEP

from .helpers import ROOT, assert_no_leftovers, run_cli, step_batches

STEPS = 6
WHY = "is a test-only extra: pip install -e .[frameworks]"


def _run(tmp_path, script, *script_args, steps=STEPS):
    from ddptui.recording.loader import load
    out, rec = tmp_path / "run.json", tmp_path / "run.ddptui"
    r = run_cli("run", "--headless", "--auto", "--nproc-per-node", "2", "--record", str(rec),
                "--json", str(out), "--", script, "--steps", str(steps), *script_args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_leftovers()
    return json.loads(out.read_text()), load(str(rec)), r.stdout


def _per_step(got):
    """(rank, step) -> {kind: {layer index: [(start, end) per span]}} and COMM counts."""
    spans: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    comms: dict = defaultdict(int)
    for k, ranks in step_batches(got).items():
        for r, b in ranks.items():
            for kind, idx, t0, t1 in zip(b.kind, b.idx, b.t0, b.t1):
                if kind == COMM:
                    comms[(r, k)] += 1
                elif kind in (FWD, BWD, OPT, STEP):
                    spans[(r, k)][kind][idx].append((t0, t1))
    return spans, comms


def _check(doc, got, layers, params, first_bucket_has, no_backward=(), steps=STEPS, micro=1):
    assert doc["layers"] == layers  # the model's blocks, in the order the forward pass runs them
    s = doc["strategies"][0]
    assert s["strategy"] == "ddp" and s["steps"] == steps and doc["world_size"] == 2
    buckets = s["buckets"]
    names = [p for b in buckets for p in b["params"]]
    assert sorted(names) == sorted(params)  # every parameter in exactly one bucket, by name
    assert first_bucket_has in buckets[0]["params"]  # DDP fills buckets from the last layer back
    assert [b["bytes"] for b in buckets] == s["ddp_reported"]
    spans, comms = _per_step(got)
    assert {r for r, _ in spans} == {0, 1}
    assert len(spans) == 2 * steps
    for key, by_kind in spans.items():
        # every block timed forward and backward, once a micro-step, every step, on both ranks
        assert sorted(by_kind[FWD]) == list(range(len(layers))), key
        assert all(len(v) == micro for v in by_kind[FWD].values()), key
        assert sorted(by_kind[BWD]) == [i for i, n in enumerate(layers) if n not in no_backward], key
        for m in range(micro):
            starts = [by_kind[FWD][i][m][0] for i in range(len(layers))]
            assert starts == sorted(starts), (key, m, starts)  # forward order
        # the optimizer's span: its update, after the backward, inside the step (under
        # Lightning the forward and backward run inside optimizer.step(closure))
        (o0, o1), = (x for v in by_kind[OPT].values() for x in v)
        (_s0, s1), = (x for v in by_kind[STEP].values() for x in v)
        assert max(t1 for v in by_kind[BWD].values() for _, t1 in v) <= o0 <= o1 <= s1, key
        if key[1] > 0:  # (DDP's first step runs on its initial bucket assignment; it rebuilds after it)
            assert comms[key] == len(buckets), key  # one AllReduce per bucket per step


def _batch(doc, stdout, batch):
    """The global batch read from the inputs, and samples/s made of it."""
    s = doc["strategies"][0]
    assert doc["batch"] == batch and doc["batch_from"] == "inputs"
    assert s["samples_per_s"] == pytest.approx(batch / (s["step_ms_median"] / 1e3), rel=1e-6)
    assert f"global batch {batch}" in stdout


# -- the choice alone ------------------------------------------------------------------------
def _configs(T):
    """family -> (a model built from a small config, the layers auto chooses)."""
    def seq(prefix, n):
        return [f"{prefix}.{i}" for i in range(n)]
    kw = {"vocab_size": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return {
        "bert": (lambda: T.BertForSequenceClassification(T.BertConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, **kw)),
            ["bert.embeddings", *seq("bert.encoder.layer", 4), "bert.pooler", "classifier"]),
        "roberta": (lambda: T.RobertaForMaskedLM(T.RobertaConfig(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, **kw)),
            ["roberta.embeddings", *seq("roberta.encoder.layer", 3), "lm_head"]),
        "distilbert": (lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(
            dim=32, n_layers=3, n_heads=2, hidden_dim=64, vocab_size=256, pad_token_id=0)),
            ["distilbert.embeddings", *seq("distilbert.transformer.layer", 3), "pre_classifier", "classifier"]),
        # (T5's `shared` is a layer here; a run never calls it and does not draw it: test_t5_*)
        "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(
            d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=3, num_heads=4,
            decoder_start_token_id=0, **kw)),
            ["shared", "encoder.embed_tokens", *seq("encoder.block", 3), "encoder.final_layer_norm",
             "decoder.embed_tokens", *seq("decoder.block", 3), "decoder.final_layer_norm", "lm_head"]),
        "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, **kw)),
            ["model.shared", "model.encoder.embed_tokens", "model.encoder.embed_positions",
             *seq("model.encoder.layers", 2), "model.encoder.layernorm_embedding",
             "model.decoder.embed_tokens", "model.decoder.embed_positions", *seq("model.decoder.layers", 2),
             "model.decoder.layernorm_embedding", "lm_head"]),
        "whisper": (lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=16, max_target_positions=16, decoder_start_token_id=3, **kw)),
            ["model.encoder.conv1", "model.encoder.conv2", "model.encoder.embed_positions",
             *seq("model.encoder.layers", 2), "model.encoder.layer_norm", "model.decoder.embed_tokens",
             "model.decoder.embed_positions", *seq("model.decoder.layers", 2), "model.decoder.layer_norm",
             "proj_out"]),
        "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=3, n_head=2, n_positions=64, **kw)),
                 ["transformer.wte", "transformer.wpe", *seq("transformer.h", 3), "transformer.ln_f", "lm_head"]),
        "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, **kw)),
            ["model.embed_tokens", *seq("model.layers", 3), "model.norm", "lm_head"]),
        # a mixture of experts: each decoder layer (its router and experts inside) one block
        "mixtral": (lambda: T.MixtralForCausalLM(T.MixtralConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, **kw)),
            ["model.embed_tokens", *seq("model.layers", 2), "model.norm", "lm_head"]),
        "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(
            image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
            intermediate_size=64)),
            ["vit.embeddings", *_vit_layers(T), "vit.layernorm", "classifier"]),
        # stages: each stage's blocks, its downsampling beside them
        "swin": (lambda: T.SwinForImageClassification(T.SwinConfig(
            image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2],
            window_size=2)),
            ["swin.embeddings", "swin.encoder.layers.0.blocks.0", "swin.encoder.layers.0.downsample",
             "swin.encoder.layers.1.blocks.0", "swin.encoder.layers.1.downsample",
             *seq("swin.encoder.layers.2.blocks", 2), "swin.encoder.layers.2.downsample",
             "swin.encoder.layers.3.blocks.0", "swin.layernorm", "classifier"]),
        "convnext": (lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
            hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 2, 1])),
            ["convnext.embeddings", "convnext.encoder.stages.0.layers.0",
             "convnext.encoder.stages.1.downsampling_layer", "convnext.encoder.stages.1.layers.0",
             "convnext.encoder.stages.2.downsampling_layer", *seq("convnext.encoder.stages.2.layers", 2),
             "convnext.encoder.stages.3.downsampling_layer", "convnext.encoder.stages.3.layers.0",
             "convnext.layernorm", "classifier"]),
        # every bottleneck (its own convolutions, a Sequential of one type, stay inside it)
        "resnet": (lambda: T.ResNetForImageClassification(T.ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[2, 1, 3, 1])),
            ["resnet.embedder", *seq("resnet.encoder.stages.0.layers", 2), "resnet.encoder.stages.1.layers.0",
             *seq("resnet.encoder.stages.2.layers", 3), "resnet.encoder.stages.3.layers.0", "classifier"]),
    }


def _vit_layers(T):
    # (transformers 5 holds ViT's blocks in `vit.layers`, 4 in `vit.encoder.layer`)
    m = T.ViTModel(T.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=3,
                               num_attention_heads=2, intermediate_size=64))
    at = "vit.layers" if hasattr(m, "layers") else "vit.encoder.layer"
    return [f"{at}.{i}" for i in range(3)]


FAMILIES = ("bert", "roberta", "distilbert", "t5", "bart", "whisper", "gpt2", "llama", "mixtral",
            "vit", "swin", "convnext", "resnet")


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_opens_each_family_to_its_blocks(family):
    T = pytest.importorskip("transformers", reason=f"transformers {WHY}")
    from ranks.scripts.userlayers import choose_layers
    make, want = _configs(T)[family]
    assert [n for n, _ in choose_layers(make())] == want


def test_auto_opens_a_lightning_wrapped_model_to_its_blocks():
    T = pytest.importorskip("transformers", reason=f"transformers {WHY}")
    L = pytest.importorskip("lightning", reason=f"Lightning {WHY}")
    from ranks.scripts.userlayers import choose_layers
    make, want = _configs(T)["bert"]

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make()

    assert [n for n, _ in choose_layers(Classifier())] == [f"net.{n}" for n in want]


# -- real runs -------------------------------------------------------------------------------
def _bert_params(layers=4):
    import sys
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        from train_hf_trainer import model
    finally:
        sys.path.pop(0)
    return [n for n, _ in model(layers).named_parameters()]


BERT_LAYERS = ["bert.embeddings", *(f"bert.encoder.layer.{i}" for i in range(4)), "bert.pooler", "classifier"]


@pytest.mark.slow
def test_hf_trainer_bert_with_accumulation_opened_into_encoder_layers(tmp_path):
    """The issue's run: a BERT fine-tuned by HF's Trainer (its own DDP, through accelerate),
    gradient accumulation 2, 12 optimizer steps: the 4 encoder layers one lane each, 12 steps
    of two micro-steps, the global batch 4 x 2 x 2 ranks = 16 from the inputs (keyword
    arguments: input_ids, attention_mask, labels)."""
    pytest.importorskip("transformers", reason=f"transformers {WHY}")
    pytest.importorskip("accelerate", reason=f"accelerate {WHY}")
    doc, got, stdout = _run(tmp_path, os.path.join(ROOT, "examples", "train_hf_trainer.py"),
                            "--out", str(tmp_path / "out"), steps=12)
    _check(doc, got, BERT_LAYERS, _bert_params(), "classifier.weight", steps=12, micro=2)
    _batch(doc, stdout, 16)


@pytest.mark.slow
def test_accelerate_loop_same_script(tmp_path):
    """The same script's plain accelerate loop (Accelerator.prepare's DDP, accumulate()'s
    no_sync, backward()): the same layers, steps and batch."""
    pytest.importorskip("transformers", reason=f"transformers {WHY}")
    pytest.importorskip("accelerate", reason=f"accelerate {WHY}")
    doc, got, stdout = _run(tmp_path, os.path.join(ROOT, "examples", "train_hf_trainer.py"),
                            "--loop", "accelerate", steps=4)
    _check(doc, got, BERT_LAYERS, _bert_params(), "classifier.weight", steps=4, micro=2)
    _batch(doc, stdout, 16)


@pytest.mark.slow
def test_t5_plain_ddp_encoder_and_decoder_blocks_in_the_order_they_run(tmp_path):
    """An encoder-decoder: every encoder block, then every decoder block; `shared` (its weight
    each stack's embed_tokens', never called itself) is not drawn; batch 4 a rank."""
    T = pytest.importorskip("transformers", reason=f"transformers {WHY}")
    doc, got, stdout = _run(tmp_path, os.path.join(ROOT, "tests", "scripts", "seq2seq.py"))
    layers = (["encoder.embed_tokens"] + [f"encoder.block.{i}" for i in range(3)] + ["encoder.final_layer_norm",
              "decoder.embed_tokens"] + [f"decoder.block.{i}" for i in range(3)]
              + ["decoder.final_layer_norm", "lm_head"])
    cfg = T.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_decoder_layers=3,
                     num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    params = [n for n, _ in T.T5ForConditionalGeneration(cfg).named_parameters()]
    spans, _ = _per_step(got)
    nobwd = {n for i, n in enumerate(layers) if i not in spans[(0, 1)][BWD]}
    assert nobwd <= {"decoder.embed_tokens"}, nobwd  # (the tied weight's end marks encoder's)
    _check(doc, got, layers, params, params[-1] if params[-1] != "shared.weight" else "lm_head.weight",
           no_backward=nobwd)
    _batch(doc, stdout, 8)


@pytest.mark.slow
def test_lightning_trainer_ddp_opened_into_blocks(tmp_path):
    pytest.importorskip("lightning", reason=f"Lightning {WHY}")
    import sys
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        from train_lightning import LanguageModel
    finally:
        sys.path.pop(0)
    params = ["model." + n for n, _ in LanguageModel().model.named_parameters()]
    doc, got, stdout = _run(tmp_path, os.path.join(ROOT, "examples", "train_lightning.py"))
    layers = (["model.embedding"] + [f"model.transformer.encoder.layers.{i}" for i in range(2)]
              + ["model.transformer.encoder.norm"] + [f"model.transformer.decoder.layers.{i}" for i in range(2)]
              + ["model.transformer.decoder.norm", "model.decoder"])
    _check(doc, got, layers, params, "model.decoder.weight")
    assert len(doc["strategies"][0]["buckets"]) >= 2
    _batch(doc, stdout, 32)  # 16 a rank: the first tensor of the (x, y) batch Lightning hands on


@pytest.mark.slow
def test_hf_causal_lm_plain_ddp_opened_into_decoder_layers(tmp_path):
    transformers = pytest.importorskip("transformers", reason=f"transformers {WHY}")
    import torch
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=64)
    params = [n for n, _ in transformers.LlamaForCausalLM(cfg).named_parameters()]
    doc, got, stdout = _run(tmp_path, os.path.join(ROOT, "examples", "train_hf_causal_lm.py"))
    # (rotary_emb, which turns positions into cos/sin, holds no parameters: no layer)
    layers = ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(4)] + ["model.norm", "lm_head"]
    _check(doc, got, layers, params, "lm_head.weight")
    assert len(doc["strategies"][0]["buckets"]) >= 3
    _batch(doc, stdout, 16)
