"""The twin follows the installed torch: every DDP argument and method that torch version has.

torch 2.15 added `lazy_bucket_allocation=` and manual backward finalization
(`require_manual_backward_finalization`, `should_finalize_after_backward`,
`finalize_backward()`), and batches the copy-out under `batched_grad_copy`. Each case here runs
only where the installed torch has what it uses (skipped with the reason otherwise), and
compares ddpviz's DDP with torch's on the same inputs on real gloo groups: gradients after every
synced backward and parameters after every SGD step, BITWISE, over several steps, with gradients
kept between steps (zero_grad(set_to_none=False)) or set to None.
One forkserver run per world size; the tests read its cached results.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks
from tests.dist.models import ZOO
from tests.dist.torch_release import TORCH_ARGS, TORCH_DDP, missing

pytestmark = pytest.mark.dist

STEPS = 4
SEED = 4321


class Case(NamedTuple):
    model: str
    kwargs: tuple[tuple[str, Any], ...]
    set_to_none: bool
    world_size: int
    manual: bool = False  # require_manual_backward_finalization + finalize_backward()

    @property
    def id(self) -> str:
        kw = "-".join(f"{k}={v}" for k, v in self.kwargs) or "default"
        return (f"{self.model}-{kw}-{'none' if self.set_to_none else 'kept'}"
                f"{'-manual' if self.manual else ''}-ws{self.world_size}")

    def missing(self) -> str | None:
        """Why the installed torch cannot run this case (None: it can)."""
        return missing(self.kwargs, self.manual)


def _cases() -> list[Case]:
    lazy = ("lazy_bucket_allocation", True)
    view = ("gradient_as_bucket_view", True)
    batched = ("batched_grad_copy", True)
    static = ("static_graph", True)
    cap = ("bucket_cap_mb", 0.002)
    combos: list[tuple[tuple[str, Any], ...]] = [
        (lazy, cap), (lazy, view, cap), (lazy, static, cap), (lazy, batched, cap),
        (lazy, batched, view, cap), (batched, view, cap), (batched, view, static, cap),
        (batched, cap), (lazy, ("find_unused_parameters", True), cap),
    ]
    out = []
    for ws, model in ((3, "mlp"), (2, "cnn_bn")):
        for kw in combos:
            for set_to_none in (False, True):
                out.append(Case(model, kw, set_to_none, ws))
        for kw in ((cap,), (view, cap), (lazy, cap), (batched, view, cap)):
            out.append(Case(model, kw, False, ws, manual=True))
    return out


CASES = _cases()


def _train(cls: type, case: Case, base: nn.Module, rank: int) -> list[tuple[dict, dict]]:
    zoo = ZOO[case.model]
    module = copy.deepcopy(base)
    ddp = cls(module, **dict(case.kwargs))
    if case.manual:
        ddp.require_manual_backward_finalization = True
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=case.set_to_none)
        zoo.loss(ddp, zoo.batch(SEED, rank, step)).backward()
        if case.manual:
            ddp.finalize_backward()
        grads = {n: None if p.grad is None else p.grad.detach().clone()
                 for n, p in module.named_parameters()}
        opt.step()
        out.append((grads, {n: p.detach().clone() for n, p in module.named_parameters()}))
    return out


def _difference(ref: list[tuple[dict, dict]], cand: list[tuple[dict, dict]]) -> str | None:
    for step, ((rg, rp), (cg, cp)) in enumerate(zip(ref, cand, strict=True)):
        for kind, r, c in (("gradient", rg, cg), ("parameter", rp, cp)):
            for name, a in r.items():
                b = c[name]
                if (a is None) != (b is None):
                    return f"step {step}: {kind} {name}: torch {a is None and 'None'} vs ddpviz"
                if a is not None and not torch.equal(a.to_dense() if a.is_sparse else a,
                                                     b.to_dense() if b.is_sparse else b):
                    diff = (a.double() - b.double()).abs().max().item()
                    return f"step {step}: {kind} {name} differs (max |diff| {diff:.3g})"
    return None


def _rank_main(rank: int, world_size: int, cases: list[Case]) -> dict[str, str | None]:
    import ddpviz

    results: dict[str, str | None] = {}
    for case in cases:
        base = ZOO[case.model].build(seed=SEED + 17 * rank)
        try:
            ref = _train(TORCH_DDP, case, base, rank)
            cand = _train(ddpviz.DistributedDataParallel, case, base, rank)
            results[case.id] = _difference(ref, cand)
        except Exception as e:  # recorded per case; the next case still runs
            results[case.id] = f"raised {type(e).__name__}: {e}".splitlines()[0]
    return results


@functools.cache
def _results(world_size: int) -> dict[int, dict[str, str | None]]:
    cases = [c for c in CASES if c.world_size == world_size and c.missing() is None]
    return run_ranks(_rank_main, world_size, cases, timeout=400)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_twin_bitwise_equal_to_installed_torch(case: Case) -> None:
    reason = case.missing()
    if reason is not None:
        pytest.skip(reason)
    for rank, results in _results(case.world_size).items():
        assert results[case.id] is None, f"rank {rank}: {results[case.id]}"


@pytest.mark.parametrize("name", ["lazy_bucket_allocation"])
def test_unknown_argument_raises_torchs_type_error(name: str) -> None:
    import ddpviz

    if name in TORCH_ARGS:
        pytest.skip(f"torch {torch.__version__} has {name}")
    kwargs: dict[str, Any] = {name: True}
    with pytest.raises(TypeError) as theirs:
        TORCH_DDP(nn.Linear(2, 2), **kwargs)
    with pytest.raises(TypeError) as ours:
        ddpviz.DistributedDataParallel(nn.Linear(2, 2), **kwargs)
    assert str(ours.value).startswith(str(theirs.value)), (str(theirs.value), str(ours.value))


_NEW_METHODS = ("finalize_backward", "require_manual_backward_finalization",
                "should_finalize_after_backward")


def _rank_has(rank: int, world_size: int, names: list[str]) -> dict[str, tuple[bool, bool]]:
    import ddpviz

    theirs = TORCH_DDP(nn.Linear(2, 2))
    ours = ddpviz.DistributedDataParallel(nn.Linear(2, 2))
    return {n: (hasattr(theirs, n), hasattr(ours, n)) for n in names}


def test_methods_torch_lacks_are_missing_from_the_twin() -> None:
    missing = [n for n in _NEW_METHODS if not hasattr(TORCH_DDP, n)]
    if not missing:
        pytest.skip(f"torch {torch.__version__} has {', '.join(_NEW_METHODS)}")
    for rank, has in run_ranks(_rank_has, 1, missing).items():
        assert has == {n: (False, False) for n in missing}, f"rank {rank}"


def _misuse(cls: type, rank: int) -> list[str]:
    """Manual finalization used wrongly, step by step: what each step said."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = cls(module, bucket_cap_mb=0.0003)
    said: list[str] = []

    def attempt(fn: Any) -> None:
        try:
            fn()
            said.append("ok")
        except RuntimeError as e:
            said.append(str(e).splitlines()[0])

    attempt(ddp.finalize_backward)  # not in manual mode
    ddp.require_manual_backward_finalization = True
    for _ in range(3):
        out = ddp(torch.randn(4, 8)).sum()
        said.append(f"after backward: {ddp.should_finalize_after_backward}")
        attempt(ddp.finalize_backward)  # before backward
        attempt(lambda: setattr(ddp, "require_manual_backward_finalization", False))
        out.backward()
        attempt(ddp.finalize_backward)
        attempt(ddp.finalize_backward)  # twice
    with ddp.no_sync():
        ddp(torch.randn(4, 8)).sum().backward()
        attempt(ddp.finalize_backward)
    ddp(torch.randn(4, 8)).sum().backward()
    attempt(lambda: ddp(torch.randn(4, 8)))  # forgot to finalize
    return said


