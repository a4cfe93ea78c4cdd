"""What a closed watch leaves behind: nothing that runs. close() stops the replica check's
thread, and the heartbeat's after pulse.CLOSE_GRACE_S (shortened here); ddpviz's background
threads share one store connection per process (See [Note: one background connection] in
ddpviz/probes/rendezvous.py). So a notebook that watches and closes again and again neither
piles up threads polling the store nor opens a connection each time (each one a reverse DNS
lookup in torch's socket code: 5 s where the resolver drops it).

Real gloo ranks; the same steps unwatched on a twin give the gradients to compare with.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

ROUNDS = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _ddpviz_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("ddpviz"))


def _settled_threads(within: float = 15.0) -> list[str]:
    # the replica check's thread leaves at its next look at the store (every 0.25 s when idle)
    deadline = time.monotonic() + within
    while _ddpviz_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    return _ddpviz_threads()


def close_rounds(rank: int, world_size: int) -> dict[str, Any]:
    import ddpviz
    from ddpviz.probes import pulse, rendezvous

    # a closed watch's heartbeat runs this long more (composing peers' last posts), then stops
    pulse.CLOSE_GRACE_S = 0.5

    before = len(rendezvous._CLONES)
    g = torch.Generator().manual_seed(rank)
    after_close: list[list[str]] = []
    same = True
    for _ in range(ROUNDS):
        ddp = nn.parallel.DistributedDataParallel(_model())
        twin = nn.parallel.DistributedDataParallel(_model())
        w = ddpviz.watch(ddp, emitter=lambda e: None,
                         recording=ddpviz.Recording(every=100, replicas=1))
        for _step in range(3):
            x = torch.randn(4, 8, generator=g)
            for model in (ddp, twin):
                model(x).sum().backward()
        same &= all(torch.equal(a.grad, b.grad)
                    for a, b in zip(ddp.parameters(), twin.parameters(), strict=True))
        alive = _ddpviz_threads()
        w.close()
        after_close.append(_settled_threads())
    # two watches at once: closing one leaves the other's heartbeat running on the shared
    # connection
    first = ddpviz.watch(nn.parallel.DistributedDataParallel(_model()), emitter=lambda e: None)
    second_ddp = nn.parallel.DistributedDataParallel(_model())
    second = ddpviz.watch(second_ddp, emitter=lambda e: None)
    first.close()
    second_ddp(torch.randn(4, 8, generator=g)).sum().backward()
    beating = second.watchdog._pulse is not None and second.watchdog._pulse._thread.is_alive()
    second.close()
    return {"alive": alive, "after_close": after_close, "same": same, "beating": beating,
            "connections": len(rendezvous._CLONES) - before, "left": _settled_threads()}


def test_close_stops_the_watchs_threads_and_watches_share_one_store_connection() -> None:
    results = run_ranks(close_rounds, 2, timeout=120, start_method="forkserver")
    for rank, res in results.items():
        assert res["same"], rank  # watched gradients equal the twin's
        # while watched: the heartbeat and the replica check (checking every step) run
        assert "ddpviz-pulse" in res["alive"] and "ddpviz-replicas" in res["alive"], res
        assert res["after_close"] == [[]] * ROUNDS, res  # (the heartbeat used to stay)
        assert res["beating"], res
        assert res["left"] == [], res
        # one connection for the background threads of all 7 watches (it was 2 a watch)
        assert res["connections"] == 1, res
