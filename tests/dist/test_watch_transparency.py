"""ddpviz.watch() does not change what torch's DDP computes: a watched torch DDP against an
unwatched twin, in the same gloo processes, BITWISE.

Per case, both DDPs start from the same module (rank-dependent initial values, so the
constructor's broadcast matters), see the same per-rank batches and run one after the other on
the shared process group; after every synced backward their gradients, and after every SGD step
their parameters and buffers, are compared bit for bit (first difference named). The matrix:
world size 3 (where dividing and multiplying by 1/3 differ and a 3-rank sum depends on its
order, both exact at 2; no path of watch depends on the world size beyond 1 vs more), 4 for a
few cases; fp32/bf16/fp16 parameters; no hook / a user comm hook (passed to watch(), registered
before watch(), after it, or torch's built-in ALLREDUCE); gradient_as_bucket_view (with .grad
reset to None and kept, which switch torch between multiply-while-copying and divide-in-place),
static_graph, find_unused_parameters (a branch skipped on some ranks and steps), no_sync,
batched_grad_copy, a sparse embedding. The control case registers torch's allreduce_hook on
the watched side only: it must differ at world size 3 (what watch's old default hook did), which
shows the comparison can fail.

One forkserver run per world size; the tests read its cached results.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from tests.dist.harness import run_ranks
from tests.dist.torch_release import missing
from tests.recordings import recording

pytestmark = pytest.mark.dist

STEPS = 4
SEED = 7


class Case(NamedTuple):
    dtype: str = "float32"
    kwargs: tuple[tuple[str, Any], ...] = ()  # DDP keywords
    hook: str = "none"  # none | arg | before | after | builtin | control
    micro_steps: int = 0  # no_sync micro-steps before each synced one
    skip_aux: bool = False  # the aux branch is skipped on some ranks/steps
    sparse: bool = False
    detail: str = "params"
    manual: bool = False  # require_manual_backward_finalization + finalize_backward() (2.15)

    def missing(self) -> str | None:
        """Why the installed torch cannot run this case (None: it can)."""
        return missing(self.kwargs, self.manual)


def _case(name: str) -> Case:
    return CASES[name]


BASE = {
    "default": Case(),
    "grad_view": Case(kwargs=(("gradient_as_bucket_view", True), ("bucket_cap_mb", 0.0004))),
    "static_graph": Case(kwargs=(("static_graph", True),)),
    "find_unused": Case(kwargs=(("find_unused_parameters", True),), skip_aux=True),
    "no_sync": Case(micro_steps=1),
    "no_sync_grad_view": Case(kwargs=(("gradient_as_bucket_view", True),), micro_steps=1),
}
CASES: dict[str, Case] = {}
for _dtype in ("float32", "bfloat16", "float16"):
    for _name, _base in BASE.items():
        for _hook in ("none", "arg"):
            CASES[f"{_dtype}-{_name}-{_hook}"] = _base._replace(dtype=_dtype, hook=_hook)
CASES.update({
    "float32-default-before": Case(hook="before"),
    "float32-grad_view-before": BASE["grad_view"]._replace(hook="before"),
    "float32-static_graph-before": BASE["static_graph"]._replace(hook="before"),
    "float32-default-after": Case(hook="after"),
    "float32-default-builtin": Case(hook="builtin"),
    "float32-batched": Case(kwargs=(("batched_grad_copy", True),)),
    "float32-batched_grad_view": Case(kwargs=(("batched_grad_copy", True),
                                              ("gradient_as_bucket_view", True))),
    "float32-sparse": Case(sparse=True),
    "float32-find_unused_grad_view": Case(kwargs=(("find_unused_parameters", True),
                                                  ("gradient_as_bucket_view", True)),
                                          skip_aux=True),
    "float32-buckets-detail": Case(detail="buckets"),
    "bfloat16-grad_view-buckets-detail": BASE["grad_view"]._replace(dtype="bfloat16",
                                                                    detail="buckets"),
    "float32-steps-detail": Case(detail="steps"),
    "float16-no_sync-steps-detail": BASE["no_sync"]._replace(dtype="float16", detail="steps",
                                                             hook="arg"),
    "float32-control": Case(hook="control"),
    # watch's default: no comm hook, per-parameter hooks on steps 0-2 (step 3 has none)
    "float32-light-detail": Case(detail="light"),
    "bfloat16-find_unused-light-detail": BASE["find_unused"]._replace(dtype="bfloat16",
                                                                      detail="light", hook="arg"),
    "float32-static_graph-light-detail": BASE["static_graph"]._replace(detail="light"),
    "float32-no_sync_grad_view-light-detail": BASE["no_sync_grad_view"]._replace(detail="light"),
    "float32-sparse-light-detail": Case(sparse=True, detail="light"),
})
# torch 2.15's arguments and manual finalization, with the default recording and the guard
# (which steps aside for lazy buckets as views: tests/dist/test_torch_version_arguments.py);
# skipped, saying why, where the installed torch lacks them
_LAZY = ("lazy_bucket_allocation", True)
_VIEW = ("gradient_as_bucket_view", True)
_BATCHED = ("batched_grad_copy", True)
_CAP = ("bucket_cap_mb", 0.0004)
for _name, _kw in {"lazy": (_LAZY, _CAP), "lazy_grad_view": (_LAZY, _VIEW, _CAP),
                   "lazy_batched_grad_view": (_LAZY, _BATCHED, _VIEW, _CAP),
                   "lazy_static_graph": (_LAZY, ("static_graph", True), _CAP)}.items():
    CASES[f"float32-{_name}-light-detail"] = Case(kwargs=_kw, detail="light")
    if _VIEW not in _kw:
        CASES[f"float32-{_name}"] = Case(kwargs=_kw)
CASES.update({
    "float32-manual": Case(kwargs=(_CAP,), manual=True),
    "float32-manual-light-detail": Case(kwargs=(_CAP,), manual=True, detail="light"),
    "float32-manual_grad_view-light-detail": Case(kwargs=(_VIEW, _CAP), manual=True,
                                                  detail="light"),
    "float32-manual_grad_view": Case(kwargs=(_VIEW, _CAP), manual=True),
    "float32-lazy_manual-light-detail": Case(kwargs=(_LAZY, _CAP), manual=True, detail="light"),
    "float32-manual-no_sync-light-detail": Case(kwargs=(_CAP,), manual=True, micro_steps=1,
                                                detail="light"),
})
WORLD4 = ["float32-default-none", "bfloat16-grad_view-none", "float16-no_sync-arg",
          "float32-static_graph-none", "float32-control", "float32-light-detail"]


class Net(nn.Module):
    """Linear - BatchNorm - Linear with an aux head (skippable) and an optional sparse
    embedding in front."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8, sparse=True) if sparse else None
        self.inp = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_aux: bool = True) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x).mean(dim=1).to(self.inp.weight.dtype)
        h = torch.relu(self.norm(self.inp(x)))
        return self.out(h) + self.aux(h) if use_aux else self.out(h)


