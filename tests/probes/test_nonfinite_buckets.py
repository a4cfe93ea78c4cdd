"""The every-step NaN check's hook (probes/nonfinite_buckets.py) on a real backward: small
gradients flattened together, large ones summed in place, a NaN in either named, and a check
that fails stepping aside without touching the backward."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from ddpviz.probes import nonfinite_buckets
from ddpviz.probes.nonfinite_buckets import BucketCheck, _total


class _Check:
    def __init__(self) -> None:
        self.bad: list[tuple[int, list[int]]] = []
        self.checked: list[tuple[int, bool | None]] = []

    def local_grads(self, step: int, indices: list[int]) -> None:
        self.bad.append((step, list(indices)))

    def step_checked(self, step: int, loss: bool | None, every: int = 1, cost_ns: int = 0,
                     step_ns: int = 0) -> None:
        self.checked.append((step, loss))
        self.every = every


def _hooked(model: nn.Module) -> tuple[BucketCheck, _Check, Any]:
    params = list(model.parameters())
    check = _Check()
    owner = SimpleNamespace(_armed=[], tap=SimpleNamespace(step=0))
    bc = BucketCheck(check, params, owner, views=False)  # type: ignore[arg-type]
    bc.learn([list(range(len(params)))], list(range(len(params)))[::-1])
    bc.apply()
    return bc, check, owner


def _train(model: nn.Module, bc: BucketCheck, owner: Any, x: torch.Tensor, steps: int) -> None:
    """`steps` steps of forward (its output to the check) and backward, as the watch drives it."""
    for step in range(steps):
        owner.tap.step = step
        out = model(x)
        bc.output(step, out)
        out.square().mean().backward()
        model.zero_grad()


@pytest.mark.parametrize("where", ["small", "large"])
def test_a_nan_in_a_small_or_a_large_gradient_is_named_at_its_step(where: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 300), nn.Linear(300, 4))  # 90,000 > _SMALL elements
    assert model[0].weight.numel() > nonfinite_buckets._SMALL >= model[1].weight.numel()
    bc, check, owner = _hooked(model)
    target = model[0].weight if where == "large" else model[1].weight
    index = [p is target for p in model.parameters()].index(True)
    target.register_hook(lambda g: g * float("nan") if owner.tap.step == 2 else None)
    _train(model, bc, owner, torch.randn(5, 300), 4)
    assert check.bad == [(2, [index])]
    assert check.checked == [(0, False), (1, False), (2, False), (3, False)]
    bc.close()


def test_total_is_finite_only_when_every_element_is() -> None:
    grads = [torch.randn(300, 300), torch.randn(8), torch.randn(70_000, dtype=torch.bfloat16)]
    assert math.isfinite(_total(grads))
    grads[2][5] = float("inf")
    assert not math.isfinite(_total(grads))
    assert not math.isfinite(_total([torch.randn(8), torch.full((3,), 3e38)]))  # overflow


def test_a_check_that_fails_steps_aside_and_the_backward_runs_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    reference = nn.Linear(4, 4)
    reference.load_state_dict(model.state_dict())
    bc, _, _ = _hooked(model)
    bc._members = [[0, 1, 7]]  # (a broken plan: index 7 does not exist)
    x = torch.randn(3, 4)
    model(x).sum().backward()
    reference(x).sum().backward()
    assert bc.closed
    assert "the every-step NaN check failed" in capsys.readouterr().err
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)  # type: ignore[arg-type]
    model(x).sum().backward()  # (steps aside for good: silent)
    assert capsys.readouterr().err == ""
    bc.close()


def test_a_float64_output_beyond_fp32s_range_is_finite() -> None:
    # a float64 model whose output sums to ~1e39 (finite in fp64, Inf in fp32): loss finite
    model = nn.Linear(4, 2).double()
    bc, check, _ = _hooked(model)
    with torch.no_grad():
        model.weight.fill_(1.0)
    out = model(torch.full((3, 4), 1e38, dtype=torch.float64))
    assert math.isfinite(out.sum().item()) and not math.isfinite(out.sum().float().item())
    bc.output(0, out)
    (out * 1e-40).sum().backward()
    assert check.checked == [(0, False)] and check.bad == []
    bc.close()


def test_on_steps_too_short_for_it_the_check_runs_every_few_steps_and_claims_only_those(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # See [Note: the check's budget]: a check that costs more than its share of the step runs
    # on every step of the warmup, then on the multiples of `every`; a NaN on a skipped step is not
    # reported by this check (the composed finding says what was not checked), one on a
    # checked step is
    from ddpviz.probes import check_budget

    monkeypatch.setattr(check_budget, "WARMUP", 8)
    monkeypatch.setattr(check_budget, "WINDOW", 8)
    monkeypatch.setattr(check_budget, "SHARE", 1e-9)  # (any real check is too costly: capped)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    bc, check, owner = _hooked(model)
    bc.budget = check_budget.CheckBudget()
    bad_steps = {12, 32}  # 12: skipped; 32: checked (a multiple of the period, 32)
    model[1].weight.register_hook(
        lambda g: g * float("nan") if owner.tap.step in bad_steps else None)
    _train(model, bc, owner, torch.randn(3, 4), 40)
    every = check_budget.MAX_EVERY
    assert bc.budget.every == every and check.every == every
    assert every == 32 and [s for s, _ in check.checked] == [*range(8), 32]
    assert check.bad == [(32, [2])]
    bc.close()
