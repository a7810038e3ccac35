"""A BERT fine-tuned for sequence classification with Hugging Face's `Trainer` (or a plain
`accelerate` loop), built from a small config (no weights downloaded), gradient
accumulation 2, on random tokens: a script that knows nothing of ddptui. Needs
`pip install transformers accelerate`.

    ddptui run --auto --nproc-per-node 2 -- examples/train_hf_trainer.py --steps 12
    ddptui run --auto --nproc-per-node 2 -- examples/train_hf_trainer.py --loop accelerate

The Trainer wraps the model in DistributedDataParallel itself (through accelerate); --auto
times it without a code change: the model is opened to its encoder layers
(`bert.embeddings`, `bert.encoder.layer.N`, `bert.pooler`, `classifier`), a step is one
optimizer step (its two micro-steps drawn inside it), and the global batch is read from the
inputs (per-device batch x accumulation x ranks).
"""
import argparse

import torch

try:
    from transformers import BertConfig, BertForSequenceClassification
except ImportError:
    raise SystemExit("train_hf_trainer.py needs transformers and accelerate: pip install transformers accelerate")

VOCAB, SEQ = 512, 32


class RandomTokens(torch.utils.data.Dataset):
    """Random token sequences with a label: what a tokenized classification set gives the Trainer."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


def model(layers: int):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=SEQ)
    return BertForSequenceClassification(cfg)


def with_trainer(a) -> None:
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=a.accumulate, learning_rate=1e-4, use_cpu=True,
        ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, seed=0)
    n = a.steps * a.batch * a.accumulate * 2 * 2  # (enough for two ranks, twice over)
    Trainer(model=model(a.layers), args=args, train_dataset=RandomTokens(n)).train()


def with_accelerate(a) -> None:
    from accelerate import Accelerator
    acc = Accelerator(cpu=True, gradient_accumulation_steps=a.accumulate)
    net = model(a.layers)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    data = torch.utils.data.DataLoader(RandomTokens(a.steps * a.batch * a.accumulate * acc.num_processes),
                                       batch_size=a.batch)
    net, opt, data = acc.prepare(net, opt, data)
    net.train()
    for batch in data:
        with acc.accumulate(net):
            acc.backward(net(**batch).loss)
            opt.step()
            opt.zero_grad()
    acc.end_training()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop", choices=("trainer", "accelerate"), default="trainer")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4, help="per device, per micro-step")
    ap.add_argument("--accumulate", type=int, default=2, help="gradient accumulation steps")
    ap.add_argument("--out", default="trainer-out", help="the Trainer's output_dir (nothing is saved)")
    a = ap.parse_args()
    with_trainer(a) if a.loop == "trainer" else with_accelerate(a)


if __name__ == "__main__":
    main()
