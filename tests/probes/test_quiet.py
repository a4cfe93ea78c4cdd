"""The quiet guard's decisions (probes/quiet.py) on a notice board in a HashStore, without
ranks: when it looks, whom it names, what it posts, and that a failing guard does not stop the
heartbeat. The multi-rank behaviour is tests/dist/test_watch_quiet.py."""

from __future__ import annotations

import time
import types
from typing import Any

import pytest
import torch.distributed as dist

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import DiagnosisWarning
from ddpviz.probes.pulse import Pulse
from ddpviz.probes.quiet import QuietGuard
from ddpviz.probes.rendezvous import Board, Position, Scope
from ddpviz.probes.watchdog import Watchdog
from tests.polling import eventually
from tests.probes.ranks_in_threads import FakeGroup

TIMEOUT = 4.0  # hang_timeout; the live notice comes at a quarter of it


def board(store: dist.Store, rank: int, world_size: int = 3) -> Board:
    return Board(Scope(FakeGroup(rank, world_size), store=store), 0)  # type: ignore[arg-type]


def guard(events: list[Any], world_size: int = 3) -> QuietGuard:
    """A guard for rank 0 of `world_size`, its findings emitted into `events`."""
    dog: Any = types.SimpleNamespace(timeout=TIMEOUT, rank=0, world_size=world_size,
                                     guarding=False, tap=Tap(events.append, rank=0))
    dog.waiting_finding = types.MethodType(Watchdog.waiting_finding, dog)
    return QuietGuard(dog, pg_timeout=60.0)


def running(step: int) -> Position:
    return Position("running", step, "forward", time.time())


def test_names_only_the_ranks_behind_once_per_stage_and_posts_itself_waiting() -> None:
    store = dist.HashStore()
    mine, events = board(store, 0), []
    board(store, 1).post_position(running(5))
    board(store, 2).post_position(running(4))  # behind
    g = guard(events)
    with pytest.warns(DiagnosisWarning, match="rank 2 did not reach step 5 within 4s"):
        g(mine, (5, "forward", time.time() - TIMEOUT - 1))  # past the deadline at once
        g(mine, (5, "forward", time.time() - TIMEOUT - 1))  # the same stage: said once
    assert [(f.kind, f.ranks, f.step) for f in g.findings] == [("rank_hang", (2,), 5)]
    assert [type(e) for e in events] == [FindingReported]
    me = mine.positions()[0]
    assert (me.state, me.step, me.collective) == ("waiting", 5, "all-reduce")
    assert "process group's timeout (60s)" in g.findings[0].text()


def test_the_live_notice_comes_first_and_nothing_before_it() -> None:
    store = dist.HashStore()
    mine, events = board(store, 0, 2), []
    board(store, 1, 2).post_position(running(2))
    g = guard(events, world_size=2)
    g(mine, (3, "forward", time.time()))  # quiet for no time yet
    assert g.findings == [] and 0 not in mine.positions()
    with pytest.warns(DiagnosisWarning):
        g(mine, (3, "forward", time.time() - TIMEOUT / 4 - 0.1))
    assert [(f.kind, f.severity, f.ranks) for f in g.findings] == [
        ("rank_waiting", "warning", (1,))]


@pytest.mark.parametrize("why", ["every rank at its step", "the watchdog guards the wait",
                                 "the constructor"])
def test_says_nothing_when_no_rank_is_behind_or_the_wait_is_guarded(why: str) -> None:
    store = dist.HashStore()
    mine, events = board(store, 0), []
    for r in (1, 2):
        board(store, r).post_position(running(7 if why == "every rank at its step" else 1))
    g = guard(events)
    g.dog.guarding = why == "the watchdog guards the wait"
    step = -1 if why == "the constructor" else 7
    g(mine, (step, "forward", time.time() - 10 * TIMEOUT))
    assert g.findings == [] and events == []
    assert 0 not in mine.positions()  # nor posted as waiting


