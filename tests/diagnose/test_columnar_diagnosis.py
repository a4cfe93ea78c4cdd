"""diagnose() over the columnar store gives exactly the findings of the object path (the
implementation before it, kept in object_diagnosis.py), on runs with every kind of defect."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec
import pytest

from ddpviz import diagnose
from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose_events
from ddpviz.events import Event
from ddpviz.traces.trace import Trace
from tests.diagnose import object_diagnosis
from tests.diagnose.random_runs import DEFECTS, random_run

SEEDS = range(300)


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_alone_gives_the_object_paths_findings(defect: str) -> None:
    for seed in range(12):
        events = random_run(seed, (defect,))
        assert diagnose_events(events) == object_diagnosis.diagnose_events(events), (defect, seed)


def test_random_mixes_of_defects_give_the_object_paths_findings() -> None:
    kinds: Counter[str] = Counter()
    for seed in SEEDS:
        events = random_run(seed)
        expected = object_diagnosis.diagnose_events(events)
        assert diagnose_events(events) == expected, seed
        trace = Trace(events)
        assert diagnose(trace) == object_diagnosis.diagnose(trace), seed
        kinds.update(f.kind for f in expected)
    # the comparison covered every kind of finding the events can show
    assert {"grad_order", "hook_fired_twice", "collective_mismatch", "rank_hang",
            "missing_rank", "uneven_iterations", "unused_parameter", "events_dropped",
            "buffer_reassigned", "param_mismatch"} <= set(kinds), kinds


def test_a_saved_and_loaded_trace_diagnoses_like_the_object_path(tmp_path: Path) -> None:
    for seed in range(40):
        trace = Trace(random_run(seed), clock={1: (-700, 5)})
        loaded = Trace.load(trace.save(tmp_path / f"{seed}.ddpviz"))
        assert diagnose(loaded) == object_diagnosis.diagnose(loaded) == diagnose(trace), seed


def _spread(events: list[Event], step: int) -> list[Event]:
    """The run with parameter i numbered i * step: indices far apart, as in a model whose
    gradients are recorded for a few of its parameters only."""
    def idx(i: int) -> int:
        return i * step

    replace = msgspec.structs.replace
    out: list[Event] = []
    for e in events:
        if isinstance(e, ev.GradReady):
            e = replace(e, param=idx(e.param))
        elif isinstance(e, ev.BucketAssigned):
            e = replace(e, buckets=tuple(tuple(map(idx, b)) for b in e.buckets))
        elif isinstance(e, ev.ParamsBuilt):
            e = replace(e, params=tuple(replace(p, index=idx(p.index)) for p in e.params))
        elif isinstance(e, ev.UnusedParametersFound):
            e = replace(e, params=tuple(map(idx, e.params)))
        elif isinstance(e, ev.BucketsRebuilt):
            e = replace(e, grad_ready_order=tuple(map(idx, e.grad_ready_order)))
        out.append(e)
    return out


def test_parameter_indices_far_apart_give_the_object_paths_findings(tmp_path: Path) -> None:
    # indices too sparse to be counted in an array of their range: the sorting paths
    kinds: Counter[str] = Counter()
    for seed in range(80):
        events = _spread(random_run(seed, ("order", "twice", "unused", "rebuilt_map")
                                    if seed % 2 else None), 87_001)
        expected = object_diagnosis.diagnose_events(events)
        assert diagnose_events(events) == expected, seed
        loaded = Trace.load(Trace(events).save(tmp_path / f"{seed}.ddpviz"))
        assert diagnose(loaded) == object_diagnosis.diagnose(loaded), seed
        kinds.update(f.kind for f in expected)
    assert {"grad_order", "hook_fired_twice", "unused_parameter"} <= set(kinds), kinds
