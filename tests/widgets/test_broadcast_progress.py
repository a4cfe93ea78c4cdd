"""BroadcastProgress: bytes done, chunks in flight (never more than 2), rates and the bars'
values follow the BroadcastStarted/ChunkSent/ChunkDone/Finished events at every instant."""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.widgets import BroadcastProgress
from ddpviz.widgets.broadcast_progress import rank_broadcast
from tests.widgets.streams import synthetic_run


def test_a_finished_broadcast_is_full_on_every_rank() -> None:
    events = synthetic_run(3, 8, 0, chunk_bytes=1024)
    b = BroadcastProgress(events)
    started = [e for e in events if isinstance(e, ev.BroadcastStarted)]
    assert {p.state for p in b.progress.values()} == {"done"}
    for e in started:
        p = b.progress[e.rank]
        assert p.bytes_done == p.total_bytes == e.total_bytes
        assert p.chunks_done == p.n_chunks == e.n_chunks == 8
        assert p.in_flight == () and p.verification == "passed"
        assert b.bars[e.rank].value == 1.0 and b.bars[e.rank].bar_style == "success"
    assert "sends:" in b.labels[0].value and "receives from rank 0:" in b.labels[1].value
    assert b.chunks_html.value.count("done ") == 8 * 3


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
        p = rank_broadcast(m.construction()[1])
        assert p.bytes_done == sum(done.values())
        assert set(p.in_flight) == sent - set(done)
        assert len(p.in_flight) <= 2  # torch's _broadcast_coalesced keeps 2 in flight at most


def test_the_time_slider_replays_the_broadcast_chunk_by_chunk() -> None:
    events = synthetic_run(2, 10, 1, chunk_bytes=1024)
    b = BroadcastProgress(events)
    assert b.controls is not None
    second_done = [e for e in events if isinstance(e, ev.BroadcastChunkDone)
                   and e.rank == 0][1]
    b.controls.seek(second_done.t_ns)
    p = b.progress[0]
    assert p.state == "broadcasting" and p.chunks_done == 2
    assert p.bytes_done == 1024 + 64
    assert b.bars[0].value == (1024 + 64) / p.total_bytes
    assert p.in_flight == (2,) and "in flight: #2 (float32 1.0 KiB)" in b.labels[0].value
    assert p.bytes_per_s is not None and p.bytes_per_s > 0
    fourth_sent = next(e for e in events if isinstance(e, ev.BroadcastChunkSent)
                       and e.rank == 0 and e.chunk == 3)
    b.controls.seek(fourth_sent.t_ns)
    assert b.progress[0].in_flight == (2, 3)
    assert "in flight: #2 (float32 1.0 KiB), #3 (float32 64 B)" in b.labels[0].value


def test_the_verification_exchange_comes_first() -> None:
    events = [e for e in synthetic_run(2, 4, 0) if isinstance(
        e, (ev.ParamsBuilt, ev.VerificationStarted))]
    b = BroadcastProgress(events)
    assert {p.verification for p in b.progress.values()} == {"exchanging"}
    assert {p.state for p in b.progress.values()} == {"waiting"}
    assert "(2 ranks: 2 exchanging)" in b.exchange_html.value
    assert b.bars[0].value == 0.0


def test_assigning_buckets_without_a_broadcast_reads_as_skipped() -> None:
    events = [e for e in synthetic_run(1, 4, 0) if not isinstance(
        e, (ev.VerificationStarted, ev.VerificationPassed, ev.BroadcastStarted,
            ev.BroadcastChunkSent, ev.BroadcastChunkDone, ev.BroadcastFinished))]
    b = BroadcastProgress(events)
    assert b.progress[0].state == "skipped"
    assert "init_sync=False" in b.labels[0].value


def test_at_256_ranks_ranks_in_the_same_state_share_a_bar_and_progress_has_percentiles(
        ) -> None:
    from ddpviz.model.rank_groups import percentile

    events = synthetic_run(256, 10, 0, chunk_bytes=1024)
    b = BroadcastProgress(events)
    assert b.grouped and b.bars == {}
    # finished: the sender and the 255 receivers, two bars
    assert [(g.label, len(g.ranks)) for g in b.groups] == [("0", 1), ("1-255", 255)]
    assert len(b.group_bars) == 2 and all(bar.value == 1.0 for bar in b.group_bars)
    assert "255 ranks 1-255" in b.group_heads[1].value
    assert "done across 256 ranks: min 100%" in b.summary_html.value
    # half-way on rank 128: ranks started 7 us apart are at different chunks
    cut = [e for e in events if isinstance(e, ev.BroadcastChunkDone) and e.rank == 128][1]
    assert b.controls is not None
    b.controls.seek(cut.t_ns)
    done = {r: p.chunks_done for r, p in b.progress.items()}
    for g in b.groups:  # a group's ranks really are in one state
        assert len({(done[r], b.progress[r].in_flight) for r in g.ranks}) == 1
    assert sorted(r for g in b.groups for r in g.ranks) == list(range(256))
    fractions = sorted(p.fraction * 100 for p in b.progress.values())
    assert f"median {percentile(fractions, 50):.0f}%" in b.summary_html.value
    assert f"p90 {percentile(fractions, 90):.0f}%" in b.summary_html.value
    # the chunk table: one column per group of ranks whose chunks are in the same states
    columns = b.chunk_columns(b.shown_chunks())
    assert len(columns) < 32 and sorted(r for g in columns for r in g) == list(range(256))
    assert b.chunks_html.value.count("<th title=") == len(columns)


def test_up_to_16_ranks_keep_a_bar_per_rank() -> None:
    b = BroadcastProgress(synthetic_run(16, 6, 0))
    assert not b.grouped and sorted(b.bars) == list(range(16)) and b.summary_html.value == ""
