"""Gradient averaging across every way DDP copies a gradient into its bucket, against torch.

torch's reducer averages each gradient on its way into the bucket in one of four ways: multiply
by 1/world_size while copying; divide in place when .grad already is the bucket view
(gradient_as_bucket_view with gradients zeroed, not set to None); copy in one batch and divide
the whole bucket (batched_grad_copy); or leave it to a comm hook. A gradient that takes none of
them is summed, not averaged: world_size times too large, silently. The matrix here is
batched_grad_copy x gradient_as_bucket_view x zero_grad(set_to_none=False / True) x
(plain, static_graph, find_unused_parameters) at world size 3, plus bucket_cap_mb_list,
a comm hook on both DDPs, and `watch(recording=Recording(guard=True))` on torch's DDP (whose
own hook redoes the averaging). Each case trains 4 SGD steps and compares, after every synced
backward:
- the gradients BITWISE with torch's DDP on the same inputs (for the watch cases: a watched
  torch DDP with an unwatched one);
- the division explicitly: every gradient against the mean of the ranks' local gradients
  (a plain module copy's backward on the same batch, summed across ranks, divided), within
  float tolerance, and the ratio named when it is not 1.

World size 3 only: there multiplying by 1/3 while copying, dividing in place and dividing the
bucket round differently, and a 3-rank sum depends on its order, so a gradient that takes the
wrong way shows in the bits; at world size 2 (1/2 exact, a + b == b + a) the same ways give the
same bits, and no code path of ddpviz's reducer depends on the world size beyond 1 vs more.
One forkserver run; the tests read its cached results.
"""

from __future__ import annotations

import copy
import functools
import itertools
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 4
SEED = 11
GRAPHS = {"plain": {}, "static_graph": {"static_graph": True},
          "find_unused": {"find_unused_parameters": True}}


class Case(NamedTuple):
    batched: bool
    view: bool
    set_to_none: bool
    graph: str
    path: str = "reducer"  # reducer | cap_list | hook | watch

    @property
    def id(self) -> str:
        return (f"{self.path}-{self.graph}-{'batched' if self.batched else 'per_grad'}-"
                f"{'view' if self.view else 'copy'}-{'none' if self.set_to_none else 'zeroed'}")

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"batched_grad_copy": self.batched,
                              "gradient_as_bucket_view": self.view, **GRAPHS[self.graph]}
        if self.path == "cap_list":
            kw["bucket_cap_mb_list"] = [0.0003, 0.0006, 0.01]
        else:
            kw["bucket_cap_mb"] = 0.0004  # several buckets (400 bytes each)
        return kw


CASES = [Case(b, v, n, g) for b, v, n, g in itertools.product(
    (False, True), (False, True), (False, True), GRAPHS)]
CASES += [Case(True, True, False, g, path) for path in ("cap_list", "hook", "watch")
          for g in GRAPHS]
CASES += [Case(False, True, False, g, "watch") for g in GRAPHS]
CASES += [Case(True, False, True, "plain", "watch"), Case(True, True, True, "plain", "watch")]
BY_ID = {c.id: c for c in CASES}


class Net(nn.Module):
    """Linear - ReLU - Linear with an aux head that rank 1 skips on odd steps (used by some
    rank at every step, so find_unused_parameters reduces it with a zero from rank 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.out(h) + self.aux(h) if use_aux else self.out(h)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED * 1009 + rank * 101 + step)
    return torch.randn(6, 8, generator=g) * (1 + rank), torch.randn(6, 4, generator=g)


def _use_aux(case: Case, rank: int, step: int) -> bool:
    return case.graph != "find_unused" or rank != 1 or step % 2 == 0


def _loss(model: nn.Module, rank: int, step: int, use_aux: bool) -> torch.Tensor:
    x, y = _batch(rank, step)
    return nn.functional.mse_loss(model(x, use_aux), y)


def _mean_local_grads(module: nn.Module, rank: int, step: int,
                      use_aux: bool) -> list[torch.Tensor]:
    """The ranks' mean of a plain copy's gradients on each rank's own batch (float64)."""
    local = copy.deepcopy(module)
    local.zero_grad(set_to_none=True)
    _loss(local, rank, step, use_aux).backward()
    grads = [torch.zeros_like(p, dtype=torch.float64) if p.grad is None else p.grad.double()
             for p in local.parameters()]
    for g in grads:
        dist.all_reduce(g)
    return [g / dist.get_world_size() for g in grads]


