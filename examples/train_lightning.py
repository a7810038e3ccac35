"""Lightning's DDP on CPU: Lightning's demo Transformer on random tokens, a script that knows
nothing of ddptui. Needs `pip install lightning`.

    ddptui run --auto --nproc-per-node 2 -- examples/train_lightning.py --steps 20

--auto times it without a code change: the LightningModule is opened down to the model's
blocks (the embedding, each encoder and decoder layer of its nn.Transformer with their norms,
the output layer; the positional encoding holds no parameters: no layer of its own).
"""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning as L
    from lightning.pytorch.demos import Transformer
except ImportError:
    raise SystemExit("train_lightning.py needs Lightning: pip install lightning")

VOCAB, SEQ, BATCH = 512, 32, 16


class LanguageModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Transformer(vocab_size=VOCAB, ninp=128, nhead=4, nhid=256, nlayers=2)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.nll_loss(self.model(x, y), y.view(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--devices", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (a.steps * BATCH * a.devices, SEQ + 1))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=BATCH)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=a.devices, max_steps=a.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LanguageModel(), data)


if __name__ == "__main__":
    main()
