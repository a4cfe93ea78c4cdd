"""Backward marks (probes/backward_marks.py) on 2 real gloo ranks under watch()'s default
(hook-less) strategy: one BackwardComputed on every synced step (none under no_sync), from the
parameter whose gradient is ready first, between the step's ForwardStarted and the next; the
gradients and parameters are bitwise those of an unwatched DDP (eager, static_graph,
torch.compile); the hook is gone at close(); an emitter that raises stops the marks, said
once, and the job goes on."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ddpviz import events as ev
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 9


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _train(ddp: nn.Module, rank: int, steps: int = STEPS, no_sync_at: int = -1
           ) -> list[torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    grads: list[torch.Tensor] = []
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad()
        if step == no_sync_at:  # (accumulated into the next step's synced backward)
            with ddp.no_sync():  # type: ignore[operator]
                ddp(x).square().mean().backward()
            continue
        ddp(x).square().mean().backward()
        grads += [p.grad.clone() for p in ddp.parameters()]  # type: ignore[union-attr]
        opt.step()
    return grads + [p.detach().clone() for p in ddp.parameters()]


def _watched(rank: int, world_size: int, form: str) -> dict[str, Any]:
    import ddpviz

    kw: dict[str, Any] = {"static_graph": True} if form == "static_graph" else {}
    plain = nn.parallel.DistributedDataParallel(_model(), **kw)
    ddp = nn.parallel.DistributedDataParallel(_model(), **kw)
    log: list[ev.Event] = []
    w = ddpviz.watch(ddp, emitter=log.append)
    model: Any = ddp
    if form == "compile":
        model = torch.compile(ddp, backend="eager")
        plain = torch.compile(plain, backend="eager")  # type: ignore[assignment]
    want = _train(plain, rank, no_sync_at=4)
    got = _train(model, rank, no_sync_at=4)
    marks = w._marks  # type: ignore[attr-defined]
    hooked = marks._tensor
    param = marks.param
    w.close()
    after = hooked._backward_hooks if hooked is not None else "none"
    return {"same": all(torch.equal(a, b) for a, b in zip(want, got, strict=True)),
            "events": [(type(e).__name__, e.step, e.t_ns, getattr(e, "first_t_ns", 0),
                        getattr(e, "param", -1), getattr(e, "left_prev_ns", -1)) for e in log
                       if type(e) in (ev.ForwardStarted, ev.BackwardComputed)],
            "param": param, "ready_first": w.buckets[0][0], "hooks_after_close": after,
            "removed": marks.param}


@pytest.mark.parametrize("form", ["eager", "static_graph", "compile"])
def test_every_synced_step_is_marked_and_the_job_is_unchanged(form: str) -> None:
    outs = run_ranks(_watched, 2, form, timeout=240)
    # (one host: the ranks' monotonic clocks are one clock) step -> the latest first gradient
    latest_first: dict[int, int] = {}
    for out in outs.values():
        for name, s, _, first, *_ in out["events"]:
            if name == "BackwardComputed":
                latest_first[s] = max(latest_first.get(s, first), first)
    for out in outs.values():
        assert out["same"]
        events = out["events"]
        marked = [s for name, s, *_ in events if name == "BackwardComputed"]
        assert marked == [s for s in range(STEPS) if s != 4]  # (step 4 ran under no_sync)
        forwards = {s: t for name, s, t, *_ in events if name == "ForwardStarted"}
        ends = {s: t for name, s, t, *_ in events if name == "BackwardComputed"}
        for name, s, t, first, param, left_prev in events:
            if name != "BackwardComputed":
                continue
            assert forwards[s] < first <= t and param == out["param"]
            if s + 1 in forwards:
                assert t < forwards[s + 1]
            # left the previous step's backward after its end and before this forward, and
            # after the first gradient of the latest rank (whose last bucket the all-reduce
            # waited for; it is launched before that rank's end); unknown after a no_sync step
            if s - 1 in ends:
                assert ends[s - 1] < left_prev < forwards[s], (s, left_prev)
                assert latest_first[s - 1] < left_prev, (s, left_prev, latest_first)
            else:
                assert left_prev == -1, s
        # the parameter of the last layer, the first of the rebuilt ready order
        assert out["param"] == out["ready_first"] and out["param"] >= 2
        assert out["hooks_after_close"] is None and out["removed"] == -1


def _raising(rank: int, world_size: int) -> dict[str, Any]:
    import contextlib
    import io

    import ddpviz

    plain = nn.parallel.DistributedDataParallel(_model())
    ddp = nn.parallel.DistributedDataParallel(_model())

    def emit(e: ev.Event) -> None:
        if isinstance(e, ev.BackwardComputed):
            raise OSError("disk full")

    w = ddpviz.watch(ddp, emitter=emit)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = _train(ddp, rank)
    w.close()
    return {"same": all(torch.equal(a, b) for a, b in zip(_train(plain, rank), got,
                                                         strict=True)),
            "said": err.getvalue().count("marking the backward failed")}


def test_an_error_in_the_marks_stops_them_and_never_reaches_the_job() -> None:
    for out in run_ranks(_raising, 2, timeout=120).values():
        assert out["same"] and out["said"] == 1