def _build(case: Case, rank: int) -> nn.Module:
    torch.manual_seed(SEED + rank)  # rank-dependent: the constructor's broadcast matters
    net = Net(case.sparse)
    if not case.sparse:
        net = net.to(getattr(torch, case.dtype))
    return net


def _batch(case: Case, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED * 1009 + rank * 101 + step)
    if case.sparse:
        x = torch.randint(20, (6, 3), generator=g)
    else:
        x = (torch.randn(6, 8, generator=g) * (1 + rank)).to(getattr(torch, case.dtype))
    return x, torch.randn(6, 4, generator=g)


def _first_difference(what: str, a: dict[str, torch.Tensor | None],
                      b: dict[str, torch.Tensor | None]) -> str | None:
    for name, x in a.items():
        y = b[name]
        if x is None or y is None:
            if (x is None) != (y is None):
                return f"{what} {name}: None on one side only"
            continue
        if x.is_sparse:
            x, y = x.coalesce().to_dense(), y.coalesce().to_dense()
        assert y is not None
        if x.dtype != y.dtype or not torch.equal(x, y):
            diff = (x.double() - y.double()).abs().max().item()
            return f"{what} {name}: differs (max abs {diff:.3g})"
        if torch.isnan(x).any():
            return f"{what} {name}: NaN"
    return None


