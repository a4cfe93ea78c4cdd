"""Volume: 4 rank processes x 250k events each reach one collector with no gap and no loss."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.transport import Collector, Sender

pytestmark = pytest.mark.dist

RANKS = 4
PER_RANK = 250_000


def _produce(connect: str, rank: int, n: int, results: Any) -> None:
    # The buffer holds a whole run: this test is about the transport losing nothing, not
    # about overload (test_sender covers that).
    sender = Sender(connect, rank, capacity=n + 16, batch=2048)
    tap = ev.Tap(sender, rank)
    for i in range(n):
        tap.emit(ev.GradReady, i % 997, i % 13)
    sender.close(timeout=120)
    results.put((rank, tuple(sender.stats), repr(sender.error)))


def test_four_ranks_quarter_million_events_each_arrive_without_gaps():
    received: dict[int, int] = {}
    out_of_order: list[tuple[int, int, int]] = []

    def check(batch: list[ev.Event]) -> None:  # independent of the collector's own counting
        for e in batch:
            expected = received.get(e.rank, 0)
            if e.seq != expected and len(out_of_order) < 10:
                out_of_order.append((e.rank, expected, e.seq))
            received[e.rank] = expected + 1

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with Collector() as collector:
        collector.subscribe(check, batch=True)
        procs = [ctx.Process(target=_produce, args=(collector.connect_string, r, PER_RANK,
                                                    results), daemon=True)
                 for r in range(RANKS)]
        for p in procs:
            p.start()
        try:
            reports = [results.get(timeout=150) for _ in range(RANKS)]
            assert collector.wait(lambda s: len(s.closed) == RANKS, timeout=60)
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        stats = collector.stats
    for rank, (sent, markers, dropped, _), error in reports:
        assert (sent, markers, dropped, error) == (PER_RANK, 0, 0, "None"), rank
    assert out_of_order == []
    assert received == dict.fromkeys(range(RANKS), PER_RANK)
    assert stats.received == dict.fromkeys(range(RANKS), PER_RANK)
    assert stats.gaps == dict.fromkeys(range(RANKS), 0)
    assert stats.dropped == stats.reordered == stats.lost_frames == dict.fromkeys(range(RANKS), 0)
    assert stats.closed == dict.fromkeys(range(RANKS), (PER_RANK, 0))
    assert stats.total_rejected == 0
