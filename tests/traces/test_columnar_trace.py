"""The columnar store behind Trace: events come back equal, a big file is read through a map
with the same results and errors, hot events cost a bounded number of bytes each."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.limits import LimitError
from ddpviz.traces import fileformat as tracefile
from ddpviz.traces.columns import RankColumns
from ddpviz.traces.trace import Trace, TraceError
from tests.diagnose.random_runs import random_run


def test_events_come_back_equal_in_arrival_order_per_rank_and_by_type() -> None:
    events = random_run(5)
    trace = Trace(events)
    for rank in trace.ranks:
        assert trace.events(rank) == [e for e in events if e.rank == rank]
        assert trace.of_type(ev.GradReady, ev.BucketAssigned, rank=rank) == [
            e for e in events if e.rank == rank and isinstance(e, ev.GradReady | ev.BucketAssigned)]
    merged = trace.events()
    assert sorted(merged, key=lambda e: (e.rank, e.seq)) == sorted(events,
                                                                     key=lambda e: (e.rank, e.seq))
    assert trace.of_type(ev.AllReduceLaunched) == [e for e in merged
                                                   if isinstance(e, ev.AllReduceLaunched)]


def test_a_big_file_read_frame_by_frame_loads_like_a_read_one_and_fails_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Trace(random_run(9), clock={1: (40, 2)}).save(tmp_path / "t.ddpviz")
    read = Trace.load(path)
    monkeypatch.setattr(tracefile, "WHOLE_BELOW", 1)
    assert Trace.load(path) == read
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.ddpviz"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="is corrupt"):
        Trace.load(bad)
    torn = tmp_path / "torn.ddpviz"
    torn.write_bytes(path.read_bytes()[:-3])
    with pytest.warns(UserWarning, match="torn frame"):
        assert Trace.load(torn).truncated
    other = tmp_path / "other.ddpviz"
    other.write_bytes(b"x" * 100)
    with pytest.raises(TraceError, match="is not a ddpviz trace"):
        Trace.load(other)


def test_hot_events_take_at_most_45_bytes_each_in_the_columns() -> None:
    cols = RankColumns(0)
    n = 50_000
    cols.add(ev.GradReady(0, s // 1000, 10**12 + s, s, s % 1000, s % 7) for s in range(n))
    table = cols.table()
    assert len(table) == n and not table.objects
    assert cols.nbytes() <= 45 * n


def test_values_beyond_64_bits_are_refused_with_the_field_named() -> None:
    trace = Trace()
    with pytest.raises(LimitError, match=r"t_ns=.*beyond 64 bits"):
        trace.extend([ev.GradReady(0, 0, 1 << 70, 0, 1, 0)] * 5000)


def test_ranks_reporting_one_model_share_one_copy_of_its_parameter_list() -> None:
    params = tuple(ev.ParamInfo(i, f"p{i}", (4,), "float32", "cpu", False, 4) for i in range(100))
    order = tuple(range(99, -1, -1))
    events = [ev.ParamsBuilt(r, -1, 0, 0, tuple(ev.ParamInfo(*msgspec.structs.astuple(p))
                                                   for p in params), (), ())
              for r in range(3)]
    events += [ev.BucketsRebuilt(r, 1, 5, 1, tuple(list(order))) for r in range(3)]
    trace = Trace(events)
    built = trace.of_type(ev.ParamsBuilt)
    assert built == events[:3]
    assert built[0].params is built[1].params is built[2].params
    rebuilt = trace.of_type(ev.BucketsRebuilt)
    assert rebuilt == events[3:] and rebuilt[0].grad_ready_order is rebuilt[2].grad_ready_order