def _rank_misuse(rank: int, world_size: int) -> tuple[list[str], list[str]]:
    import ddpviz

    return _misuse(TORCH_DDP, rank), _misuse(ddpviz.DistributedDataParallel, rank)


def test_manual_finalization_misuse_says_what_torch_says() -> None:
    if not hasattr(TORCH_DDP, "finalize_backward"):
        pytest.skip(f"torch {torch.__version__} has no finalize_backward()")
    for rank, (theirs, ours) in run_ranks(_rank_misuse, 2, timeout=200).items():
        assert ours == theirs, f"rank {rank}"


def _rank_guard(rank: int, world_size: int) -> str:
    import ddpviz

    kwargs: dict[str, Any] = {"lazy_bucket_allocation": True, "gradient_as_bucket_view": True}
    ddp = TORCH_DDP(ZOO["mlp"].build(seed=SEED), **kwargs)
    try:
        ddpviz.watch(ddp, recording=ddpviz.Recording(guard=True))
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return "watched"


def test_guard_steps_aside_for_lazy_buckets_as_views() -> None:
    if "lazy_bucket_allocation" not in TORCH_ARGS:
        pytest.skip(f"torch {torch.__version__} has no lazy_bucket_allocation")
    for rank, said in run_ranks(_rank_guard, 2).items():
        assert said.startswith("NotObservableError") and "lazy_bucket_allocation" in said, \
            f"rank {rank}: {said}"


def _manual_mode(ddp: nn.Module, on: bool) -> None:
    if on:
        ddp.require_manual_backward_finalization = True  # type: ignore[attr-defined]


