"""COPY frames (fileformat.py, [Note: the COPY frame]): the payloads every rank reports alike
written once and repeated by reference in the bytes a view sends, read back event for event."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.traces import copies
from ddpviz.traces.fileformat import COPY, EVENTS, FRAME, MAGIC, TailReader, TraceWriter
from ddpviz.traces.trace import Trace
from ddpviz.traces.view_bytes import trace_bytes
from ddpviz.traces.view_summary import summarized, summarized_bytes
from tests.widgets.streams import synthetic_run


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """(kind, payload) of every frame after the magic."""
    assert data[:len(MAGIC)] == MAGIC
    out, pos = [], len(MAGIC)
    while pos < len(data):
        kind, length, _ = FRAME.unpack_from(data, pos)
        pos += FRAME.size
        out.append((kind, data[pos:pos + length]))
        pos += length
    return out


def same_events(a: Trace, b: Trace) -> None:
    assert a.ranks == b.ranks
    for rank in a.ranks:
        left, right = a.events(rank), b.events(rank)
        assert len(left) == len(right)
        for x, y in zip(left, right, strict=True):
            assert type(x) is type(y)
            assert msgspec.structs.asdict(x) == msgspec.structs.asdict(y)


def big_run(world: int = 8, params: int = 300, steps: int = 3) -> Trace:
    return Trace(synthetic_run(world, params, steps), meta={"run": "copies"},
                 clock={r: (r * 10, 5) for r in range(world)})


def test_a_views_bytes_copy_the_payloads_every_rank_repeats_and_read_back_equal() -> None:
    trace = big_run()
    data, _ = trace_bytes(trace, limit=1 << 30)
    with tempfile.TemporaryDirectory() as folder:
        with TraceWriter(Path(folder) / "t.ddpviz", meta=trace.meta) as w:  # (no copies)
            w.write_ranks(trace.clock, (trace.events(r) for r in trace.ranks))
        plain = (Path(folder) / "t.ddpviz").read_bytes()
    kinds = [k for k, _ in frames(data)]
    assert COPY in kinds and COPY not in [k for k, _ in frames(plain)]
    # ranks 1-7's parameter lists (and bucket maps) are not written again
    built_bytes = len(msgspec.msgpack.encode(trace.of_type(ev.ParamsBuilt)[0]))
    assert len(plain) - len(data) > 7 * (built_bytes - 100)  # (less a copy entry and frame)
    back = Trace.from_bytes(data)
    same_events(trace, back)
    assert back == trace and back.meta == trace.meta and back.clock == trace.clock
    # the copies share the source's payload objects: memory is shared too
    built = back.of_type(ev.ParamsBuilt)
    assert len(built) == 8 and all(b.params is built[0].params for b in built)


def test_each_copy_entry_is_the_source_rank_and_seq_then_the_copys_own_fields() -> None:
    trace = big_run(world=3)
    data, _ = trace_bytes(trace, limit=1 << 30)
    entries = [e for k, p in frames(data) if k == COPY for e in msgspec.msgpack.decode(p)]
    firsts = {type(e): e for e in trace.events(0) if type(e) in copies.COPY_SOURCES
              and len(msgspec.msgpack.encode(e)) >= copies.MIN_BYTES}
    assert firsts  # ParamsBuilt and the bucket maps at least
    for e in (e for r in (1, 2) for e in trace.events(r) if type(e) in firsts):
        src = firsts[type(e)]
        assert [src.rank, src.seq, e.rank, e.step, e.t_ns, e.seq] in entries


def test_a_summarized_runs_bytes_hold_copies_and_read_back_as_the_summarized_trace() -> None:
    trace = big_run(world=6, params=200, steps=4)
    data, total, folded = summarized_bytes(trace)
    expected, folded_too = summarized(trace)
    assert folded == folded_too > 0 and total == len(expected)
    assert sum(k == COPY for k, _ in frames(data)) >= 5  # ranks 1-5 copy rank 0's payloads
    back = Trace.from_bytes(data)
    same_events(expected, back)


def test_the_order_of_a_ranks_events_holds_around_its_copies() -> None:
    """Events before and after a copy, within one write_many, keep their places."""
    trace = big_run(world=2, params=100, steps=2)
    events = [e for r in trace.ranks for e in trace.events(r)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.ddpviz"
        with TraceWriter(path, copies=True, chunk=7) as w:
            w.write_many(events)  # both ranks in one batch: copies mid-batch
        data = path.read_bytes()
    kinds = [k for k, _ in frames(data)]
    assert COPY in kinds and kinds.index(COPY) < len(kinds) - 1
    assert kinds[kinds.index(COPY) - 1] == EVENTS  # (the events before it flushed first)
    same_events(trace, Trace.from_bytes(data))


def test_a_different_event_at_a_sources_rank_and_seq_ends_that_source() -> None:
    """A reader takes the later event at a (rank, seq); the writer then copies neither."""
    params = synthetic_run(1, 100, 1)
    built = next(e for e in params if isinstance(e, ev.ParamsBuilt))
    other = msgspec.structs.replace(built, ignored=("x",))  # same (rank, seq), other payload
    again = msgspec.structs.replace(built, rank=1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.ddpviz"
        with TraceWriter(path, copies=True) as w:
            w.write_many([built, other, again])
        data = path.read_bytes()
    assert COPY not in [k for k, _ in frames(data)]
    back = Trace.from_bytes(data)
    assert back.events(0) == [built, other] and back.events(1) == [again]


def test_only_a_format_2_file_holds_copies(tmp_path: Path) -> None:
    """A format-1 reader of an older ddpviz skips kinds it does not know, so a file with COPY
    frames says format 2, which it refuses; a writer without copies or columns (a rank's
    sender) still writes format 1."""
    trace = big_run(world=3)
    saved = trace.save(tmp_path / "t.ddpviz").read_bytes()
    assert COPY in [k for k, _ in frames(saved)]
    with TraceWriter(tmp_path / "plain.ddpviz", meta=trace.meta) as w:
        w.write_ranks(trace.clock, (trace.events(r) for r in trace.ranks))
    plain = (tmp_path / "plain.ddpviz").read_bytes()
    assert COPY not in [k for k, _ in frames(plain)]
    formats = [msgspec.msgpack.decode(frames(d)[0][1])["format"] for d in (saved, plain)]
    assert formats == [2, 1]
    assert Trace.from_bytes(saved) == Trace.from_bytes(plain) == trace


def test_a_followed_file_resolves_its_copies_in_order() -> None:
    trace = big_run(world=3, params=100, steps=2)
    data, _ = trace_bytes(trace, limit=1 << 30)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.ddpviz"
        path.write_bytes(data)
        reader = TailReader(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            records = list(reader.read(fd, len(data), 1 << 30))
        finally:
            os.close(fd)
    got = Trace([e for r in records if isinstance(r, list) for e in r])
    same_events(trace, got)
    assert reader.events == len(trace)


@pytest.mark.parametrize("n", [1, 64])
def test_small_events_are_written_whole(n: int) -> None:
    """Below MIN_BYTES a copy saves nothing worth a frame."""
    events = [ev.BucketsRebuilt(rank=r, step=0, t_ns=r, seq=0, grad_ready_order=tuple(range(n)))
              for r in range(4)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.ddpviz"
        with TraceWriter(path, copies=True) as w:
            w.write_many(events)
        data = path.read_bytes()
    assert COPY not in [k for k, _ in frames(data)]
    assert Trace.from_bytes(data).events() == events


def test_a_copy_is_found_by_equal_payloads_whether_or_not_they_are_the_same_objects() -> None:
    """The writer knows a payload it encoded by its fields' identity (a loaded trace shares
    one list between ranks) and otherwise by its bytes: equal lists are copies either way, and
    a field outside the lists that differs (a constructor's map against a rebuilt one with the
    same buckets object) is never taken for the same payload."""
    buckets = tuple((i,) for i in range(400))
    limits = (4,) * 400

    def assigned(rank: int, buckets: tuple[tuple[int, ...], ...], rebuilt: bool,
                 ) -> ev.BucketAssigned:
        return ev.BucketAssigned(rank=rank, step=-1, t_ns=rank, seq=3, buckets=buckets,
                                 limits=limits, rebuilt=rebuilt)

    finder = copies.CopyFinder()
    assert finder.copy_of(assigned(0, buckets, False)) is None  # the first: written whole
    same = finder.copy_of(assigned(1, buckets, False))  # the same objects
    equal = finder.copy_of(assigned(2, tuple(tuple(b) for b in [list(x) for x in buckets]),
                                    False))  # equal, not the same objects
    assert same is not None and equal is not None
    assert (same.src_rank, same.rank) == (0, 1) and (equal.src_rank, equal.rank) == (0, 2)
    assert finder.copy_of(assigned(3, buckets, True)) is None  # rebuilt differs: whole
    other = tuple((i,) for i in range(1, 401))
    assert finder.copy_of(assigned(4, other, False)) is None  # other lists: whole
