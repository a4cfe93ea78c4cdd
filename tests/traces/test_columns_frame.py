"""COLUMNS frames (columnframe.py, [Note: the COLUMNS frame]): Trace.save writes a rank's hot
events as integer columns and reads them back event for event, through every reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.traces import columnframe
from ddpviz.traces.columnframe import COLUMNS, decode_columns, encode_columns
from ddpviz.traces.columns import CODE, tables_of
from ddpviz.traces.fileformat import EVENTS, TraceWriter, read_trace
from ddpviz.traces.trace import Trace
from tests.traces.tailed import tailed_events
from tests.traces.test_copy_frames import frames, same_events
from tests.widgets.streams import synthetic_run


def run(world: int = 3, params: int = 120, steps: int = 3) -> Trace:
    return Trace(synthetic_run(world, params, steps), meta={"run": "columns"},
                 clock={r: (r * 11, 2) for r in range(world)})


def test_save_writes_the_hot_events_as_columns_and_loads_them_back_equal(tmp_path: Path) -> None:
    trace = run()
    data = trace.save(tmp_path / "t.ddpviz").read_bytes()
    kinds = [k for k, _ in frames(data)]
    assert COLUMNS in kinds and EVENTS in kinds  # (the rare events stay msgpack)
    back = Trace.from_bytes(data)
    same_events(trace, back)
    assert back == trace and back.clock == trace.clock and back.meta == trace.meta
    # a third of the bytes of the same events as msgpack maps
    with TraceWriter(tmp_path / "plain.ddpviz", meta=trace.meta) as w:
        w.write_ranks(trace.clock, (trace.events(r) for r in trace.ranks))
    assert len(data) < 0.6 * (tmp_path / "plain.ddpviz").stat().st_size


def test_every_reader_reads_the_same_events(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnframe, "COLUMN_CHUNK", 50)  # runs split over several frames
    import ddpviz.traces.fileformat as fileformat
    monkeypatch.setattr(fileformat, "COLUMN_CHUNK", 50)
    trace = run(world=2, params=60, steps=2)
    path = trace.save(tmp_path / "t.ddpviz")
    assert sum(k == COLUMNS for k, _ in frames(path.read_bytes())) > 4
    # read_trace without column codes: event objects, in file order per rank
    objects = [e for rec in read_trace(path) if isinstance(rec, list) for e in rec]
    assert Trace(objects, meta=trace.meta, clock=trace.clock) == trace
    # TailReader (a followed folder)
    assert Trace(tailed_events(path), meta=trace.meta, clock=trace.clock) == trace


def test_extreme_values_and_every_hot_type_round_trip() -> None:
    big = limits.MAX_COUNT
    events: list[ev.Event] = [
        ev.GradReady(7, -1, -big, 0, 0, 0),
        ev.GradReady(7, limits.MAX_STEP, big, big, limits.MAX_PARAMS - 1,
                     limits.MAX_BUCKETS - 1),
        ev.AllReduceLaunched(7, 3, 5, 1, limits.MAX_BUCKETS - 1, limits.MAX_BYTES, "x" * 300),
        ev.AllReduceLaunched(7, 3, 6, 2, 0, 0, "torch.bfloat16"),
        ev.AllReduceLaunched(7, 3, 7, 3, 1, 9, "x" * 300),
        ev.BucketReady(7, 2, 3, 4, 5), ev.AllReduceDone(7, 2, 3, 4, 6),
        ev.ForwardStarted(7, 1, 2, 3), ev.BackwardStarted(7, 1, 2, 3),
        ev.BackwardFinished(7, 1, 2, 3)]
    table = tables_of(events)[7]
    payload = encode_columns(table, np.arange(len(table)))
    got = decode_columns(payload, CODE)
    assert columnframe.events_of(got, CODE) == events
    assert got.strings == ("x" * 300, "torch.bfloat16")  # in order of first use, each once


def test_short_hot_runs_between_rare_events_stay_event_frames(tmp_path: Path) -> None:
    events: list[ev.Event] = []
    for i in range(200):  # a rare event after every 3 hot ones
        events += [ev.ForwardStarted(0, i, 4 * i, 4 * i),
                   ev.BackwardStarted(0, i, 4 * i, 4 * i + 1),
                   ev.BackwardFinished(0, i, 4 * i, 4 * i + 2),
                   ev.OptimizerStepStarted(0, i, 4 * i, 4 * i + 3)]
    events += [ev.ForwardStarted(0, 200 + i, i, 800 + i) for i in range(100)]  # and a long run
    trace = Trace(events)
    data = trace.save(tmp_path / "t.ddpviz").read_bytes()
    kinds = [k for k, _ in frames(data)]
    assert kinds.count(COLUMNS) == 1  # the long run only
    assert Trace.from_bytes(data) == trace


def test_a_views_bytes_hold_columns_and_read_back_equal() -> None:
    from ddpviz.traces.view_bytes import trace_bytes

    trace = run(world=2, params=200, steps=2)
    data, _ = trace_bytes(trace, limit=1 << 30)
    assert COLUMNS in [k for k, _ in frames(data)]
    assert Trace.from_bytes(data) == trace


def test_summaries_are_saved_in_wide_frames_as_format_3_and_read_back_equal(
        tmp_path: Path) -> None:
    """A run holding GradsSummarized events (a view's summary, or recorded at detail "buckets")
    is saved with them in wide COLUMNS frames, format 3; a run without stays format 2 (an older
    reader reads it). Every reader reads the same events."""
    from ddpviz.traces.fileformat import FileHeader
    from ddpviz.traces.view_summary import summarized
    plain = run()
    folded, n = summarized(plain)
    assert n > 0
    for trace, fmt in ((plain, 2), (folded, 3)):
        path = trace.save(tmp_path / f"f{fmt}.ddpviz")
        header = next(r for r in read_trace(path) if isinstance(r, FileHeader))
        assert header.format == fmt
        assert Trace.load(path) == trace
        got = tailed_events(path)
        assert sorted(got, key=lambda e: (e.rank, e.seq)) == sorted(
            trace.events(), key=lambda e: (e.rank, e.seq))
    data = (tmp_path / "f3.ddpviz").read_bytes()
    summaries = [e for r in folded.ranks for e in folded.events(r)
                 if type(e) is ev.GradsSummarized]
    held = [e for kind, payload in frames(data) if kind == COLUMNS
            for e in decode_columns(payload, CODE).rare.values()]
    # (a run of fewer than MIN_COLUMN_RUN hot rows between rare events stays event maps)
    assert all(type(e) is ev.GradsSummarized for e in held)
    assert len(held) > 0.8 * len(summaries) and all(e in summaries for e in held)


def test_loaded_columns_are_int64_whatever_width_the_file_gave(tmp_path: Path) -> None:
    """A COLUMNS frame's columns stay as narrow as the file holds them until a rank's blocks are
    joined: the tables read int64 (kind uint8, s int32) and hold the same values."""
    trace = run()
    back = Trace.load(trace.save(tmp_path / "t.ddpviz"))
    data = (tmp_path / "t.ddpviz").read_bytes()
    narrow = [decode_columns(p, CODE) for k, p in frames(data) if k == COLUMNS]
    assert any(c.a.dtype.itemsize < 8 for c in narrow)  # (the file's widths, kept)
    for rank, table in back.columns().items():
        assert (table.kind.dtype, table.s.dtype) == (np.uint8, np.int32)
        assert all(getattr(table, n).dtype == np.int64 for n in ("step", "t", "seq", "a", "b"))
        mine = trace.columns()[rank]
        for name in ("kind", "step", "t", "seq", "a", "b", "s"):
            assert np.array_equal(getattr(table, name), getattr(mine, name)), name


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_check_and_the_rule_by_rule_check_agree(seed: int) -> None:
    """[Note: checking a COLUMNS frame fast]: on frames with values at, inside and past every
    bound (random kinds, widths of 6 and 9), the fast check passes a frame exactly when the
    rule-by-rule check finds nothing broken."""
    rng = np.random.default_rng(seed)
    edges = [0, 1, -1, -2, limits.MAX_PARAMS - 1, limits.MAX_PARAMS, limits.MAX_BUCKETS - 1,
             limits.MAX_BUCKETS, limits.MAX_STEP, limits.MAX_STEP + 1, limits.MAX_COUNT,
             limits.MAX_COUNT + 1, -limits.MAX_COUNT, -limits.MAX_COUNT - 1, limits.MAX_BYTES,
             -(1 << 63)]
    agreed = {True: 0, False: 0}
    for _ in range(400):
        wide = bool(rng.integers(2))
        n = int(rng.integers(1, 6))
        kind = rng.integers(0, 8 if wide else 7, n).astype(np.uint8)
        raw = {}
        for name in ("step", "t_ns", "seq", "a", "b", "s", *(("c", "d", "e") if wide else ())):
            base = np.where(kind == 3, 0, -1) if name == "s" else np.zeros(n, dtype=np.int64)
            if rng.random() < 0.3:  # one value anywhere, most often at an edge
                i = int(rng.integers(n))
                base = base.astype(np.int64)
                base[i] = int(rng.choice(edges)) if rng.random() < 0.8 else int(
                    rng.integers(-5, 5))
            raw[name] = np.asarray(base, dtype=np.int64)
        strings = int(rng.integers(0, 3))
        kinds = kind.tobytes()
        fine = columnframe._fine(raw, kind, kinds, strings)
        try:
            columnframe._damage(raw, kind, strings)
            damaged = False
        except columnframe.ColumnsError:
            damaged = True
        assert fine != damaged, (raw, kind.tolist(), strings)
        agreed[fine] += 1
    assert agreed[True] > 20 and agreed[False] > 20  # (both outcomes were tried)
