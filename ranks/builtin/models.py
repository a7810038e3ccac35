"""The seeds' MLPs: Linear+ReLU blocks named fc1..fcN (the last block has no ReLU)."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from ranks.spec import MODEL_WIDTHS

N_FEATURES, N_CLASSES = 784, 10


def build_model(name: str, seed: int = 42) -> nn.Sequential:
    widths = MODEL_WIDTHS[name]
    torch.manual_seed(seed)
    blocks = OrderedDict()
    for i in range(len(widths) - 1):
        mods: list[nn.Module] = [nn.Linear(widths[i], widths[i + 1])]
        if i < len(widths) - 2:
            mods.append(nn.ReLU())
        blocks[f"fc{i + 1}"] = nn.Sequential(*mods)
    return nn.Sequential(blocks)


def make_dataset(n_samples: int, seed: int = 42, device="cpu"):
    """Synthetic MNIST-shaped data from a fixed seed (identical on every rank)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, N_FEATURES, generator=g)
    y = torch.randint(0, N_CLASSES, (n_samples,), generator=g)
    return x.to(device), y.to(device)
