"""The optimizer-step tap (probes/optimizer_step.py) on 2 real gloo ranks: under watch() (hook-less
and guarded) and ddpviz's DDP, OptimizerStepStarted/Finished come on the sampled steps only,
from the optimizers that hold the DDP's parameters (two DDPs and an unrelated optimizer in one
process), torch's global hook tables are empty again after an unsampled forward and after
close() (the gradient-sync contract's own pair aside); an error in the tap (an emitter that
raises) never reaches the job: the tap stops, says so once on stderr, and its hooks are gone at
the next unsampled forward."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
from torch import nn

from ddpviz import events as ev
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 8
SAMPLED = [0, 1, 2, 3, 6]  # every=3: steps 0-2 and every 3rd (See [Note: detail levels])
OPT = (ev.OptimizerStepStarted, ev.OptimizerStepFinished)


def _hooks() -> int:
    """The tap's global hooks registered now (not the gradient-sync contract's pair, which
    stays while a DDP is watched: probes/sync_contract.py)."""
    hooks = [*torch_optimizer._global_optimizer_pre_hooks.values(),
             *torch_optimizer._global_optimizer_post_hooks.values()]
    return sum(getattr(h, "__module__", "") != "ddpviz.probes.sync_contract" for h in hooks)


def _two_ddps(rank: int, world_size: int, engine: str) -> dict[str, Any]:
    import ddpviz
    from ddpviz.recording import Recording

    torch.manual_seed(0)
    rec = Recording(guard=engine == "guarded", every=3)
    models = [nn.Linear(6, 6), nn.Linear(6, 6)]
    logs: list[list[ev.Event]] = [[], []]
    watches = []
    if engine == "ddpviz":
        ddps = [ddpviz.DistributedDataParallel(m, emitter=log.append, recording=rec)
                for m, log in zip(models, logs, strict=True)]
    else:
        ddps = [nn.parallel.DistributedDataParallel(m) for m in models]
        watches = [ddpviz.watch(d, emitter=log.append, recording=rec)
                   for d, log in zip(ddps, logs, strict=True)]
    # B's optimizer steps twice a step; a third optimizer holds no DDP's parameters
    opts = [torch.optim.SGD(d.parameters(), lr=0.1) for d in ddps]
    unrelated = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    armed_after = []
    for _ in range(STEPS):
        for d in ddps:
            d(torch.randn(3, 6)).sum().backward()
        armed_after.append(_hooks())
        opts[0].step()
        opts[1].step()
        opts[1].step()
        unrelated.step()
    for d in ddps:  # step 8: unsampled, so the hooks of step 6... are gone once it ran
        d(torch.randn(3, 6))
    left = _hooks()
    for w in watches:
        w.close()
    return {"steps": [[(type(e).__name__, e.step) for e in log if type(e) in OPT]
                      for log in logs],
            "armed": armed_after, "left": left, "closed": _hooks()}


@pytest.mark.parametrize("engine", ["hookless", "guarded", "ddpviz"])
def test_the_optimizer_step_is_timed_on_sampled_steps_for_its_own_ddp(engine: str) -> None:
    for out in run_ranks(_two_ddps, 2, engine).values():
        a, b = out["steps"]
        assert a == [(name, s) for s in SAMPLED for name in
                     ("OptimizerStepStarted", "OptimizerStepFinished")]
        assert b == [(name, s) for s in SAMPLED for name in
                     ("OptimizerStepStarted", "OptimizerStepFinished") * 2]
        # registered (2 DDPs x 2 hooks) on the sampled steps, none on the others
        assert out["armed"] == [4 if s in SAMPLED else 0 for s in range(STEPS)]
        assert out["left"] == 0 and out["closed"] == 0


def _raising_emitter(rank: int, world_size: int) -> dict[str, Any]:
    import ddpviz
    from ddpviz.recording import Recording

    log: list[ev.Event] = []

    def emit(e: ev.Event) -> None:
        if type(e) is ev.OptimizerStepFinished:
            raise RuntimeError("emitter broke")
        log.append(e)

    ddp = nn.parallel.DistributedDataParallel(nn.Linear(6, 6))
    w = ddpviz.watch(ddp, emitter=emit, recording=Recording(every=1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        for _ in range(4):
            ddp(torch.randn(3, 6)).sum().backward()
            opt.step()
    armed = _hooks()  # every=1: never an unsampled forward, so still registered (inert)
    w.close()
    return {"stderr": err.getvalue(), "started": [e.step for e in log
                                                  if type(e) is ev.OptimizerStepStarted],
            "forwards": sum(type(e) is ev.ForwardStarted for e in log), "armed": armed,
            "closed": _hooks()}


def test_an_error_in_the_tap_stops_it_and_says_so_once_never_into_the_job() -> None:
    for rank, out in run_ranks(_raising_emitter, 2).items():
        assert out["forwards"] == 4  # the job and the other events went on
        assert out["started"] == [0]  # nothing more after the error
        assert out["stderr"].count("timing the optimizer step failed") == 1
        assert f"rank {rank}" in out["stderr"] and "emitter broke" in out["stderr"]
        assert out["armed"] == 2 and out["closed"] == 0