class Trained(NamedTuple):
    grads: list[list[torch.Tensor]]  # per step, per parameter, after the synced backward
    division: str | None  # the first gradient that is not the ranks' mean, with its ratio


def _train(ddp_cls: type, case: Case, rank: int, *, watched: bool = False,
           hook: bool = False) -> Trained:
    import ddpviz

    torch.manual_seed(SEED + rank)  # rank-dependent: the constructor's broadcast matters
    module = Net()
    ddp = ddp_cls(module, **case.kwargs())
    if hook:
        ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
    w = (ddpviz.watch(ddp, emitter=lambda e: None, hang_timeout=60,
                      recording=ddpviz.Recording(guard=True)) if watched else None)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    grads: list[list[torch.Tensor]] = []
    division: str | None = None
    try:
        for step in range(STEPS):
            use_aux = _use_aux(case, rank, step)
            expected = _mean_local_grads(module, rank, step, use_aux)
            _loss(ddp, rank, step, use_aux).backward()
            got = [p.grad.clone() for p in module.parameters()]
            grads.append(got)
            for (name, _), g, e in zip(module.named_parameters(), got, expected, strict=True):
                if division is None and not torch.allclose(g.double(), e, rtol=1e-5,
                                                           atol=1e-7):
                    ratio = (g.double().norm() / e.norm()).item()
                    division = (f"step {step} {name}: not the ranks' mean (|grad| / |mean| = "
                                f"{ratio:.4g})")
            opt.step()
            opt.zero_grad(set_to_none=case.set_to_none)
    finally:
        if w is not None:
            w.close()
    return Trained(grads, division)


def _bitwise(ref: Trained, got: Trained) -> str | None:
    for step, (a, b) in enumerate(zip(ref.grads, got.grads, strict=True)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if not torch.equal(x, y):
                ratio = (y.double().norm() / x.double().norm()).item()
                return f"step {step} parameter {i}: differs from torch (|ours| / |torch| = " \
                       f"{ratio:.4g})"
    return None


def _run_case(rank: int, case: Case) -> dict[str, str | None]:
    import ddpviz

    torch_ddp = nn.parallel.DistributedDataParallel
    if case.path == "watch":
        ref = _train(torch_ddp, case, rank)
        got = _train(torch_ddp, case, rank, watched=True)
    else:
        hook = case.path == "hook"
        ref = _train(torch_ddp, case, rank, hook=hook)
        got = _train(ddpviz.DistributedDataParallel, case, rank, hook=hook)
    return {"bitwise": _bitwise(ref, got), "division": got.division,
            "reference_division": ref.division}


def _run_all(rank: int, world_size: int, ids: list[str]) -> dict[str, dict[str, str | None]]:
    out: dict[str, dict[str, str | None]] = {}
    for case_id in ids:
        try:
            out[case_id] = _run_case(rank, BY_ID[case_id])
        except Exception as exc:  # one broken case must not hide the others
            msg = f"raised {type(exc).__name__}: {exc}".splitlines()[0]
            out[case_id] = dict.fromkeys(("bitwise", "division", "reference_division"), msg)
    return out


@functools.cache
def _results(world_size: int) -> dict[int, Any]:
    return run_ranks(_run_all, world_size, [c.id for c in CASES], timeout=300,
                     start_method="forkserver")


def _check(world_size: int, case_id: str, check: str) -> None:
    per_rank = _results(world_size)
    failures = {r: per_rank[r][case_id][check] for r in range(world_size)
                if per_rank[r][case_id][check] is not None}
    assert not failures, f"{case_id} at world size {world_size}: {failures}"


WORLD_SIZE = 3


@pytest.mark.parametrize("case_id", list(BY_ID))
def test_gradients_bitwise_equal_to_torch(case_id: str) -> None:
    _check(WORLD_SIZE, case_id, "bitwise")


@pytest.mark.parametrize("case_id", list(BY_ID))
def test_gradients_are_the_ranks_mean(case_id: str) -> None:
    # torch's own gradients first: the check itself must hold on the reference.
    _check(WORLD_SIZE, case_id, "reference_division")
    _check(WORLD_SIZE, case_id, "division")
