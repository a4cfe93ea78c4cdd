"""Replica agreement, tensor x rank, from replicas_diverged findings as the replica check
writes them (probes/replica_verdict.judge): ddpviz/widgets/replica_matrix.py, the oracle of the
dashboard's replica panel (extension/src/replicas.ts, tests/extension/
test_replica_matrix_mirror.py), ranks grouped into columns above 16. (Moved from
tests/widgets/test_replica_view.py when the kernel-drawn ReplicaView gave way to the TS front
end: issue #40.)"""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.findings import Finding
from ddpviz.model.event_model import EventModel
from ddpviz.probes.replica_verdict import RankState, judge
from ddpviz.widgets.replica_matrix import replica_matrix
from tests.widgets.streams import synthetic_run

NAMES = ["fc1.weight", "fc1.bias", "fc2.weight"]


def _state(values: list[int]) -> RankState:
    return RankState(params=[(v, v) for v in values], param_stats=[(float(v), 1.0)
                                                                   for v in values],
                     grads=[(1, 1)] * len(values), grad_stats=[(0.0, 0.0)] * len(values),
                     buffers=[], buffer_stats=[], buffer_names=[], synced=True)


def _finding(world: int, odd: dict[int, list[int]]) -> Finding:
    states = {r: _state(odd.get(r, [1, 2, 3])) for r in range(world)}
    found = judge(7, states, param_names=NAMES, broadcast_buffers=True, last_agreed=6,
                  precise=False, world_size=world)
    assert found is not None
    return found


def test_each_differing_tensor_is_a_row_with_each_ranks_group() -> None:
    m = replica_matrix([_finding(3, {1: [1, 9, 3], 2: [1, 8, 4]})])
    assert [(r.step, r.name) for r in m.rows] == [(7, "fc1.bias"), (7, "fc2.weight")]
    assert m.rows[0].cells == {0: "A", 1: "B", 2: "C"}
    assert m.rows[1].cells == {0: "A", 1: "A", 2: "B"}
    assert "norm 9" in m.rows[0].sizes["B"]
    assert [label for label, _ in m.columns] == ["0", "1", "2"]


def test_above_16_ranks_alike_ranks_share_a_column() -> None:
    m = replica_matrix([_finding(40, {5: [1, 9, 3], 6: [1, 9, 3], 30: [7, 2, 3]})])
    assert [label for label, _ in m.columns] == ["0-4, 7-29, 31-39", "5, 6", "30"]
    assert {r.name for r in m.rows} == {"fc1.weight", "fc1.bias"}


def test_the_finding_of_a_trace_is_the_matrix_of_its_model() -> None:
    events = synthetic_run(3, 4, 1)
    finding = _finding(3, {2: [1, 2, 5]})
    events.append(ev.FindingReported(0, 7, events[-1].t_ns + 1, 10_000, finding))
    model = EventModel()
    model.feed(events)
    m = replica_matrix(model.findings())  # type: ignore[arg-type]
    assert [(r.step, r.name, r.severity) for r in m.rows] == [(7, "fc2.weight", "error")]
    assert m.rows[0].cells == {0: "A", 1: "A", 2: "B"}
    assert sum(letter != "A" for letter in m.rows[0].cells.values()) == 1
    healthy = EventModel()
    healthy.feed(synthetic_run(2, 4, 1))
    assert replica_matrix(healthy.findings()).rows == []  # type: ignore[arg-type]
