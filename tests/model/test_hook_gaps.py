"""The run model notes what came right before a hook or a BackwardFinished (the advisor's launch
and finalize costs, [Note: hook gaps]), the same from event objects and from columns, wherever
a feed or a table starts."""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import Trace


def _step(rank: int = 0) -> list[ev.Event]:
    rows: list[tuple[type[ev.Event], int, int, tuple[object, ...]]] = [
        (ev.ForwardStarted, 0, 100, ()), (ev.ForwardStarted, 0, 150, ()),
        (ev.BackwardStarted, 0, 200, ()),
        (ev.GradReady, 0, 300, (0, 0)), (ev.GradReady, 0, 350, (1, 0)),
        (ev.BucketReady, 0, 360, (0,)), (ev.AllReduceLaunched, 0, 370, (0, 64, "float32")),
        (ev.GradReady, 0, 500, (2, 1)), (ev.GradReady, 0, 520, (3, 1)),
        (ev.BucketReady, 0, 530, (1,)), (ev.AllReduceLaunched, 0, 540, (1, 64, "float32")),
        (ev.AllReduceDone, 0, 600, (0,)), (ev.AllReduceDone, 0, 650, (1,)),
        (ev.BackwardFinished, 0, 700, ()), (ev.ForwardStarted, 1, 900, ()),
        (ev.BackwardStarted, 1, 950, ()), (ev.GradReady, 1, 990, (3, 1)),
        (ev.BackwardFinished, 1, 999, ())]
    return [cls(rank, step, t, seq, *fields)  # type: ignore[call-arg]
            for seq, (cls, step, t, fields) in enumerate(rows)]


def test_the_fold_notes_hook_breaks_launch_and_finalize_gaps() -> None:
    model = EventModel({0: (1_000, 1)})
    model.feed(_step())
    rec0, rec1 = model.step_records(0)[0], model.step_records(1)[0]
    assert (rec0.forward, rec0.first_forward) == (1_150, 1_100)
    assert rec0.hook_breaks == [0, 2]  # after BackwardStarted, after a launch
    assert rec0.launch_gaps == [(2, 130)]  # GradReady p2 130 ns after bucket 0's launch
    assert rec0.finalize_gaps == [50]
    assert (rec1.hook_breaks, rec1.launch_gaps, rec1.finalize_gaps) == ([0], [], [])
    cut = model.step_records(0, as_of=1_490)[0]  # the third hook not yet in
    assert (cut.hook_breaks, cut.launch_gaps, cut.finalize_gaps) == ([0], [], [])


def test_objects_and_columns_agree_wherever_a_table_starts() -> None:
    events = _step(0) + _step(1)
    by_objects = EventModel()
    by_objects.feed(events)
    for split in range(1, len(_step())):  # objects up to `split`, then the rest as columns
        mixed = EventModel()
        rest = []
        for rank in (0, 1):
            mine = [e for e in events if e.rank == rank]
            mixed.feed(mine[:split])
            rest += mine[split:]
        for table in Trace(rest).columns().values():
            mixed.feed_table(table)
        assert mixed.rank_states() == by_objects.rank_states(), split
        for step in (0, 1):
            assert mixed.step_records(step) == by_objects.step_records(step), split
