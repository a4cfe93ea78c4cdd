"""Events written from their columns (tablebytes.py, TraceWriter.write_tables): the bytes
msgspec writes for the same events, byte for byte, frame for frame, COPY frames included."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import numpy as np
import pytest

from ddpviz import events as ev
from ddpviz.findings import Finding
from ddpviz.traces import copies as copies_mod
from ddpviz.traces import fileformat
from ddpviz.traces.columns import tables_of
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.tablebytes import encode_parts, encode_rows, min_bytes
from ddpviz.traces.trace import Trace
from ddpviz.traces.view_summary import summarized, summarized_bytes
from tests.traces.test_copy_frames import frames
from tests.widgets.streams import synthetic_run

# every msgpack integer width class, at and across each boundary
EDGES = [-(1 << 63), -(1 << 63) + 1, -(1 << 31) - 1, -(1 << 31), -32769, -32768, -129, -128,
         -33, -32, -1, 0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32,
         (1 << 63) - 1]


def msgspec_bytes(events: list[ev.Event]) -> bytes:
    return b"".join(msgspec.msgpack.encode(e) for e in events)


def hot_events(rank: int, values: list[int], rng: random.Random) -> list[ev.Event]:
    """Every hot type with each value in every integer field, dtypes short and long."""
    out: list[ev.Event] = []
    dtypes = ["torch.float32", "torch.bfloat16", "x" * 31, "y" * 32, "z" * 300, "é" * 20]
    for i, v in enumerate(values):
        w = rng.choice(values)
        out += [ev.GradReady(rank, v, w, i, v, w), ev.BucketReady(rank, w, v, i, v),
                ev.AllReduceDone(rank, v, v, i, w),
                ev.AllReduceLaunched(rank, v, w, i, w, v, rng.choice(dtypes)),
                ev.ForwardStarted(rank, v, w, i), ev.BackwardStarted(rank, w, v, i),
                ev.BackwardFinished(rank, v, v, v)]
    return out


def test_every_hot_type_and_integer_class_encodes_as_msgspec_does() -> None:
    rng = random.Random(3)
    for rank in (0, 5, 127, 128, 70_000):
        events = hot_events(rank, EDGES, rng)
        rng.shuffle(events)
        table = tables_of(events)[rank]
        got = encode_rows(table, np.arange(len(table)))
        assert bytes(got.data) == msgspec_bytes(events)
        # each row where its offsets say
        for i in rng.sample(range(len(events)), 20):
            raw = bytes(got.data[got.offsets[i]:got.offsets[i + 1]])
            assert raw == msgspec.msgpack.encode(events[i])


def test_rare_events_between_hot_ones_and_rows_in_any_order_encode_as_msgspec_does() -> None:
    rng = random.Random(4)
    events = list(synthetic_run(2, 40, 3))
    finding = Finding(kind="straggler", severity="warning", title="<b>&", ranks=(1,))
    events.append(ev.FindingReported(rank=1, step=2, t_ns=5, seq=10_000, finding=finding))
    tables = tables_of(events)
    for table in tables.values():
        mine = table.events()
        rows = np.array(rng.sample(range(len(table)), len(table) // 2), dtype=np.int64)
        got = encode_rows(table, rows)
        assert bytes(got.data) == msgspec_bytes([mine[i] for i in rows.tolist()])
        assert min_bytes(table) <= len(msgspec_bytes(
            [e for e in mine if type(e) in (ev.GradReady, ev.BucketReady, ev.AllReduceDone,
                                            ev.AllReduceLaunched, ev.ForwardStarted,
                                            ev.BackwardStarted, ev.BackwardFinished)]))
    # several tables in one pass: their rows concatenated, dtype strings of each its own
    parts = [(t, np.arange(len(t))) for t in tables.values()]
    both = encode_parts(parts)
    assert bytes(both.data) == b"".join(msgspec_bytes(t.events()) for t in tables.values())


def run(world: int = 4, params: int = 150, steps: int = 3) -> Trace:
    return Trace(synthetic_run(world, params, steps), meta={"run": "tables"},
                 clock={r: (r * 7, 3) for r in range(world)})


@pytest.mark.parametrize("copies", [False, True])
@pytest.mark.parametrize(("chunk", "rows", "max_copies"), [(4096, 1 << 16, 1 << 17), (7, 16, 2),
                                                           (1, 5, 1), (50, 1 << 16, 3)])
def test_the_writer_writes_tables_as_it_writes_their_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copies: bool, chunk: int, rows: int,
        max_copies: int) -> None:
    monkeypatch.setattr(fileformat, "ENCODE_ROWS", rows)
    monkeypatch.setattr(fileformat, "MAX_COPIES", max_copies)
    monkeypatch.setattr(copies_mod, "MIN_BYTES", 64)  # (small runs' payloads copied too)
    trace = run()
    tables = list(trace.columns().values())
    with TraceWriter(tmp_path / "a.ddpviz", meta=trace.meta, chunk=chunk, copies=copies) as w:
        w.write_ranks(trace.clock, (t.events() for t in tables))
        events_count = w.count
    with TraceWriter(tmp_path / "b.ddpviz", meta=trace.meta, chunk=chunk, copies=copies) as w:
        w.write_ranks(trace.clock, tables)
        assert w.count == events_count
    # events and tables mixed, and an empty rank
    with TraceWriter(tmp_path / "c.ddpviz", meta=trace.meta, chunk=chunk, copies=copies) as w:
        w.write_ranks(trace.clock, [tables[0], tables[1].events(), tables[2], [], tables[3]])
    a, b, c = ((tmp_path / f"{n}.ddpviz").read_bytes() for n in "abc")
    assert a == b == c
    assert (fileformat.COPY in [kind for kind, _ in frames(b)]) == copies
    assert Trace.from_bytes(b) == trace


def test_save_and_a_summarized_view_write_from_the_columns_and_read_back_equal(
        tmp_path: Path) -> None:
    trace = run(world=5, params=300, steps=4)
    back = Trace.load(trace.save(tmp_path / "t.ddpviz"))
    assert back == trace and back.clock == trace.clock and back.meta == trace.meta
    data, events, folded = summarized_bytes(trace)
    expected, folded_too = summarized(trace)
    assert folded == folded_too > 0 and events == len(expected)
    assert Trace.from_bytes(data) == expected
