"""Store-based meetings (rendezvous.py) with ranks as threads: every rank that arrives gets the
same answer, a rank that never arrives is named, a late rank learns the verdict."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch.distributed as dist

from ddpviz.errors import RankHangError
from ddpviz.findings import Finding
from ddpviz.probes.rendezvous import Board, Position, Scope, exchange, rendezvous
from tests.probes.ranks_in_threads import FakeGroup, in_threads


def meet(world_size: int, timeout: float, name: str = "m", delay: dict[int, float] | None = None
         ) -> Any:
    def fn(rank: int, store: dist.Store) -> list[str]:
        time.sleep((delay or {}).get(rank, 0.0))
        return exchange(name, f"payload {rank}", FakeGroup(rank, world_size),  # type: ignore[arg-type]
                        timeout=timeout, store=store, what="the test's meeting")
    return fn


def test_every_rank_gets_every_payload_in_rank_order() -> None:
    results = in_threads(meet(3, 5.0), [0, 1, 2], dist.HashStore())
    assert results == {r: ["payload 0", "payload 1", "payload 2"] for r in range(3)}


def test_consecutive_meetings_with_one_name_are_separate() -> None:
    store = dist.HashStore()

    def twice(rank: int, store: dist.Store) -> tuple[list[str], list[str]]:
        group = FakeGroup(rank, 2)
        first = exchange("x", f"a{rank}", group, timeout=5, store=store)  # type: ignore[arg-type]
        second = exchange("x", f"b{rank}", group, timeout=5, store=store)  # type: ignore[arg-type]
        return first, second

    results = in_threads(twice, [0, 1], store)
    assert results[0] == results[1] == (["a0", "a1"], ["b0", "b1"])


def test_a_rank_that_never_arrives_is_named_on_every_rank_that_did() -> None:
    start = time.monotonic()
    results = in_threads(meet(3, 0.5), [0, 1], dist.HashStore())
    elapsed = time.monotonic() - start
    assert elapsed < 5
    errors = [results[0], results[1]]
    assert all(isinstance(e, RankHangError) for e in errors)
    assert str(errors[0]) == str(errors[1])
    assert str(errors[0]).splitlines() == [
        "ddpviz: rank 2 never reached the test's meeting within 0.5s (world_size=3):",
        "  ranks 0,1: arrived",
        "  rank 2:    never arrived",
        "A rank that never arrives crashed, is stuck earlier (data loading, a collective only it "
        "runs, a deadlock), or skips this code path: read rank 2's output and look for "
        "rank-dependent control flow.",
    ]
    (finding,) = errors[0].findings
    assert finding.matches(kind="missing_rank", ranks=(2,), field="arrival", world_size=3)


def test_a_rank_arriving_after_the_others_gave_up_raises_the_same_verdict() -> None:
    results = in_threads(meet(2, 0.3, delay={1: 1.0}), [0, 1], dist.HashStore())
    assert isinstance(results[0], RankHangError) and isinstance(results[1], RankHangError)
    assert str(results[0]) == str(results[1])
    assert results[1].findings[0].ranks == (1,)


def test_rendezvous_with_one_rank_needs_no_store() -> None:
    rendezvous("solo", FakeGroup(0, 1), timeout=0.1, store=None)  # type: ignore[arg-type]


def test_board_positions_and_alerts_round_trip() -> None:
    store = dist.HashStore()
    boards = [Board(Scope(FakeGroup(r, 2), store=store), epoch=7)  # type: ignore[arg-type]
              for r in range(2)]
    assert not boards[0].has_alerts() and boards[0].positions() == {}
    here = Position("running", 3, "forward", 1.5)
    boards[1].post_position(here)
    f = Finding(kind="unused_parameter", severity="error", title="t", name="w", ranks=(1,))
    boards[1].post_alert("ddpviz: rank 1 failed", [f])
    assert boards[0].positions() == {1: here}
    assert boards[0].has_alerts()
    assert boards[0].alerts() == {1: {"rank": 1, "message": "ddpviz: rank 1 failed",
                                      "findings": (f,)}}
    assert boards[0].decide("v", "first") == "first"
    assert boards[1].decide("v", "second") == "first"
    other_epoch = Board(Scope(FakeGroup(0, 2), store=store), epoch=8)  # type: ignore[arg-type]
    assert not other_epoch.has_alerts()


def test_a_position_that_does_not_validate_is_not_read() -> None:
    store = dist.HashStore()
    board = Board(Scope(FakeGroup(0, 2), store=store), epoch=0)  # type: ignore[arg-type]
    store.set(f"{board.base}/pos/1", '{"state": "asleep", "step": 3}')  # not a Position
    assert board.positions() == {}
    waiting = Position("waiting", 2, "backward", 5.0, "all-reduce", 1, ("fc.weight",), 4.0)
    board.post_position(waiting)
    assert board.positions() == {0: waiting}


def test_scope_without_a_process_group_says_how_to_fix_it() -> None:
    # No test leaves a default process group behind in the pytest process: that would be a leak.
    assert not dist.is_initialized(), "a test left a default process group in this process"
    with pytest.raises(RuntimeError, match="init_process_group"):
        Scope(None)