def _join_train(cls: type, manual: bool, rank: int) -> list[tuple[dict, dict]]:
    """Uneven inputs under join(): rank r runs out of batches r steps before rank 0; the
    joined ranks shadow the others' all-reduces; after join, the final model is broadcast."""
    zoo = ZOO["mlp"]
    module = zoo.build(seed=SEED + 17 * rank)
    ddp = cls(module, bucket_cap_mb=0.002)
    _manual_mode(ddp, manual)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    out = []
    with ddp.join():
        for step in range(STEPS - rank):
            opt.zero_grad(set_to_none=False)
            zoo.loss(ddp, zoo.batch(SEED, rank, step)).backward()
            if manual:
                ddp.finalize_backward()
            out.append(({n: p.grad.detach().clone() for n, p in module.named_parameters()},
                        {}))
            opt.step()
    out.append(({}, {n: p.detach().clone() for n, p in module.named_parameters()}))
    return out


def _rank_join(rank: int, world_size: int) -> dict[str, str | None]:
    import ddpviz

    results: dict[str, str | None] = {}
    for manual in (False, True):
        try:
            ref = _join_train(TORCH_DDP, manual, rank)
            cand = _join_train(ddpviz.DistributedDataParallel, manual, rank)
            results[f"manual={manual}"] = _difference(ref, cand)
        except Exception as e:
            results[f"manual={manual}"] = f"raised {type(e).__name__}: {e}".splitlines()[0]
    return results


def test_manual_finalization_under_join_with_uneven_inputs_is_bitwise_torchs() -> None:
    """join() with uneven inputs (3 ranks: 4, 3 and 2 steps), with and without manual
    finalization: each step's gradients and the final (broadcast) parameters, twin vs torch."""
    if not hasattr(TORCH_DDP, "finalize_backward"):
        pytest.skip(f"torch {torch.__version__} has no finalize_backward()")
    for rank, results in run_ranks(_rank_join, 3, timeout=300).items():
        assert results == {"manual=False": None, "manual=True": None}, f"rank {rank}: {results}"


def _mixed_train(manual: bool, rank: int) -> list[tuple[dict, dict]]:
    from torch.nn.parallel.distributed import _MixedPrecision

    import ddpviz

    zoo = ZOO["mlp"]
    module = zoo.build(seed=SEED + 17 * rank)
    ddp = ddpviz.DistributedDataParallel(
        module, bucket_cap_mb=0.002,
        mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    _manual_mode(ddp, manual)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        zoo.loss(ddp, zoo.batch(SEED, rank, step)).backward()
        if manual:
            assert ddp.should_finalize_after_backward  # mixed precision: after backward
            ddp.finalize_backward()
        out.append(({n: p.grad.detach().clone() for n, p in module.named_parameters()}, {}))
        opt.step()
    out.append(({}, {n: p.detach().clone() for n, p in module.named_parameters()}))
    return out


def _rank_mixed(rank: int, world_size: int) -> str | None:
    auto, manual = _mixed_train(False, rank), _mixed_train(True, rank)
    if any(g.dtype != torch.float32 for g in auto[0][0].values()):
        return "gradients not back in full precision"
    return _difference(auto, manual)


def test_manual_finalization_with_mixed_precision_ends_as_automatic() -> None:
    """DDP-native mixed precision (bf16 parameters, fp32 reduction) in manual mode: the same
    gradients and parameters, bitwise, as with automatic finalization. (torch's own mixed
    precision needs an accelerator for its copy events: on CPU it fails, so here the twin is
    compared with itself, not with torch.)"""
    if not hasattr(TORCH_DDP, "finalize_backward"):
        pytest.skip(f"torch {torch.__version__} has no finalize_backward()")
    for rank, problem in run_ranks(_rank_mixed, 2, timeout=200).items():
        assert problem is None, f"rank {rank}: {problem}"


def test_every_public_name_of_torchs_ddp_class_is_on_the_twin() -> None:
    """A diff of the installed torch's DDP class against the twin: every public method and
    property (not starting with "_") torch's has, the twin has too (`to_kwargs` was missing)."""
    import ddpviz

    public = {n for n in dir(TORCH_DDP) if not n.startswith("_")}
    missing = sorted(public - set(dir(ddpviz.DistributedDataParallel)))
    assert missing == [], f"torch {torch.__version__}'s DDP has {missing}; the twin does not"


def _rank_to_kwargs(rank: int, world_size: int) -> tuple[Any, Any]:
    import ddpviz

    args, kwargs = (torch.ones(2), [torch.zeros(1)]), {"k": torch.ones(3)}
    got = [cls(nn.Linear(2, 2)).to_kwargs(args, kwargs, 0)
           for cls in (TORCH_DDP, ddpviz.DistributedDataParallel)]
    return tuple(repr(g) for g in got)  # type: ignore[return-value]


def test_to_kwargs_moves_inputs_as_torchs() -> None:
    for rank, (theirs, ours) in run_ranks(_rank_to_kwargs, 1).items():
        assert ours == theirs, f"rank {rank}"
