"""EventModel.feed_table (a trace's columns) folds into exactly the state `feed` builds from
the same events as objects: rank states, step records (cut at any time), bounds, versions,
findings, status; on runs with every kind of defect and clock offsets."""

from __future__ import annotations

import random

import msgspec
import numpy as np

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel, GradArray
from ddpviz.traces.trace import Trace
from tests.diagnose.random_runs import random_run


def models(trace: Trace) -> tuple[EventModel, EventModel]:
    by_objects, by_columns = EventModel(trace.clock), EventModel(trace.clock)
    for rank in trace.ranks:
        by_objects.feed(trace.events(rank))
    for table in trace.columns().values():
        by_columns.feed_table(table)
    return by_objects, by_columns


def test_columns_fold_into_the_state_objects_fold_into() -> None:
    for seed in range(80):
        trace = Trace(random_run(seed), clock={1: (-3_000, 10), 3: (777, 1)})
        a, b = models(trace)
        assert a.rank_states() == b.rank_states(), seed
        assert a.steps == b.steps and a.versions == b.versions, seed
        assert a.world_size == b.world_size and len(a) == len(b), seed
        assert a.findings() == b.findings(), seed
        sa, sb = a.status(), b.status()
        assert sa._replace(events_per_s=0) == sb._replace(events_per_s=0), seed
        span = a.time_range()
        assert span == b.time_range()
        cuts = [None] if span is None else [None, span[0], (span[0] + span[1]) // 2, span[1]]
        for step in [-1, *a.steps]:
            assert a.step_bounds(step) == b.step_bounds(step)
            assert a.step_version(step) == b.step_version(step)
            for as_of in cuts:
                assert a.step_records(step, as_of) == b.step_records(step, as_of), (seed, step)
        for as_of in cuts:
            assert a.construction(as_of) == b.construction(as_of), seed
            assert a.status(as_of)._replace(events_per_s=0) == \
                b.status(as_of)._replace(events_per_s=0)


def test_a_trace_step_keeps_its_hooks_as_columns_that_read_like_the_list() -> None:
    trace = Trace(random_run(3, ()))
    _, model = models(trace)
    rec = model.step_records(0)[0]
    assert isinstance(rec.grads, GradArray) and len(rec.grads) > 2
    as_list = list(rec.grads)
    assert rec.grads == as_list and as_list == rec.grads
    assert rec.grads[1] == as_list[1] and rec.grads[-1] == as_list[-1]
    assert rec.grads[1:3] == as_list[1:3]
    assert [p for _, p, _ in rec.grads] == rec.grads.params.tolist()
    rec.grads.append((99, 1, 0))  # a live feed after the trace's: kept after the columns
    assert list(rec.grads)[-1] == (99, 1, 0) and len(rec.grads) == len(as_list) + 1


def _steps_interleaved(seed: int) -> Trace:
    """random_run's events with some of each rank's moved later (steps out of order in the
    rank's rows: feed_table's argsort path), renumbered so arrival order is the new order."""
    rng = random.Random(seed)
    events = random_run(seed)
    per_rank: dict[int, list[Event]] = {}
    for e in events:
        per_rank.setdefault(e.rank, []).append(e)
    out: list[Event] = []
    for evs in per_rank.values():
        moved = [e for e in evs if rng.random() < 0.1]
        kept = [e for e in evs if not any(e is m for m in moved)]
        for e in moved:
            kept.insert(rng.randint(0, len(kept)), e)
        out += [msgspec.structs.replace(e, seq=i) for i, e in enumerate(kept)]
    return Trace(out, clock={0: (55, 1), 2: (-9_000, 5)})


def test_a_rank_whose_steps_interleave_folds_as_its_objects_do() -> None:
    unsorted = 0
    for seed in range(40):
        trace = _steps_interleaved(seed)
        unsorted += sum(not bool(np.all(t.step[1:] >= t.step[:-1]))
                        for t in trace.columns().values())
        a, b = models(trace)
        assert a.rank_states() == b.rank_states(), seed
        assert a.versions == b.versions and a.full_steps() == b.full_steps(), seed
        for step in [-1, *a.steps]:
            assert a.step_bounds(step) == b.step_bounds(step), (seed, step)
            assert a.step_version(step) == b.step_version(step), (seed, step)
            assert a.step_records(step) == b.step_records(step), (seed, step)
        assert a.status()._replace(events_per_s=0) == b.status()._replace(events_per_s=0)
    assert unsorted > 20  # the argsort path ran
