"""Models for the diagnosis scenarios: one defect planted on one rank at a time.

`Net` parameters: a.weight 0, a.bias 1, b.weight 2, b.bias 3, fc.weight 4, fc.bias 5;
buffer: stats. `Branchy` adds the runtime defects (unused branch, checkpointing twice, a graph
that changes, a rank-dependent order of operations, a reassigned buffer).
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint as cp
from torch import nn

MODEL_DEFECTS = ("count", "names", "order", "shape", "stride", "dtype", "device",
                 "requires_grad", "buffer_count", "buffer_shape", "buffer_dtype",
                 "initial_values")


class Net(nn.Module):
    def __init__(self, defect: str = "none") -> None:
        super().__init__()
        d = defect
        self.register_buffer("stats", torch.zeros(
            4 if d == "buffer_shape" else 3,
            dtype=torch.float64 if d == "buffer_dtype" else torch.float32))
        if d == "buffer_count":
            self.register_buffer("extra_stats", torch.zeros(2))
        a, b = nn.Linear(8, 8), nn.Linear(8, 8)
        if d == "order":  # same shapes, so torch cannot see it
            self.b = b
            self.a = a
        else:
            self.a = a
            self.b = b
        fc = nn.Linear(8, 5 if d == "shape" else 4)
        self.add_module("head" if d == "names" else "fc", fc)
        if d == "count":
            self.extra = nn.Linear(4, 4)
        if d == "stride":  # same shape, transposed memory layout
            self.a.weight = nn.Parameter(self.a.weight.detach().t().contiguous().t())
        if d == "dtype":
            fc.to(torch.float64)
        if d == "device":
            fc.to("meta")
        if d == "requires_grad":
            fc.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.fc if hasattr(self, "fc") else self.head
        return head(self.a(x) + self.b(x))


class Branchy(nn.Module):
    """a -> b -> fc, plus `spare` (used only by some defects). Parameters: a.weight 0,
    a.bias 1, b.weight 2, b.bias 3, spare.weight 4, spare.bias 5, fc.weight 6, fc.bias 7."""

    def __init__(self, defect: str = "none") -> None:
        super().__init__()
        self.defect = defect
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 4)
        self.register_buffer("stats", torch.zeros(8))
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.defect
        h = self.a(x)
        if d == "unused":  # spare never used on this rank
            out = self.fc(self.b(h))
        elif d == "twice":  # reentrant checkpoints each run their own backward through b
            out = self.fc(cp.checkpoint(self.b, h, use_reentrant=True)
                          + cp.checkpoint(self.b, h, use_reentrant=True) + self.spare(h))
        elif d == "graph_change":  # spare joins the graph from step 1 on
            out = self.fc(self.b(h) + (self.spare(h) if self.step >= 1 else 0))
        elif d == "graph_static":  # the same rank's graph in iteration 0, on other ranks
            out = self.fc(self.b(h))
        elif d == "order":  # spare's branch is built first: its gradients come last
            s = self.spare(h)
            out = self.fc(s + self.b(h))
        else:
            out = self.fc(self.b(h) + self.spare(h))
        if d == "reassign":  # a new tensor instead of an in-place update
            self.stats = self.stats * 0.9 + h.detach().mean(0)
        elif self.training:
            with torch.no_grad():
                self.stats.mul_(0.9).add_(h.detach().mean(0))
        self.step += 1
        return out
