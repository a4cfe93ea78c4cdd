"""watch()'s plain steps (See [Note: plain steps] in ddpviz/_watch/base.py), on 2 real gloo
ranks: a run on the short path records exactly the events of the same run with the short path
off (every step counted, the sampled, replica-checked and NaN-checked steps and the
heartbeat's stack notes on the full path), most steps take the short path, and a finding
reported from another thread in the middle of a plain window makes the next step full."""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from ddpviz import events as ev
from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

STEPS = 140
EVERY = 10  # the sampling period (the defaults are 100: the same logic)
REPLICAS = 7  # the replica check's period (not EVERY's: its steps must be full on their own)
FINDING_AT = 46  # a plain step (not sampled, checked or an output check)
OUTPUT_EVERY = 25  # probes/nonfinite.py: the hook-less level checks the forward output so often


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _comparable(events: list[ev.Event]) -> list[tuple[str, dict[str, Any]]]:
    """Events less their clocks and the replica/NaN checks' thread timing."""
    out = []
    for e in events:
        fields = {k: v for k, v in msgspec.to_builtins(e).items()
                  if not k.endswith(("_ns", "_s", "wall", "time"))}
        out.append((type(e).__name__, fields))
    return out


def _run(rank: int, plain: bool) -> dict[str, Any]:
    import ddpviz
    from ddpviz.findings import Finding

    ddp = nn.parallel.DistributedDataParallel(_model())
    events: list[ev.Event] = []
    w = ddpviz.watch(ddp, emitter=events.append,
                     recording=ddpviz.Recording(every=EVERY, replicas=REPLICAS))
    if not plain:
        w._plain_steps = False  # type: ignore[misc]
    full: list[int] = []
    pre_forward = w._pre_forward

    def counted(module: nn.Module, args: Any) -> None:
        full.append(w._forwards)
        pre_forward(module, args)

    w._pre_forward = counted  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    finding = Finding(kind="buffer_reassigned", severity="warning", title="planted",
                      ranks=(rank,))
    for step in range(STEPS):
        torch.manual_seed(10 * rank + step)
        ddp(torch.randn(8, 16)).pow(2).sum().backward()
        if step == FINDING_AT:  # from another thread, as the pulse's and checks' findings come
            t = threading.Thread(target=w.tap.emit, args=(ev.FindingReported, finding))
            t.start()
            t.join()
        opt.step()
        opt.zero_grad()
    assert w.replicas is not None
    w.replicas.drain(30)
    w.close()
    grads = sorted({e.step for e in events if type(e) is ev.GradReady})
    forwards = [e.step for e in events if type(e) is ev.ForwardStarted]
    return {"events": _comparable([e for e in events if type(e) is not ev.FindingReported]),
            "full": full, "grads": grads, "forwards": forwards,
            "params": [p.detach().view(torch.int32).flatten().tolist() for p in ddp.parameters()]}


def _ranks(rank: int, world_size: int) -> dict[str, Any]:
    return {"plain": _run(rank, True), "full": _run(rank, False)}


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[str, Any]]:
    return run_ranks(_ranks, 2, timeout=240)


def test_plain_steps_record_what_full_steps_record(runs: dict[int, dict[str, Any]]) -> None:
    for rank, out in runs.items():
        plain, full = out["plain"], out["full"]
        assert plain["forwards"] == list(range(STEPS)), rank
        assert plain["events"] == full["events"], rank
        assert plain["params"] == full["params"], rank  # (bitwise)


def test_most_steps_take_the_short_path_and_the_special_ones_do_not(
        runs: dict[int, dict[str, Any]]) -> None:
    for rank, out in runs.items():
        full_path = set(out["plain"]["full"])
        assert out["full"]["full"] == list(range(STEPS)), rank  # (the short path off)
        special = {0, 1, 2, 3} | {s for s in range(STEPS) if s % EVERY in (0, 1)} \
            | {s for s in range(STEPS) if s % REPLICAS in (0, 1)} \
            | {s for s in range(STEPS) if s % OUTPUT_EVERY == 0 or s % 64 == 0}
        assert special <= full_path, (rank, sorted(special - full_path))
        assert len(full_path) < STEPS / 2, (rank, len(full_path))


def test_a_finding_from_another_thread_makes_the_next_step_full(
        runs: dict[int, dict[str, Any]]) -> None:
    for rank, out in runs.items():
        grads = out["plain"]["grads"]
        assert FINDING_AT + 1 in grads, (rank, grads)
        assert FINDING_AT + 1 in out["plain"]["full"], rank
        assert FINDING_AT + 2 not in grads, (rank, grads)  # (then plain again)
