"""The hang watchdog with ranks as threads sharing one in-memory store and collectives as
futures that never complete (or fail): who is named, with what, and how fast."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddpviz import events as ev
from ddpviz.errors import RankHangError
from ddpviz.events import Tap
from ddpviz.findings import Finding
from ddpviz.probes.watchdog import Watchdog, resolve_hang_timeout
from tests.probes.ranks_in_threads import FakeGroup, in_threads


def dog(rank: int, store: dist.Store, world_size: int = 2, timeout: float | None = 0.5,
        events: list[Any] | None = None) -> Watchdog:
    tap = Tap(events.append if events is not None else None, rank=rank)
    return Watchdog(FakeGroup(rank, world_size), timeout=timeout, tap=tap,  # type: ignore[arg-type]
                    store=store)


def never() -> torch.futures.Future:
    return torch.futures.Future()


def test_a_lagging_rank_is_named_with_where_it_was_last_seen_on_every_rank() -> None:
    events: list[Any] = []

    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store, events=events)
        d.start()
        if rank == 1:
            d.heartbeat(1, "forward")
            time.sleep(2.5)  # lagging; then it finally reaches the all-reduce
            d.wait(never(), collective="all-reduce", bucket=0, params=["fc.weight"])
        d.heartbeat(2, "forward")
        start = time.monotonic()
        try:
            d.wait(never(), collective="all-reduce", bucket=0, params=["fc.weight", "fc.bias"])
        except RankHangError as exc:
            return exc, time.monotonic() - start
        return None

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    err0, waited = results[0]
    err1 = results[1]
    assert isinstance(err0, RankHangError) and isinstance(err1, RankHangError)
    assert str(err1) == str(err0)  # the laggard gets the same verdict when it arrives
    assert waited < 0.5 + 1.0 + 1.0  # timeout + grace + slack, nowhere near gloo's 30 min
    lines = str(err0).splitlines()
    assert lines[0] == ("ddpviz: rank 1 did not reach the all-reduce of bucket 0 at step 2 "
                        "within 0.5s (world_size=2):")
    assert lines[1].startswith("  rank 0: waiting in the all-reduce of bucket 0 at step 2 for "
                               "'fc.weight', 'fc.bias' (")
    assert lines[2].startswith("  rank 1: last seen at step 1 (forward, ")
    assert "uneven inputs" in lines[-1]
    (finding,) = err0.findings
    assert finding.matches(kind="rank_hang", ranks=(1,), bucket=0, step=2, name="fc.weight",
                           field="all-reduce")
    assert err0.positions[1]["step"] == 1
    reported = [e.finding for e in events if isinstance(e, ev.FindingReported)]
    live = [f for f in reported if f.kind == "rank_waiting"]
    assert [f for f in reported if f.kind != "rank_waiting"] == [finding, finding]  # once a rank
    # Before the deadline, live: rank 0 waits for rank 1 (a quarter of the deadline in).
    assert [(f.ranks, f.step, f.bucket, f.severity) for f in live] == [((1,), 2, 0, "warning")]
    assert reported.index(live[0]) < reported.index(finding)


def test_ranks_waiting_in_different_collectives_are_told_so() -> None:
    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store)
        d.start()
        d.heartbeat(3 if rank == 0 else 2, "forward")
        try:
            d.wait(never(), collective="all-reduce" if rank == 0 else "broadcast",
                   bucket=0 if rank == 0 else -1)
        except RankHangError as exc:
            return exc
        return None

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    assert str(results[0]) == str(results[1])
    (finding,) = results[0].findings
    assert finding.kind == "collective_mismatch"
    first, second = (v for v, _ in finding.values)
    assert first.startswith("waiting in the all-reduce of bucket 0 at step 3")
    assert second.startswith("waiting in the broadcast at step 2")


def test_a_failed_collective_names_the_rank_that_went_away() -> None:
    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store, timeout=30)
        d.start()
        d.heartbeat(1, "forward")
        if rank == 1:
            return None  # exits after step 1
        fut = never()
        threading.Timer(0.2, lambda: fut.set_exception(
            RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234"))).start()
        d.heartbeat(2, "forward")
        start = time.monotonic()
        try:
            d.wait(fut, collective="all-reduce", bucket=1, params=["fc.bias"])
        except RankHangError as exc:
            return exc, time.monotonic() - start
        return None

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    err, waited = results[0]
    assert waited < 5  # the grace for others to speak up, not the 30 s timeout
    (finding,) = err.findings
    assert finding.matches(kind="rank_exited", ranks=(1,), bucket=1, step=2, name="fc.bias")
    assert finding.values[0][0] == ("failed in the all-reduce of bucket 1 at step 2 for "
                                    "'fc.bias': Connection closed by peer [127.0.0.1]:1234")
    assert finding.values[1][0].startswith("gone; last seen at step 1 (forward, ")
    assert str(err).startswith("ddpviz: rank 1 closed its connection while rank 0 waited in "
                               "the all-reduce of bucket 1 at step 2: it exited or crashed")


def test_an_error_on_another_rank_stops_the_waiting_rank_at_once_with_its_findings() -> None:
    planted = Finding(kind="hook_fired_twice", severity="error", title="param 'w' twice",
                      name="w", ranks=(1,), world_size=2)

    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store, timeout=60)
        d.start()
        if rank == 1:
            time.sleep(0.3)
            d.fail("ddpviz: parameter 'w' was marked ready twice on rank 1", [planted])
            return None
        d.heartbeat(0, "forward")
        start = time.monotonic()
        try:
            d.wait(never(), collective="all-reduce", bucket=0)
        except RankHangError as exc:
            return exc, time.monotonic() - start
        return None

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    err, waited = results[0]
    assert waited < 2  # polled, not the 60 s timeout
    peer, carried = err.findings
    assert carried == planted
    assert peer.matches(kind="peer_failed", ranks=(1,))
    assert str(err).splitlines()[0] == (
        "ddpviz: rank 1 failed while rank 0 was waiting in the all-reduce of bucket 0 at step 0 "
        "(world_size=2):")
    assert "  ddpviz: parameter 'w' was marked ready twice on rank 1" in str(err).splitlines()


def test_the_next_heartbeat_stops_a_rank_after_another_failed() -> None:
    store = dist.HashStore()

    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store)
        d.start()
        return d

    dogs = in_threads(rank_fn, [0, 1], store)
    d0, d1 = dogs[0], dogs[1]
    d0.heartbeat(0, "forward")  # nobody failed yet: a plain heartbeat
    d1.fail("ddpviz: boom on rank 1", [])
    # The pulse thread looks for alerts every CHECK_S; a heartbeat after that raises. The
    # deadline is generous (a loaded machine), the assertion is that it raises, and how.
    deadline = time.monotonic() + 60
    with pytest.raises(RankHangError, match="rank 1 failed, so rank 0 stops before the "
                       "collectives of step 1"):
        while time.monotonic() < deadline:
            d0.heartbeat(1, "forward")
            time.sleep(0.05)


def test_a_completed_collective_and_a_disabled_watchdog_are_plain_waits() -> None:
    d = dog(0, dist.HashStore(), timeout=None)
    d.start()
    assert d.board is None and not d.enabled
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(1)
    d.wait(fut, collective="all-reduce")
    failed: torch.futures.Future = torch.futures.Future()
    failed.set_exception(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        d.wait(failed, collective="all-reduce")


def test_hang_timeout_comes_from_the_argument_then_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPVIZ_HANG_TIMEOUT", raising=False)
    assert resolve_hang_timeout(None) == 300.0
    assert resolve_hang_timeout(5) == 5.0
    assert resolve_hang_timeout(0) is None
    monkeypatch.setenv("DDPVIZ_HANG_TIMEOUT", "12.5")
    assert resolve_hang_timeout(None) == 12.5
    monkeypatch.setenv("DDPVIZ_HANG_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="DDPVIZ_HANG_TIMEOUT='soon'"):
        resolve_hang_timeout(None)


def test_every_rank_agrees_on_which_parameters_got_no_gradient() -> None:
    names = ["a.weight", "a.bias", "spare.weight", "spare.bias"]
    shapes = [(8, 8), (8,), (8, 8), (8,)]

    def rank_fn(rank: int, store: dist.Store) -> Any:
        d = dog(rank, store, timeout=5)
        d.start()
        return d.agree_on_unused(0, [2, 3] if rank == 1 else [], [2] if rank == 1 else [],
                                 names, shapes)

    results = in_threads(rank_fn, [0, 1], dist.HashStore())
    assert results[0] == results[1]
    message, findings = results[0]
    assert [(f.kind, f.name, f.ranks, f.field, f.values) for f in findings] == [
        ("unused_parameter", "spare.weight", (1,), "unused",
         (("got its gradient", (0,)), ("not used in forward", (1,)))),
        ("unused_parameter", "spare.bias", (1,), "unused",
         (("got its gradient", (0,)), ("no gradient reached it in backward", (1,))))]
    assert message.splitlines()[:3] == [
        "ddpviz: 2 of 4 parameters got no gradient on rank 1 at step 0 "
        "(find_unused_parameters=False, world_size=2):",
        "  parameter 2 'spare.weight' (8, 8): not used in forward on rank 1",
        "  parameter 3 'spare.bias' (8,): no gradient reached it in backward on rank 1"]
    none = in_threads(lambda r, s: (d := dog(r, s, timeout=5), d.start(),
                                    d.agree_on_unused(0, [], [], names, shapes))[2],
                      [0, 1], dist.HashStore())
    assert none == {0: ("", ()), 1: ("", ())}


def test_reassigned_and_removed_buffers_are_reported_once() -> None:
    from ddpviz.engine.buffer_identity import BufferIdentity

    check = BufferIdentity(rank=1, world_size=2)
    stats, count = torch.zeros(3), torch.zeros(1)
    assert check.check({"stats": stats, "count": count}, -1) == []
    assert check.check({"stats": stats, "count": count}, 0) == []  # updated in place
    (reassigned,) = check.check({"stats": stats * 0.9, "count": count}, 1)
    assert reassigned.matches(kind="buffer_reassigned", name="stats", ranks=(1,), step=1,
                              field="identity", values=(("reassigned", (1,)),))
    assert reassigned.title == "buffer 'stats' was replaced by a new tensor before step 1 on rank 1"
    assert check.check({"stats": stats * 0.8, "count": count}, 2) == []  # once per buffer
    (gone,) = check.check({"stats": stats}, 3)
    assert gone.matches(name="count", values=(("gone", (1,)),))


@pytest.mark.parametrize(("text", "expected"), [
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting "
     "15000ms for send operation to complete", True),
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Application timeout caused "
     "pair closure", True),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
     "OpType=ALLREDUCE, NumelIn=466119168) ran for 600012 milliseconds before timing out.", True),
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[127.0.0.1]:4321", False),
    ("Connection reset by peer", False),
])
def test_the_backends_own_timeouts_are_told_from_a_peer_that_left(text: str,
                                                                  expected: bool) -> None:
    # A timeout ends a wait for a rank that is alive and behind (a hang); a closed connection
    # is a rank that exited. The verdicts differ.
    from ddpviz.probes.watchdog import timed_out

    assert timed_out(RuntimeError(text)) is expected
