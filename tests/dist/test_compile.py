"""torch.compile(ddpviz's DDP): the same parameters as eager after a few SGD steps, on 2 gloo
ranks, and torch's DDP compiled the same way for reference.

Tolerance: compiled code (inductor, CPU) fuses and reorders float32 arithmetic in forward and
backward, so compiled and eager differ by rounding; after 3 SGD steps (lr 0.1) of a 2-layer MLP
every parameter must agree with eager within rtol=1e-5, atol=1e-6. Across the ranks the compiled
replicas must stay bitwise identical (the gradients are still averaged by the reducer).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(ddp: nn.Module, rank: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


def _compiled_vs_eager(rank: int, world_size: int) -> dict[str, Any]:
    import torch._dynamo

    from ddpviz import DistributedDataParallel

    out: dict[str, Any] = {}
    for engine, cls in (("ddpviz", DistributedDataParallel),
                        ("torch", nn.parallel.DistributedDataParallel)):
        eager = _train(cls(_model()), rank)
        torch._dynamo.reset()
        ddp = cls(_model())
        compiled = _train(torch.compile(ddp, backend="inductor"), rank)
        out[engine] = {
            "close": all(torch.allclose(c, e, rtol=1e-5, atol=1e-6)
                         for c, e in zip(compiled, eager, strict=True)),
            "max_diff": max(float((c - e).abs().max()) for c, e in zip(compiled, eager,
                                                                         strict=True)),
            "params": [c.tolist() for c in compiled],
            "moved": any(not torch.equal(c, p) for c, p in zip(compiled,
                                                                _model().parameters(),
                                                                strict=True)),
        }
    return out


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    return run_ranks(_compiled_vs_eager, 2, timeout=280)


@pytest.mark.timeout(300)
def test_compiled_ddpviz_matches_eager_within_tolerance(results: dict[int, Any]) -> None:
    for rank in (0, 1):
        r = results[rank]["ddpviz"]
        assert r["moved"], "training did not change the parameters"
        assert r["close"], f"rank {rank}: compiled vs eager max |diff| {r['max_diff']}"


def test_compiled_ddpviz_replicas_stay_identical_across_ranks(results: dict[int, Any]) -> None:
    assert results[0]["ddpviz"]["params"] == results[1]["ddpviz"]["params"]


def test_compiled_torch_ddp_reference_behaves_the_same(results: dict[int, Any]) -> None:
    for rank in (0, 1):
        assert results[rank]["torch"]["close"], results[rank]["torch"]["max_diff"]
    assert results[0]["torch"]["params"] == results[1]["torch"]["params"]
