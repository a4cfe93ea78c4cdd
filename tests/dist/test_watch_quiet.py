"""The quiet guard (See [Note: the quiet guard] in ddpviz/probes/quiet.py): under watch()'s
levels without a comm hook, a rank whose step waits for a peer that has not reached it names
that peer from its pulse thread, live (rank_waiting) and at hang_timeout (rank_hang), while
torch's C++ reducer keeps waiting; the step then completes as torch's would once the peer
comes, and ranks that are quiet at the same step report nothing.

Real gloo ranks; the lagging rank is held back by a store handshake (it goes on once the
waiting rank has named it), not by a timing.
"""

from __future__ import annotations

import datetime
import threading
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.harness import run_ranks
from tests.polling import eventually
from tests.recordings import recording

pytestmark = pytest.mark.dist

LAG_STEP = 3
STEPS = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def quiet_ranks(rank: int, world_size: int, detail: str) -> dict[str, Any]:
    import ddpviz
    from ddpviz import events as ev
    from ddpviz.findings import DiagnosisWarning

    store = dist.distributed_c10d._get_default_store()
    found: list[dict[str, Any]] = []

    def emit(event: ev.Event) -> None:
        if isinstance(event, ev.FindingReported):
            f = event.finding
            found.append({"kind": f.kind, "ranks": f.ranks, "step": event.step,
                          "severity": f.severity, "text": f.text(),
                          "thread": threading.current_thread().name})
            if f.kind == "rank_hang":
                store.set("named", "1")

    ddp = nn.parallel.DistributedDataParallel(_model())
    twin = nn.parallel.DistributedDataParallel(_model())
    w = ddpviz.watch(ddp, emitter=emit, hang_timeout=4, recording=recording(detail))
    g = torch.Generator().manual_seed(rank)
    with warnings.catch_warnings(record=True) as warned:  # (process-wide: the pulse thread's)
        warnings.simplefilter("always")
        for step in range(STEPS):
            x = torch.randn(4, 8, generator=g)
            if step == LAG_STEP and rank == world_size - 1:
                # behind: come to this step only once a waiting rank has named this one
                store.wait(["named"], datetime.timedelta(seconds=50))
            for model in (ddp, twin):
                model(x).sum().backward()
    named = len(found)
    # Every rank quiet at the same step, past hang_timeout: the guard looks and finds no one
    # behind (wait until it has looked at the last stage, then check it said nothing).
    guard = w.watchdog.quiet
    assert guard is not None
    looked = eventually(lambda: guard._done == (STEPS - 1, 2), limit=40)
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(ddp.parameters(), twin.parameters(),
                                                           strict=True))
    w.close()
    return {"found": found, "named": named, "looked": looked, "same_grads": same,
            "error": repr(w.error), "warned": [str(m.message) for m in warned
                                               if issubclass(m.category, DiagnosisWarning)]}


@pytest.mark.parametrize("detail", ["light", "steps"])
def test_a_waiting_rank_names_the_rank_behind_it_and_the_step_completes(detail: str) -> None:
    # spawn, not the harness's forkserver: forked ranks failed 2 of 3 runs under load ~15-28
    # (an extra rank_waiting before step 0, which is attach's true live notice, allowed below;
    # the guard not done with the last step in 40 s, not yet understood)
    results = run_ranks(quiet_ranks, 2, detail, timeout=150, start_method="spawn")
    waiting, behind = results[0], results[1]
    for res in results.values():
        # Under load (CI, xdist) a rank may truly wait a second for the other in watch()'s
        # attach, and says so live ("rank 1 has waited 1.0s in ddpviz.watch() for rank 0"),
        # as a warning on the training thread; nothing else happens before the first step.
        early = [f for f in res["found"] if f["step"] < 0]
        assert all(f["kind"] == "rank_waiting" and f["severity"] == "warning"
                   and f["thread"] == "MainThread" for f in early), early
    lagged = [f for f in waiting["found"] if f["step"] >= 0]
    kinds = [(f["kind"], f["ranks"], f["step"], f["severity"]) for f in lagged]
    assert kinds == [("rank_waiting", (1,), LAG_STEP, "warning"),
                     ("rank_hang", (1,), LAG_STEP, "error")]
    assert {f["thread"] for f in lagged} == {"ddpviz-pulse"}  # training thread: in C++
    hang = lagged[1]["text"]
    assert f"rank 1 did not reach step {LAG_STEP} within 4s" in hang
    assert f"at step {LAG_STEP - 1}" in hang and "behind" in hang  # where rank 1 was
    assert "process group's timeout (60s)" in hang
    assert waiting["warned"] == [f["text"] for f in lagged]  # on stderr too (not attach's notice)
    assert [f for f in behind["found"] if f["step"] >= 0] == []  # it waits for no one
    assert behind["warned"] == []
    for res in results.values():
        assert res["looked"], "the guard never looked at the last step"
        assert len(res["found"]) == res["named"]  # quiet at the same step: nothing reported
        assert res["same_grads"]  # the late step completed with torch's gradients
        assert res["error"] == "None"  # nothing raised: torch's reducer did the waiting
