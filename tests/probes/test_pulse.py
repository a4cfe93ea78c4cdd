"""The heartbeat's daemon thread (probes/pulse.py): what it posts to the notice board, that a
position posted by a waiting rank is never overwritten by a stale heartbeat, and that closing
still posts the last beat."""

from __future__ import annotations

import time

import torch.distributed as dist

from ddpviz.probes.pulse import CHECK_S, EVERY_UNTIL, POST_S, Pulse
from ddpviz.probes.rendezvous import Board, News, Position, Scope
from tests.polling import eventually
from tests.probes.ranks_in_threads import FakeGroup


def board(store: dist.Store, rank: int = 0, world_size: int = 2) -> Board:
    return Board(Scope(FakeGroup(rank, world_size), store=store), 0)  # type: ignore[arg-type]




def test_a_beat_reaches_the_board_and_the_latest_one_wins() -> None:
    store = dist.HashStore()
    pulse = Pulse(board(store))
    reader = board(store, rank=1)
    try:
        for step in range(50):
            pulse.beat(step, "forward")
        assert eventually(lambda: 0 in reader.positions() and reader.positions()[0].step == 49)
        position = reader.positions()[0]
        assert (position.state, position.phase) == ("running", "forward")
    finally:
        pulse.close()


def test_a_held_pulse_never_overwrites_the_position_its_rank_posted() -> None:
    store = dist.HashStore()
    pulse = Pulse(board(store))
    mine = board(store)
    try:
        pulse.beat(3, "forward")
        pulse.hold()  # the training thread is about to post where it waits
        mine.post_position(Position("waiting", 3, "backward", time.time(), "all-reduce"))
        time.sleep(3 * CHECK_S)  # several wake-ups of the thread
        assert mine.positions()[0].state == "waiting"
        pulse.beat(4, "forward")  # the next heartbeat releases the hold
        assert eventually(lambda: mine.positions()[0].step == 4)
        assert mine.positions()[0].state == "running"
    finally:
        pulse.close()


def test_closing_posts_the_last_beat_and_stops_the_thread() -> None:
    store = dist.HashStore()
    pulse = Pulse(board(store))
    pulse.beat(7, "forward")
    pulse.close()
    assert not pulse._thread.is_alive()
    assert board(store, rank=1).positions()[0].step == 7


def test_another_ranks_alert_is_seen_by_the_thread() -> None:
    store = dist.HashStore()
    pulse = Pulse(board(store))
    try:
        pulse.beat(1, "forward")
        assert not pulse.alerted
        board(store, rank=1).post_alert("ddpviz: boom on rank 1", [])
        assert eventually(lambda: pulse.alerted)
        assert pulse.error is None
    finally:
        pulse.close()


class CountingBoard:
    """A board that records the positions posted to it (and has no alerts)."""

    def __init__(self) -> None:
        self.posted: list[Position] = []

    def post_position(self, position: Position) -> None:
        self.posted.append(position)

    def has_alerts(self) -> bool:
        return False

    def news(self, add: int = 0) -> News:
        return News(0, 0, 0)


def test_steps_after_the_first_three_are_posted_at_most_every_post_s_the_latest_last() -> None:
    board_ = CountingBoard()
    pulse = Pulse(board_)  # type: ignore[arg-type]
    try:
        for step in range(EVERY_UNTIL):  # iteration 0 and the rebuild: each one posted
            pulse.beat(step, "forward")
            assert eventually(lambda s=step: bool(board_.posted) and board_.posted[-1].step == s)
        early = len(board_.posted)
        start = time.monotonic()
        step = EVERY_UNTIL
        while time.monotonic() - start < 10 * POST_S:  # a fast training loop
            pulse.beat(step, "forward")
            step += 1
        last = step - 1
        assert eventually(lambda: board_.posted[-1].step == last)  # the latest one lands
        elapsed = time.monotonic() - start
        later = len(board_.posted) - early
        assert step - EVERY_UNTIL > 1000  # thousands of beats ...
        assert later <= elapsed / POST_S + 3  # ... posted a few times (store round trips)
    finally:
        pulse.close()
