"""The gradient-sync contract (ddpviz/probes/sync_contract.py) on 2 real gloo ranks, under
watch() (hook-less and guarded) and ddpviz's own DDP: each job runs twice in the same ranks,
unwatched and watched, and must end with bitwise the same parameters.

Planted defects, each named at the first offending step (optimizer step 0) on every rank, with
its cause and the lines of the backward, the optimizer step and (no_sync) the forward: the loss
computed on `ddp.module` after the DDP ran an evaluation forward (module_forward), a DDP built
and never called while the model it wraps trains (unused_ddp), `no_sync()` around the last
micro-batch instead of the first ones (no_sync). Healthy jobs report nothing: gradient
accumulation done right (also with the last micro-batch in the optimizer's closure), no_sync()
on every micro-batch then a manual all-reduce (composer's FORCED_SYNC), a frozen teacher DDP
used for evaluation only, two DDPs with their own optimizers (one stepping a closure),
static_graph and find_unused_parameters with accumulation, a step without a backward, and an
optimizer applied inside the backward.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddpviz import events as ev
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 3
MICRO = 3  # micro-batches per optimizer step


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 2)
        self.aux = nn.Linear(6, 2)  # left out when the forward is asked to (find_unused)

    def forward(self, x: torch.Tensor, aux: bool = True) -> torch.Tensor:
        out = self.head(torch.relu(self.body(x)))
        return out + self.aux(x) if aux else out


def _batch(rank: int, step: int, i: int = 0) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1000 * step + 10 * i + rank))


Make = Callable[..., Any]  # a DDP (torch's, watched or not, or ddpviz's)


# --- the jobs: each takes (rank, make) and returns the modules whose parameters it trained ----


def module_loss(rank: int, make: Make) -> list[nn.Module]:
    ddp = make(Net())
    with torch.no_grad():
        ddp(_batch(rank, -1))  # an evaluation forward through the DDP first
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = ddp.module(_batch(rank, step)).square().sum()
        loss.backward()  # LINE:module_forward:backward
        opt.step()  # LINE:module_forward:step
        opt.zero_grad()
    return [ddp]


def unused_ddp(rank: int, make: Make) -> list[nn.Module]:
    model = Net()
    make(model)  # built, never called
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        model(_batch(rank, step)).square().sum().backward()  # LINE:unused_ddp:backward
        opt.step()  # LINE:unused_ddp:step
        opt.zero_grad()
    return [model]


def no_sync_last(rank: int, make: Make) -> list[nn.Module]:
    ddp = make(Net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        for i in range(MICRO):
            last = i == MICRO - 1
            with ddp.no_sync() if last else contextlib.nullcontext():  # the planted defect
                out = ddp(_batch(rank, step, i))  # LINE:no_sync:forward
                out.square().sum().backward()  # LINE:no_sync:backward
        opt.step()  # LINE:no_sync:step
        opt.zero_grad()
    return [ddp]


def accumulate(rank: int, make: Make, micro: int = MICRO, **options: Any) -> list[nn.Module]:
    ddp = make(Net(), **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    aux = bool(options.get("find_unused_parameters"))
    for step in range(STEPS):
        for i in range(micro):
            with ddp.no_sync() if i < micro - 1 else contextlib.nullcontext():
                ddp(_batch(rank, step, i), aux=not aux or i % 2 == 0).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [ddp]


def closure_accumulate(rank: int, make: Make) -> list[nn.Module]:
    # as Lightning's automatic optimization: the first micro-batches under no_sync(), the last
    # inside the optimizer's closure (after torch's pre-step hooks ran)
    ddp = make(Net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        for i in range(MICRO - 1):
            with ddp.no_sync():
                ddp(_batch(rank, step, i)).square().sum().backward()

        def closure(step: int = step) -> torch.Tensor:
            loss = ddp(_batch(rank, step, MICRO - 1)).square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        opt.zero_grad()
    return [ddp]


def static_graph(rank: int, make: Make) -> list[nn.Module]:
    # (torch's static_graph asserts on no_sync() in its first iterations: one micro-batch)
    return accumulate(rank, make, micro=1, static_graph=True)


def find_unused(rank: int, make: Make) -> list[nn.Module]:
    return accumulate(rank, make, find_unused_parameters=True)


def forced_sync(rank: int, make: Make) -> list[nn.Module]:
    ddp = make(Net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    world = dist.get_world_size()
    for step in range(STEPS):
        for i in range(MICRO):
            with ddp.no_sync():  # every micro-batch: the gradients are all-reduced by hand
                ddp(_batch(rank, step, i)).square().sum().backward()
        for p in ddp.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        opt.step()
        opt.zero_grad()
    return [ddp]


def frozen_teacher(rank: int, make: Make) -> list[nn.Module]:
    teacher, student = make(Net()), make(Net())
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for step in range(STEPS):
        x = _batch(rank, step)
        with torch.no_grad():
            target = teacher(x)
        (student(x) - target).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [teacher, student]


def two_ddps(rank: int, make: Make) -> list[nn.Module]:
    # two models, two DDPs, two optimizers; the second steps with a closure
    gen, critic = make(Net()), make(nn.Linear(2, 1))
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.1)
    for step in range(STEPS):
        x = _batch(rank, step)
        with torch.no_grad():
            fake = gen(x)

        def closure(fake: torch.Tensor = fake) -> torch.Tensor:
            opt_c.zero_grad()
            loss = critic(fake).sum()
            loss.backward()
            return loss

        opt_c.step(closure)
        opt_g.zero_grad()
        critic.requires_grad_(False)  # the generator's loss through the frozen critic
        critic.module(gen(x)).sum().backward()
        critic.requires_grad_(True)
        opt_g.step()
        opt_g.step()  # a second step on the same (all-reduced) gradients, no backward between
    return [gen, critic]


def in_backward(rank: int, make: Make) -> list[nn.Module]:
    # a per-parameter optimizer stepped from a post-accumulate-grad hook, inside the backward,
    # then the usual step
    ddp = make(Net())
    first = next(ddp.parameters())
    inner = torch.optim.SGD([first], lr=0.0)
    first.register_post_accumulate_grad_hook(lambda p: inner.step())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        ddp(_batch(rank, step)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [ddp]


DEFECTS = {"module_forward": module_loss, "unused_ddp": unused_ddp, "no_sync": no_sync_last}
HEALTHY = {"accumulate": accumulate, "closure_accumulate": closure_accumulate,
           "forced_sync": forced_sync,
           "frozen_teacher": frozen_teacher, "two_ddps": two_ddps,
           "static_graph": static_graph, "find_unused": find_unused,
           "in_backward": in_backward}
JOBS: dict[str, Callable[[int, Make], list[nn.Module]]] = {**DEFECTS, **HEALTHY}


def _lines() -> dict[tuple[str, str], int]:
    """(cause, what) -> the line of this file marked with a LINE:cause:what comment."""
    source = inspect.getsource(inspect.getmodule(_lines))  # type: ignore[arg-type]
    return {(m[1], m[2]): n for n, line in enumerate(source.splitlines(), start=1)
            if (m := re.search(r"# LINE:(\w+):(\w+)$", line))}


def _digest(modules: list[nn.Module]) -> str:
    raw = b"".join(p.detach().numpy().tobytes() for m in modules for p in m.parameters())
    return hashlib.sha256(raw).hexdigest()


def _run_jobs(rank: int, world_size: int, engine: str, names: list[str]) -> dict[str, Any]:
    import ddpviz
    from ddpviz.probes.sync_contract import open_contracts

    rec = ddpviz.Recording(guard=engine == "guarded")
    out: dict[str, Any] = {}
    for name in names:
        digests = []
        for watched in (False, True):
            events: list[ev.Event] = []
            watches: list[Any] = []

            def make(module: nn.Module, *, _events: list[ev.Event] = events,
                     _watches: list[Any] = watches, _watched: bool = watched,
                     **options: Any) -> nn.Module:
                torch.manual_seed(0)
                for p in module.parameters():  # the same start on every rank and run
                    with torch.no_grad():
                        p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(
                            p.numel())))
                if _watched and engine == "ddpviz":
                    return ddpviz.DistributedDataParallel(module, emitter=_events.append,
                                                          recording=rec, **options)
                ddp = nn.parallel.DistributedDataParallel(module, **options)
                if _watched:
                    _watches.append(ddpviz.watch(ddp, emitter=_events.append, recording=rec))
                return ddp

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trained = JOBS[name](rank, make)
            digests.append(_digest(trained))
            for w in watches:
                w.close()
            del trained
            if watched:
                out[name] = {
                    "findings": [e.finding for e in events if isinstance(e, ev.FindingReported)],
                    "warned": [str(c.message) for c in caught
                               if c.category.__name__ == "DiagnosisWarning"],
                    "warned_at": [(c.filename, c.lineno) for c in caught
                                  if c.category.__name__ == "DiagnosisWarning"]}
        out[name]["same"] = digests[0] == digests[1]
        import gc

        gc.collect()
    out["open_after"] = len(open_contracts())
    return out


def _check_defects(results: dict[int, dict[str, Any]], engine: str) -> None:
    lines = _lines()
    for rank, out in results.items():
        for cause in DEFECTS:
            got = out[cause]
            assert got["same"], f"{cause} ({engine}): watching changed the job on rank {rank}"
            found = [f for f in got["findings"] if f.kind == "unsynced_gradients"]
            assert len(found) == 1, (cause, engine, rank, got["findings"])
            f = found[0]
            assert (f.field, f.step, f.ranks, f.severity) == (cause, 0, (rank,), "error"), f
            assert f.world_size == 2 and f.title.startswith(f"rank {rank}: optimizer step 0")
            assert f.detail[0].startswith("6 of the 6 parameters"), f.detail
            assert "'body.weight'" in f.detail[0]
            sites = f.values[0][0]
            assert f.values[0][1] == (rank,)
            job = JOBS[cause].__name__
            here = r"\S*test_sync_contract\.py"
            assert re.search(rf"^backward at {here}:{lines[(cause, 'backward')]} in {job} ",
                             sites), sites
            assert re.search(rf"; SGD\.step\(\) at {here}:{lines[(cause, 'step')]} in {job} ",
                             sites), sites
            if cause == "no_sync":
                assert re.search(rf"; after the forward under no_sync\(\) at {here}:"
                                 rf"{lines[(cause, 'forward')]} in {job} ", sites), sites
            assert f.fix and f.fix == _fix(cause)
            # said once, as a DiagnosisWarning pointing at the user's optimizer.step() line
            assert got["warned"] == [f.text()]
            assert got["warned_at"] == [(__file__, lines[(cause, "step")])]


def _fix(cause: str) -> str:
    from ddpviz.findings import fix_for

    return fix_for("unsynced_gradients", cause)


def _check_healthy(results: dict[int, dict[str, Any]], engine: str) -> None:
    for rank, out in results.items():
        for name in HEALTHY:
            got = out[name]
            assert got["same"], f"{name} ({engine}): watching changed the job on rank {rank}"
            assert got["findings"] == [] and got["warned"] == [], (name, engine, got)
        if engine != "ddpviz":  # (ddpviz's DDPs live on with their heartbeat threads)
            assert out["open_after"] == 0  # every contract closed with its watch


@pytest.mark.parametrize("engine", ["hookless", "guarded", "ddpviz"])
def test_unsynced_gradients_are_named_at_the_first_step_with_their_cause_and_lines(
        engine: str) -> None:
    results = run_ranks(_run_jobs, 2, engine, list(DEFECTS), timeout=240,
                        start_method="forkserver")
    _check_defects(results, engine)


@pytest.mark.parametrize("engine", ["hookless", "guarded", "ddpviz"])
def test_healthy_jobs_report_nothing_and_run_bitwise_as_unwatched(engine: str) -> None:
    results = run_ranks(_run_jobs, 2, engine, list(HEALTHY), timeout=240,
                        start_method="forkserver")
    _check_healthy(results, engine)
