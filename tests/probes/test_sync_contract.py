"""The gradient-sync contract (probes/sync_contract.py) in one process, without ranks: what
each cause is called, what is not dirt (torch.autograd.grad, a synced forward after local
micro-batches, an optimizer stepped inside the backward, a step without a backward), that a
failing contract steps aside once and never reaches the job, and that torch's global step hooks
go with the last contract. The multi-rank behaviour, watch() and ddpviz's DDP:
tests/dist/test_sync_contract.py; `ddpviz record`: tests/record/test_contract.py."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
from torch import nn

from ddpviz import events as ev
from ddpviz.events import Tap
from ddpviz.findings import DiagnosisWarning
from ddpviz.probes import sync_contract as sc


class Owner(nn.Module):
    """Stands for a DDP: its module, and whether its forward ever ran (torch's flag)."""

    def __init__(self, used: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        self._lazy_init_ran = used


@pytest.fixture
def hooks_before() -> Iterator[int]:
    count = len(torch_optimizer._global_optimizer_pre_hooks) + len(
        torch_optimizer._global_optimizer_post_hooks)
    yield count
    for c in sc.open_contracts():  # (a failed test leaves none behind)
        c.close()


def make(owner: Owner, events: list[Any], world_size: int = 2) -> sc.SyncContract:
    params = list(owner.module.parameters())
    return sc.SyncContract(owner, params, [n for n, _ in owner.module.named_parameters()],
                           Tap(events.append, rank=1), world_size=world_size)


def step(owner: Owner, opt: torch.optim.Optimizer, forwards: list[bool | None]) -> None:
    """One optimizer step: a backward per entry, after a forward of the DDP that is synced
    (True), under no_sync() (False), or none at all (None: the module alone)."""
    contract = sc.contract_of(owner)
    for synced in forwards:
        if synced is not None and contract is not None:
            contract.forward(synced)
        owner.module(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def findings(events: list[Any]) -> list[Any]:
    return [e.finding for e in events if isinstance(e, ev.FindingReported)]


@pytest.mark.parametrize(("used", "forwards", "cause"), [
    (False, [None], "unused_ddp"), (True, [None], "module_forward"),
    (True, [True, True, False], "no_sync")])
def test_each_cause_is_named_once_at_its_first_step(hooks_before: int, used: bool,
                                                    forwards: list[bool | None],
                                                    cause: str) -> None:
    owner, events = Owner(used), []  # type: Owner, list[Any]
    contract = make(owner, events)
    opt = torch.optim.SGD(owner.module.parameters(), lr=0.1)
    if used:
        step(owner, opt, [True])  # step 0 is fine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            step(owner, opt, forwards)
    (f,) = findings(events)
    assert (f.kind, f.field, f.step, f.ranks, f.severity) == (
        "unsynced_gradients", cause, 1 if used else 0, (1,), "error")
    assert f.name == "0.weight" and f.detail[0].startswith("4 of the 4 parameters")
    assert [str(w.message) for w in caught] == [f.text()]
    assert caught[0].category is DiagnosisWarning and caught[0].filename == __file__
    assert contract.reported == [f]
    contract.close()


def test_what_is_not_dirt(hooks_before: int) -> None:
    owner, events = Owner(True), []  # type: Owner, list[Any]
    contract = make(owner, events)
    opt = torch.optim.SGD(owner.module.parameters(), lr=0.1)
    params = list(owner.module.parameters())
    for _ in range(2):
        step(owner, opt, [False, False, True])  # accumulation done right
        # gradients computed without accumulating into .grad (a penalty, a norm)
        torch.autograd.grad(owner.module(torch.ones(2, 4)).sum(), params)
        opt.step()  # a step without a backward, on no gradient
    # a per-parameter optimizer stepped inside the backward, then the usual step
    inner = torch.optim.SGD(params[:1], lr=0.0)
    handle = params[0].register_post_accumulate_grad_hook(lambda p: inner.step())
    step(owner, opt, [True])
    handle.remove()
    # the last micro-batch inside the optimizer's closure (Lightning's automatic optimization)
    contract.forward(False)
    owner.module(torch.ones(2, 4)).sum().backward()

    def closure() -> torch.Tensor:
        contract.forward(True)
        loss = owner.module(torch.ones(2, 4)).sum()
        loss.backward()
        return loss

    opt.step(closure)
    assert findings(events) == [] and contract.error is None
    contract.close()


def test_attached_after_the_ddp_ran_it_trusts_the_backward_already_under_way(
        hooks_before: int) -> None:
    # (watch() called between a forward and its backward: that backward is not dirt)
    owner, events = Owner(True), []  # type: Owner, list[Any]
    make(owner, events)
    opt = torch.optim.SGD(owner.module.parameters(), lr=0.1)
    step(owner, opt, [None])
    assert findings(events) == []


def test_a_world_of_one_gets_a_warning_that_says_it_is_harmless_there(hooks_before: int
                                                                       ) -> None:
    owner, events = Owner(), []  # type: Owner, list[Any]
    make(owner, events, world_size=1)
    opt = torch.optim.SGD(owner.module.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(owner, opt, [None])
    (f,) = findings(events)
    assert f.severity == "warning" and "harmless in a world of one rank" in f.detail[-1]


def test_a_failing_contract_steps_aside_once_and_the_job_goes_on(hooks_before: int) -> None:
    def broken(_: Any) -> None:
        raise RuntimeError("emitter broke")

    owner, reference = Owner(True), Owner(True)
    contract = sc.SyncContract(owner, list(owner.module.parameters()), ["a"] * 4,
                               Tap(broken, rank=0), world_size=2)
    opts = [torch.optim.SGD(o.module.parameters(), lr=0.1) for o in (owner, reference)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning is raised: the emitter failed first)
        for _ in range(3):
            step(owner, opts[0], [None, False])
            step(reference, opts[1], [None, False])
    assert err.getvalue().count("the gradient-sync check failed") == 1
    assert "emitter broke" in err.getvalue() and isinstance(contract.error, RuntimeError)
    assert all(torch.equal(a, b) for a, b in zip(owner.module.parameters(),
                                                 reference.module.parameters(), strict=True))
    contract.close()


def test_torch_s_global_step_hooks_go_with_the_last_contract(hooks_before: int) -> None:
    def count() -> int:
        return len(torch_optimizer._global_optimizer_pre_hooks) + len(
            torch_optimizer._global_optimizer_post_hooks)

    owners = [Owner(), Owner()]  # (kept: a contract closes when its DDP is collected)
    first, second = make(owners[0], []), make(owners[1], [])
    assert count() == hooks_before + 1  # one pre-hook for every contract of the process
    opt = torch.optim.SGD(owners[0].module.parameters(), lr=0.1)
    step(owners[0], opt, [True])
    assert count() == hooks_before + 1  # a step without a closure needs no post-hook
    opt.step(lambda: None)
    assert count() == hooks_before + 2  # ... one given a closure is judged after it
    first.close()
    assert count() == hooks_before + 2
    second.close()
    assert count() == hooks_before and sc.open_contracts() == []
    owner = Owner()
    third = make(owner, [])
    assert third.params[0]._post_accumulate_grad_hooks
    third.close()  # its canaries go too
    assert all(not p._post_accumulate_grad_hooks for p in owner.module.parameters())


def test_a_contract_closes_when_its_ddp_is_collected(hooks_before: int) -> None:
    import gc

    owner = Owner()
    contract = make(owner, [])
    del owner
    gc.collect()
    assert contract._closed and sc.open_contracts() == []


def test_without_a_process_group_the_collectives_count_is_zero() -> None:
    assert sc.collectives_issued() == 0  # (torch's map of groups is empty: nothing to add)
