"""The constructor's state sync as the EventModel folds it (what the dashboard's broadcast panel
shows): bytes done, chunks in flight (never more than 2), the verification exchange first and
a broadcast skipped follow the BroadcastStarted/ChunkSent/ChunkDone/Finished events at every
instant, and a declared chunk count is a count, never a loop. (Moved from
tests/widgets/test_broadcast_progress.py and tests/security/test_widget_products.py when the
kernel-drawn BroadcastProgress gave way to the TS front end: issue #40.)"""

from __future__ import annotations

from pathlib import Path

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel, RankState
from ddpviz.model.rank_groups import value_groups
from ddpviz.traces.trace import Trace
from tests.security.bombs import broadcast_chunks, write
from tests.widgets.streams import synthetic_run


def model_of(events: list[ev.Event] | Trace) -> EventModel:
    model = EventModel()
    model.feed(events)
    return model


def bytes_done(s: RankState) -> int:
    return sum(t.event.nbytes for t in s.chunks_done.values()  # type: ignore[attr-defined]
               if isinstance(t.event, ev.BroadcastChunkDone))


def in_flight(s: RankState) -> tuple[int, ...]:
    return tuple(sorted(s.chunks_sent.keys() - s.chunks_done.keys()))


def started(s: RankState) -> ev.BroadcastStarted:
    assert s.broadcast_started is not None
    e = s.broadcast_started.event
    assert isinstance(e, ev.BroadcastStarted)
    return e


def test_a_finished_broadcast_is_full_on_every_rank() -> None:
    events = synthetic_run(3, 8, 0, chunk_bytes=1024)
    states = model_of(events).construction()
    for e in (e for e in events if isinstance(e, ev.BroadcastStarted)):
        s = states[e.rank]
        assert s.broadcast_finished is not None and isinstance(
            s.verify_result and s.verify_result.event, ev.VerificationPassed)
        assert bytes_done(s) == started(s).total_bytes == e.total_bytes
        assert len(s.chunks_done) == started(s).n_chunks == e.n_chunks == 8
        assert in_flight(s) == ()
        assert started(s).src == 0  # rank 0 sends, the others receive from it


def test_every_prefix_of_the_stream_shows_what_was_done_and_in_flight() -> None:
    events = [e for e in synthetic_run(2, 10, 0, chunk_bytes=1024) if e.rank == 1]
    m = EventModel()
    sent: set[int] = set()
    done: dict[int, int] = {}
    for e in events:
        m.feed([e])
        if isinstance(e, ev.BroadcastChunkSent):
            sent.add(e.chunk)
        elif isinstance(e, ev.BroadcastChunkDone):
            done[e.chunk] = e.nbytes
        s = m.construction()[1]
        assert bytes_done(s) == sum(done.values())
        assert set(in_flight(s)) == sent - set(done)
        assert len(in_flight(s)) <= 2  # torch's _broadcast_coalesced keeps 2 in flight at most


def test_a_cut_in_time_replays_the_broadcast_chunk_by_chunk() -> None:
    events = synthetic_run(2, 10, 1, chunk_bytes=1024)
    model = model_of(events)
    second_done = [e for e in events if isinstance(e, ev.BroadcastChunkDone)
                   and e.rank == 0][1]
    s = model.construction(second_done.t_ns)[0]
    assert s.broadcast_started is not None and s.broadcast_finished is None
    assert len(s.chunks_done) == 2 and bytes_done(s) == 1024 + 64
    assert in_flight(s) == (2,)
    chunk = s.chunks_sent[2].event
    assert isinstance(chunk, ev.BroadcastChunkSent)
    assert (chunk.dtype, chunk.nbytes) == ("float32", 1024)
    assert max(t.t for t in s.chunks_done.values()) > s.broadcast_started.t  # a rate exists
    fourth_sent = next(e for e in events if isinstance(e, ev.BroadcastChunkSent)
                       and e.rank == 0 and e.chunk == 3)
    s = model.construction(fourth_sent.t_ns)[0]
    assert in_flight(s) == (2, 3)
    assert s.chunks_sent[3].event.nbytes == 64  # type: ignore[attr-defined]


def test_the_verification_exchange_comes_first() -> None:
    events = [e for e in synthetic_run(2, 4, 0) if isinstance(
        e, (ev.ParamsBuilt, ev.VerificationStarted))]
    states = model_of(events).construction()
    assert len(states) == 2
    for s in states.values():  # exchanging, broadcast waiting
        assert s.verify_started is not None and s.verify_result is None
        assert s.broadcast_started is None and s.maps == [] and bytes_done(s) == 0


def test_assigning_buckets_without_a_broadcast_is_a_skipped_broadcast() -> None:
    events = [e for e in synthetic_run(1, 4, 0) if not isinstance(
        e, (ev.VerificationStarted, ev.VerificationPassed, ev.BroadcastStarted,
            ev.BroadcastChunkSent, ev.BroadcastChunkDone, ev.BroadcastFinished))]
    s = model_of(events).construction()[0]
    assert s.broadcast_started is None and s.maps  # init_sync=False


def test_at_256_ranks_the_finished_broadcast_is_the_sender_and_the_receivers() -> None:
    events = synthetic_run(256, 10, 0, chunk_bytes=1024)
    model = model_of(events)
    states = model.construction()
    groups = value_groups({r: (started(s).src == r, bytes_done(s), s.broadcast_finished
                               is not None) for r, s in states.items()})
    assert [(g.label, len(g.ranks)) for g in groups] == [("1-255", 255), ("0", 1)]
    assert {bytes_done(s) == started(s).total_bytes for s in states.values()} == {True}
    # half-way on rank 128: ranks started 7 us apart are at different chunks, every rank in
    # one state or another
    cut = [e for e in events if isinstance(e, ev.BroadcastChunkDone) and e.rank == 128][1]
    states = model.construction(cut.t_ns)
    assert len(states) == 256 and len(states[128].chunks_done) == 2
    assert len({len(s.chunks_done) for s in states.values()}) > 1


def test_declared_chunks_are_a_count_and_only_the_chunks_with_events_are_held(
        tmp_path: Path) -> None:
    states = model_of(Trace.load(write(tmp_path / "b.ddpviz", broadcast_chunks(40)))
                      ).construction()
    assert len(states) == 40
    s = states[3]
    assert started(s).n_chunks == 65_536
    assert s.chunks_sent == {} and s.chunks_done == {}
