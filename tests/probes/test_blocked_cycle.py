"""Ranks blocked in collectives that can never complete (probes/collective_check.py, See [Note:
comparing histories]), on 3 real gloo ranks: a cycle through three groups that no one rank
belongs to all of is named live by rank 0, well before the groups' timeout, with each rank's
call; ranks blocked in the same call of one group (a slow peer) are not named."""

from __future__ import annotations

import contextlib
import datetime
import time
from typing import Any

import pytest

from tests.dist.harness import run_ranks

pytestmark = pytest.mark.dist

TIMEOUT_S = 15  # the groups' timeout: the cycle must be named well before it


def _cycle(rank: int, world: int, cycle: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ddpviz.events import Tap
    from ddpviz.probes import collective_check

    events: list[tuple[float, Any]] = []
    assert collective_check.start(Tap(lambda e: events.append((time.monotonic(), e)),
                                      rank=rank))
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    groups = {name: dist.new_group(ranks, timeout=timeout)
              for name, ranks in (("a", [0, 1]), ("b", [1, 2]), ("c", [0, 2]))}
    t = torch.ones(3)
    dist.all_reduce(t)  # one call on the default group first: every rank's checker is up
    # cycle: rank 0 waits in a for rank 1, rank 1 in b for rank 2, rank 2 in c for rank 0;
    # else ranks 0 and 1 meet in a after rank 1 sleeps 3 s (a slow peer, not a hang)
    mine = {0: "a", 1: "b", 2: "c"}[rank] if cycle else "a"
    start = time.monotonic()
    named = None
    if cycle or rank < 2:
        if not cycle and rank == 1:
            time.sleep(collective_check.STUCK_S + 1.0)
        with contextlib.suppress(RuntimeError):  # (the groups' timeout ends the cycle)
            dist.all_reduce(t, group=groups[mine])
    check = collective_check._check
    found = [] if check is None else [f for f in check.findings
                                      if f.title.startswith("ranks are blocked")]
    if found:
        named = found[0]
    dist.barrier()  # (every rank out of its call before any rank's checker stops)
    return {"finding": None if named is None else
            {"ranks": named.ranks, "values": named.values},
            "named_after": [t - start for t, e in events
                            if type(e).__name__ == "FindingReported"]}


def test_a_cycle_through_groups_no_rank_belongs_to_all_of_is_named_by_rank_0() -> None:
    results = run_ranks(_cycle, 3, True, timeout=120)
    f = results[0]["finding"]
    assert f is not None, results
    assert f["ranks"] == (0, 1, 2)
    texts = {ranks: text for text, ranks in f["values"]}
    assert set(texts) == {(0,), (1,), (2,)}, texts
    # each rank's own call: its group (named by its ranks) and the op
    assert all("all_reduce" in t for t in texts.values()), texts
    assert "ranks 0,1" in texts[(0,)] and "ranks 1,2" in texts[(1,)] \
        and "ranks 0,2" in texts[(2,)], texts
    [after] = results[0]["named_after"]  # live, well before the groups' timeout
    assert after < TIMEOUT_S / 2, after
    assert results[1]["finding"] is None and results[2]["finding"] is None  # said once


def test_a_slow_peer_in_the_same_call_is_not_named() -> None:
    results = run_ranks(_cycle, 3, False, timeout=120)
    assert all(r["finding"] is None for r in results.values()), results
