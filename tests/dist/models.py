"""The zoo of small models the engine tests train under torch's DDP and ddpviz's.

Each covers one thing DDP treats specially: several buckets (MLP, over 1 MiB so the default
rebuild splits it), buffers synced from rank 0 (CNN with BatchNorm), a parameter shared by two
modules (tied LM head), sparse gradients (nn.Embedding(sparse=True)), two dtypes in one model
(fp32 and bf16 layers). Every model has a small `aux` head used only when the forward's `use_aux`
is True, so find_unused_parameters has a genuinely unused branch to find. Inputs are derived
from (seed, rank, step) alone, so two implementations in one process see identical batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Three Linear layers; the middle weight alone is 1 MiB, so the default rebuild's
    1 MiB first bucket closes after it and the map has two buckets."""

    def __init__(self, d_in: int = 32, hidden: int = 512, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)
        self.aux = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        out = self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
        return out + self.aux(x) if use_aux else out


class ConvBN(nn.Module):
    """Two conv + BatchNorm blocks: running stats and num_batches_tracked are buffers."""

    def __init__(self, channels: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, classes)
        self.aux = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        pooled = h.mean(dim=(2, 3))
        out = self.head(pooled)
        return out + self.aux(pooled) if use_aux else out


class TiedLM(nn.Module):
    """A token model whose output projection is the embedding matrix (one parameter, two
    modules: DDP must register it once)."""

    def __init__(self, vocab: int = 48, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight
        self.aux = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        h = torch.tanh(self.mix(self.embed(tokens)))
        out = self.lm_head(h)
        return out + self.aux(h) if use_aux else out


class SparseEmbed(nn.Module):
    """nn.Embedding(sparse=True) feeding a Linear: the embedding's gradient is sparse and gets
    a bucket of its own."""

    def __init__(self, vocab: int = 64, dim: int = 16, d_out: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, sparse=True)
        self.proj = nn.Linear(dim, d_out)
        self.aux = nn.Linear(dim, d_out)

    def forward(self, tokens: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        h = self.embed(tokens).mean(dim=1)
        out = self.proj(h)
        return out + self.aux(h) if use_aux else out


class MixedPrecision(nn.Module):
    """fp32 and bf16 layers interleaved: buckets are keyed by dtype, so each dtype walks the
    limits on its own and partly filled buckets come out in unordered_map order."""

    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, hidden)
        self.mid1 = nn.Linear(hidden, hidden).to(torch.bfloat16)
        self.mid2 = nn.Linear(hidden, hidden)
        self.mid3 = nn.Linear(hidden, hidden).to(torch.bfloat16)
        self.out = nn.Linear(hidden, d_out)
        self.aux = nn.Linear(d_in, d_out).to(torch.bfloat16)

    def forward(self, x: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = torch.relu(self.mid1(h.to(torch.bfloat16))).float()
        h = torch.relu(self.mid2(h))
        h = torch.relu(self.mid3(h.to(torch.bfloat16))).float()
        out = self.out(h)
        return out + self.aux(x.to(torch.bfloat16)).float() if use_aux else out


class Batch(NamedTuple):
    """One rank's inputs for one step."""

    inputs: torch.Tensor  # first forward argument
    target: torch.Tensor  # what the loss compares the output with


def _dense_batch(shape: tuple[int, ...], d_out: int) -> Callable[[torch.Generator], Batch]:
    def make(g: torch.Generator) -> Batch:
        return Batch(torch.randn(shape, generator=g), torch.randn(shape[0], d_out, generator=g))
    return make


def _token_batch(vocab: int, batch: int, seq: int, d_out: int | None
                 ) -> Callable[[torch.Generator], Batch]:
    def make(g: torch.Generator) -> Batch:
        tokens = torch.randint(vocab, (batch, seq), generator=g)
        if d_out is None:  # language model: predict the next token
            return Batch(tokens, torch.roll(tokens, -1, dims=1))
        return Batch(tokens, torch.randn(batch, d_out, generator=g))
    return make


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), target)


def _next_token(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


@dataclass(frozen=True)
class ZooModel:
    """A model of the zoo with its data and loss."""

    name: str
    factory: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], Batch]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def build(self, seed: int) -> nn.Module:
        """A fresh instance whose initial values depend on `seed` only."""
        torch.manual_seed(seed)
        return self.factory()

    def batch(self, seed: int, rank: int, step: int) -> Batch:
        """Rank `rank`'s batch at `step`: the same in every process that asks."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 1_009 + step)
        return self.make_batch(g)

    def loss(self, model: Any, batch: Batch, use_aux: bool = True) -> torch.Tensor:
        """Forward `batch` through `model` (a module or a DDP wrapper) and return the loss."""
        return self.loss_fn(model(batch.inputs, use_aux), batch.target)


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("mlp", MLP, _dense_batch((8, 32), 10), _mse),
        ZooModel("cnn_bn", ConvBN, _dense_batch((4, 3, 8, 8), 4), _mse),
        ZooModel("tied_lm", TiedLM, _token_batch(48, 4, 6, None), _next_token),
        ZooModel("sparse_embed", SparseEmbed, _token_batch(64, 6, 5, 8), _mse),
        ZooModel("mixed_bf16", MixedPrecision, _dense_batch((8, 16), 8), _mse),
    )
}
