"""EventModel: per-rank state folded from events must match the events exactly, at any cut in
time, fed in one go, in pieces, or from several threads at once."""

from __future__ import annotations

import subprocess
import sys
import threading

from ddpviz import events as ev
from ddpviz.model.event_model import CONSTRUCTION, EventModel
from tests.widgets.streams import Plant, synthetic_run


def test_each_rank_and_step_record_holds_exactly_its_events() -> None:
    events = synthetic_run(3, 8, 4)
    m = EventModel()
    m.feed(events)
    assert m.ranks == (0, 1, 2) and m.world_size == 3 and len(m) == len(events)
    assert m.steps == [0, 1, 2, 3]
    for step in m.steps:
        records = m.step_records(step)
        for rank, rec in records.items():
            mine = [e for e in events if e.rank == rank and e.step == step]
            grads = [(e.param, e.bucket) for e in mine if isinstance(e, ev.GradReady)]
            assert [(p, b) for _, p, b in rec.grads] == grads
            assert set(rec.launched) == {e.bucket for e in mine
                                         if isinstance(e, ev.AllReduceLaunched)}
            assert set(rec.done) == set(rec.launched)
            assert rec.backward is not None and rec.backward_end is not None
    maps = m.maps()
    assert [x.event.rebuilt for x in maps[0]] == [False, True]  # type: ignore[attr-defined]


def test_as_of_cuts_every_query_at_that_instant() -> None:
    events = synthetic_run(2, 6, 2)
    m = EventModel()
    m.feed(events)
    grads = [e for e in events if isinstance(e, ev.GradReady) and e.rank == 0 and e.step == 1]
    cut = grads[2].t_ns  # after the third hook of iteration 1 on rank 0
    rec = m.step_records(1, as_of=cut)[0]
    assert [p for _, p, _ in rec.grads] == [g.param for g in grads[:3]]
    assert rec.backward_end is None
    assert m.step_at(cut) == 1
    first = min(e.t_ns for e in events)
    assert m.step_at(first) == CONSTRUCTION
    assert m.step_at(first - 1) is None
    sent = next(e for e in events if isinstance(e, ev.BroadcastChunkSent) and e.rank == 1)
    state = m.construction(as_of=sent.t_ns)[1]
    assert list(state.chunks_sent) == [0] and state.chunks_done == {}
    assert state.broadcast_finished is None and state.maps == []


def test_clock_offsets_move_a_ranks_times() -> None:
    events = synthetic_run(2, 4, 1)
    plain, shifted = EventModel(), EventModel({1: (5_000_000, 10)})
    plain.feed(events)
    shifted.feed(events)
    a, b = plain.step_records(0), shifted.step_records(0)
    assert b[1].backward - a[1].backward == 5_000_000  # type: ignore[operator]
    assert b[0].backward == a[0].backward


def test_feeding_from_several_threads_at_once_loses_nothing() -> None:
    events = synthetic_run(4, 20, 5)
    per_rank = {r: [e for e in events if e.rank == r] for r in range(4)}
    m = EventModel()

    def feed(rank: int) -> None:
        lst = per_rank[rank]
        for i in range(0, len(lst), 7):  # small batches, interleaved with the other threads
            m.feed(lst[i:i + 7])

    threads = [threading.Thread(target=feed, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = EventModel()
    whole.feed(events)
    assert len(m) == len(events)
    for step in whole.steps:
        assert m.step_records(step) == whole.step_records(step)
    assert m.construction() == whole.construction()


def test_status_reports_phases_dropped_events_and_steps() -> None:
    events = synthetic_run(2, 4, 2)
    m = EventModel()
    m.feed([*events, ev.EventsDropped(1, 1, events[-1].t_ns + 1, 999, 12)])
    s = m.status()
    assert s.ranks == (0, 1) and s.dropped == 12 and s.steps == {0: 1, 1: 1}
    assert s.phases[0] == "after backward"
    backward = next(e for e in events if isinstance(e, ev.BackwardStarted) and e.rank == 0)
    at = m.status(as_of=backward.t_ns)
    assert at.phases[0] == "backward" and at.steps[0] == 0
    verifying = next(e for e in events if isinstance(e, ev.VerificationStarted) and e.rank == 0)
    assert m.status(as_of=verifying.t_ns).phases[0] == "verifying"


def test_failed_verification_stops_the_stream_and_is_kept() -> None:
    events = synthetic_run(2, 4, 2, plant=Plant(shape={1: (2, (3, 16))}))
    m = EventModel()
    m.feed(events)
    assert m.steps == []
    result = m.construction()[1].verify_result
    assert result is not None and isinstance(result.event, ev.VerificationFailed)


def test_importing_ddpviz_loads_no_widget_code() -> None:
    code = ("import sys, ddpviz; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('ipywidgets', 'plotly', 'anywidget') or m.startswith('ddpviz.widgets')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_the_debuggers_traffic_is_counted_and_never_stretches_a_step() -> None:
    # A rank parked at step 1 and inspected a minute later: its Parked/Inspected/Unparked
    # events carry step 1 and late times. Folded like DDP's events they would stretch step
    # 1's window to the last answer (the hook timeline of the paused step squashed to a pixel).
    import msgspec
    import numpy as np

    from ddpviz.traces.trace import Trace
    from tests.debugger.fake_ranks import summarize

    events = synthetic_run(2, 6, 3)
    late = max(e.t_ns for e in events) + 60 * 10**9
    seq = {r: max(e.seq for e in events if e.rank == r) for r in (0, 1)}
    debugger: list[ev.Event] = []
    for r in (0, 1):
        parked = ev.Parked(r, 1, late, seq[r] + 1, "bucket", 1, "break_at", 0)
        seen = msgspec.structs.replace(summarize(r, 1, 7, "w", "grad", np.ones(3, np.float32)),
                                       t_ns=late + 10**9, seq=seq[r] + 2)
        debugger += [parked, seen, ev.Unparked(r, 1, late + 2 * 10**9, seq[r] + 3, "resume", 8)]
    plain, with_debugger = EventModel(), EventModel()
    plain.feed(events)
    with_debugger.feed([*events, *debugger])
    assert len(with_debugger) == len(plain) + len(debugger)
    for step in plain.steps:
        assert with_debugger.step_records(step) == plain.step_records(step)
        assert with_debugger.step_bounds(step) == plain.step_bounds(step)
    assert with_debugger.steps == plain.steps and with_debugger.versions == plain.versions
    # a trace's columns fold the same way
    columns = EventModel()
    for table in Trace([*events, *debugger]).columns().values():
        columns.feed_table(table)
    assert len(columns) == len(with_debugger)
    for step in plain.steps:
        assert columns.step_records(step) == plain.step_records(step)
        assert columns.step_bounds(step) == plain.step_bounds(step)