def test_a_guard_that_raises_stops_but_the_heartbeat_goes_on() -> None:
    store = dist.HashStore()
    pulse = Pulse(board(store, 0, 2))
    reader = board(store, 1, 2)

    def broken(board_: Board, beat: Any) -> None:
        raise ValueError("an emitter that raises")

    pulse.on_quiet = broken
    try:
        pulse.beat(0, "forward")
        assert eventually(lambda: pulse.quiet_error is not None)
        assert pulse.on_quiet is None and isinstance(pulse.quiet_error, ValueError)
        pulse.beat(1, "forward")
        assert eventually(lambda: 0 in reader.positions() and reader.positions()[0].step == 1)
    finally:
        pulse.close()


@pytest.mark.parametrize("named", ["waiting", "behind"])
def test_the_title_says_what_the_collectives_verdict_says(
        monkeypatch: pytest.MonkeyPatch, named: str) -> None:
    """A verdict of the job's collectives in the store (collective_check.Verdict): the title
    names the ranks it names in its words, not a claim of its own that contradicts it."""
    from ddpviz.probes import collective_check

    ranks = (0,) if named == "waiting" else (1,)
    verdict = collective_check.Verdict(ranks, "the verdict's fix", [
        f"the job's collectives: rank {ranks[0]} issued a broadcast the others did not"])
    monkeypatch.setattr(collective_check, "hang_verdict", lambda: verdict)
    store = dist.HashStore()
    mine = board(store, 0, 2)
    events: list[Any] = []
    board(store, 1, 2).post_position(running(4))
    g = guard(events, world_size=2)
    with pytest.warns(DiagnosisWarning):
        g(mine, (5, "forward", time.time() - TIMEOUT - 1))
    [f] = g.findings
    assert f.kind == "rank_hang" and f.fix == "the verdict's fix"
    assert verdict.lines[0] in f.detail
    if named == "waiting":  # rank 0 issued more: rank 1 is not called late
        assert f.ranks == (0,)
        assert f.title.startswith("rank 0 issued collectives that rank 1 did not: rank 0 "
                                  "has waited "), f.title
        assert "did not reach" not in f.title
    else:  # rank 1 issued more and never came: both, as observed
        assert f.ranks == (1,)
        assert f.title.startswith("rank 1 did not reach step 5 after rank 1 issued "
                                  "collectives that rank 0 did not; rank 0 has waited "), f.title


def test_a_rank_still_in_its_forward_of_the_same_step_is_named_as_not_returned() -> None:
    """A rank at this rank's step whose last beat is its forward's start has not returned from
    it (user code inside DDP's forward, as Lightning's training_step); one whose forward
    returned is not behind."""
    store = dist.HashStore()
    mine = board(store, 0)
    events: list[Any] = []
    board(store, 1).post_position(Position("running", 5, "forward", time.time() - 9))
    board(store, 2).post_position(Position("running", 5, "backward", time.time() - 9))
    g = guard(events)
    with pytest.warns(DiagnosisWarning, match="rank 1 did not return from step 5's forward "
                                              "within 4s"):
        g(mine, (5, "backward", time.time() - TIMEOUT - 1))
    [f] = g.findings
    assert (f.kind, f.ranks, f.step) == ("rank_hang", (1,), 5)
    where = {r: v for v, rs in f.values for r in rs}
    assert where[1].startswith("at step 5 (in its forward since ") and where[1].endswith("behind")
    assert not where[2].endswith("behind")


def test_a_peer_in_its_forward_while_this_rank_is_in_its_own_is_not_behind() -> None:
    store = dist.HashStore()
    mine = board(store, 0, 2)
    events: list[Any] = []
    board(store, 1, 2).post_position(Position("running", 5, "forward", time.time() - 9))
    g = guard(events, world_size=2)
    g(mine, (5, "forward", time.time() - TIMEOUT - 1))  # no return beat here either
    assert g.findings == [] and events == []
