"""Built-in example models for the demo, the notebooks and `ddpviz buckets ddpviz.zoo:NAME`.

Each factory takes no required argument and returns `(module, example_inputs)`, so the planner
can measure the real gradient-ready order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TinyTransformer(nn.Module):
    """A 2-layer encoder language model with its LM head tied to the embedding."""

    def __init__(self, vocab: int = 2000, d_model: int = 128, n_layers: int = 2,
                 n_heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-style: sane logits with a tied head
        self.pos = nn.Parameter(torch.zeros(64, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: DDP reduces it once

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(x)))


def tiny_transformer() -> tuple[nn.Module, Any]:
    """TinyTransformer (about 1.4M parameters, 27 tensors) and a batch of tokens."""
    torch.manual_seed(0)
    return TinyTransformer(), torch.randint(0, 2000, (2, 16))


def mlp(width: int = 512, depth: int = 4) -> tuple[nn.Module, Any]:
    """A plain MLP: the textbook case (last layer's gradients ready first, bias before weight)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)), torch.randn(4, width)


def mixed_precision_mlp() -> tuple[nn.Module, Any]:
    """An MLP whose head runs in bfloat16: buckets split by dtype."""

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512))
            self.head = nn.Linear(512, 64).to(torch.bfloat16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x).to(torch.bfloat16)).float()

    torch.manual_seed(0)
    return Mixed(), torch.randn(4, 256)


def convnet() -> tuple[nn.Module, Any]:
    """A small CNN with BatchNorm (buffers synced from rank 0 every forward)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    return net, torch.randn(2, 3, 16, 16)