def _run_case(rank: int, world_size: int, case: Case) -> str | None:
    import ddpviz

    kwargs = dict(case.kwargs)
    plain = nn.parallel.DistributedDataParallel(_build(case, rank), **kwargs)
    watched_module = _build(case, rank)
    watched = nn.parallel.DistributedDataParallel(watched_module, **kwargs)
    if case.hook in ("arg", "before", "after"):
        plain.register_comm_hook(dist.group.WORLD, allreduce_hook)
    if case.hook == "builtin":
        plain._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    if case.hook == "before":
        watched.register_comm_hook(dist.group.WORLD, allreduce_hook)
    if case.hook == "control":
        watched.register_comm_hook(dist.group.WORLD, allreduce_hook)
    w = ddpviz.watch(watched, emitter=lambda e: None, hang_timeout=60,
                     hook=allreduce_hook if case.hook == "arg" else None,
                     state=dist.group.WORLD if case.hook == "arg" else None,
                     recording=recording(case.detail))
    if case.hook == "after":
        watched.register_comm_hook(dist.group.WORLD, allreduce_hook)
    if case.hook == "builtin":
        watched._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    if case.manual:
        for ddp in (plain, watched):
            ddp.require_manual_backward_finalization = True
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (plain, watched)]
    try:
        for step in range(STEPS):
            use_aux = not case.skip_aux or (rank + step) % 2 == 0
            grads = []
            for ddp, opt in zip((plain, watched), opts, strict=True):
                for micro in range(case.micro_steps):
                    x, y = _batch(case, rank, 100 * step + micro + 1)
                    with ddp.no_sync():
                        nn.functional.mse_loss(ddp(x, use_aux).float(), y).backward()
                x, y = _batch(case, rank, 100 * step)
                nn.functional.mse_loss(ddp(x, use_aux).float(), y).backward()
                if case.manual:
                    ddp.finalize_backward()
                grads.append({n: (None if p.grad is None else p.grad.clone())
                              for n, p in ddp.module.named_parameters()})
                opt.step()
                # None on even steps, zeros kept on odd ones: with gradient_as_bucket_view,
                # torch multiplies while copying in the first case and divides in place in the
                # second.
                opt.zero_grad(set_to_none=step % 2 == 0)
            diff = _first_difference(f"step {step} gradient", grads[0], grads[1])
            if diff is None:
                state = [dict(m.module.state_dict()) for m in (plain, watched)]
                diff = _first_difference(f"step {step} state", state[0], state[1])
            if diff is not None:
                return diff
        return None
    finally:
        w.close()


def _run_all(rank: int, world_size: int, names: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = _run_case(rank, world_size, CASES[name])
        except Exception as exc:  # one broken case must not hide the others
            out[name] = f"raised {type(exc).__name__}: {exc}"
    return out


@functools.cache
def _results(world_size: int) -> dict[int, Any]:
    names = [n for n in {3: list(CASES), 4: WORLD4}[world_size] if CASES[n].missing() is None]
    return run_ranks(_run_all, world_size, names, timeout=300, start_method="forkserver")


def _check(world_size: int, name: str) -> None:
    reason = CASES[name].missing()
    if reason is not None:
        pytest.skip(reason)
    results = _results(world_size)
    outcomes = {r: results[r][name] for r in range(world_size)}
    if name.endswith("control"):
        if world_size == 3:  # dividing the bucket by 3 != multiplying each gradient by 1/3
            assert all(o is not None and "differs" in o for o in outcomes.values()), outcomes
        return
    assert all(o is None for o in outcomes.values()), outcomes


@pytest.mark.parametrize("name", list(CASES))
def test_watched_equals_unwatched_at_world_size_3(name: str) -> None:
    _check(3, name)


@pytest.mark.parametrize("name", WORLD4)
def test_watched_equals_unwatched_at_world_size_4(name: str) -> None:
    _check(4, name)
