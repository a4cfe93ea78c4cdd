"""The verification matrix (ddpviz/model/verification_matrix.py, what the dashboard's
verification panel shows): every cell's status, the grouped values of a row, the ranks that
agree and the verdict follow the ParamsBuilt and verification events exactly, including a
defect planted on one rank, a rank not heard from yet, buffers, many ranks, a model too big to
draw whole and a replay cut before the result. (Moved from tests/widgets/test_verification_view.py
when the kernel-drawn VerificationView gave way to the TS front end: issue #40.)"""

from __future__ import annotations

import random

import pytest

from ddpviz import events as ev
from ddpviz.events import Mismatch
from ddpviz.findings import format_ranks, group_ranks
from ddpviz.model.event_model import CONSTRUCTION, EventModel
from ddpviz.model.rank_groups import value_groups
from ddpviz.model.verification_matrix import CellStatus, Matrix, Row, build_matrix, describe
from tests.model.random_constructors import random_constructor
from tests.widgets.streams import Plant, synthetic_run

STATUSES: tuple[CellStatus, ...] = ("same", "differs", "missing", "pending")


def model_of(events: list[ev.Event]) -> EventModel:
    model = EventModel()
    model.feed(events)
    return model


def matrix_of(source: list[ev.Event] | EventModel, as_of: int | None = None) -> Matrix:
    """The matrix as the dashboard built it: the constructor's facts at `as_of`."""
    model = source if isinstance(source, EventModel) else model_of(source)
    states = model.construction(model.settled(CONSTRUCTION, as_of))
    return build_matrix(states, model.world_size)


def statuses(m: Matrix) -> dict[str, tuple[str, ...]]:
    return {r.name: r.cells for r in m.rows}


def row(m: Matrix, name: str, kind: str = "param") -> Row:
    return next(r for r in m.rows if r.key == f"{kind}:{name}")


def agreeing(m: Matrix) -> list[tuple[int, ...]]:
    """Groups of ranks identical on every row (cell and the differing fields' values)."""
    signature = {r: tuple((x.cell(r), tuple(x.values.get(r, {}).get(f, "")
                                            for f in x.differing)) for x in m.rows)
                 for r in m.ranks}
    return sorted((g.ranks for g in value_groups(signature)), key=lambda g: g[0])


def grouped_values(x: Row) -> list[tuple[str, str]]:
    """A row's values on every rank, ranks grouped per distinct value (the details of a row)."""
    described = {r: "missing" if x.cell(r) == "missing" else "not reported yet"
                 if x.cell(r) == "pending" else describe(x.values.get(r, {})) for r in x.ranks}
    return [(format_ranks(ranks), text) for text, ranks in group_ranks(described)]


def test_identical_ranks_give_an_all_same_matrix_and_a_passing_verdict() -> None:
    m = matrix_of(synthetic_run(3, 6, 1))
    assert m.state == "passed" and m.ranks == (0, 1, 2)
    assert set(statuses(m).values()) == {("same", "same", "same")}
    assert len(m.rows) == 6
    assert m.verdict.startswith("✔ identical on all 3 ranks: 6 parameters, 0 buffers")
    assert "0123456789abcdef" in m.verdict


def test_a_shape_planted_on_one_rank_is_exactly_that_cell() -> None:
    m = matrix_of(synthetic_run(3, 6, 1, plant=Plant(shape={1: (2, (5, 16))})))
    cells = statuses(m)
    assert cells["1.weight"] == ("same", "differs", "same")
    assert all(c == ("same", "same", "same") for n, c in cells.items() if n != "1.weight")
    assert row(m, "1.weight").cell(1) == "differs" and row(m, "1.weight").cell(0) == "same"
    assert m.state == "failed"
    assert "parameter 2 '1.weight' shape differs" in m.verdict
    assert sum(x.counts.get("differs", 0) for x in m.rows) == 1
    # the row that differs comes first among the bad ones; its values grouped by value
    assert [x.key for x in m.rows if x.status != "same"] == ["param:1.weight"]
    assert row(m, "1.weight").differing == ("shape",)
    assert grouped_values(row(m, "1.weight")) == [
        ("ranks 0,2", "index=2 shape=(16, 16) dtype=float32 device=cpu sparse_grad=False"),
        ("rank 1", "index=2 shape=(5, 16) dtype=float32 device=cpu sparse_grad=False")]


def test_a_missing_parameter_is_missing_there_and_shifts_no_other_row() -> None:
    m = matrix_of(synthetic_run(2, 6, 1, plant=Plant(missing={1: 3})))
    cells = statuses(m)
    assert cells["1.bias"] == ("same", "missing")
    # rank 1's later parameters sit one index lower there; they are still the same tensors
    assert cells["2.weight"] == ("same", "same") and cells["2.bias"] == ("same", "same")
    assert m.notes == ("count of parameters: rank 0: 6; rank 1: 5",)
    assert ("rank 1", "missing") in grouped_values(row(m, "1.bias"))


def test_a_rank_not_heard_from_is_pending() -> None:
    events = [e for e in synthetic_run(2, 4, 1) if e.rank == 0 and e.step == -1][:2]
    m = matrix_of(events)  # rank 0's ParamsBuilt and VerificationStarted only
    assert m.ranks == (0, 1)
    assert set(statuses(m).values()) == {("same", "pending")}
    assert m.state == "verifying"
    assert m.verdict.startswith("… verifying across 2 ranks: 0 of 2 have a result")


def test_buffers_get_rows_and_their_mismatches_mark_them() -> None:
    params = (ev.ParamInfo(0, "fc.weight", (4, 4), "float32", "cpu", False),)
    bad = Mismatch("buffer", 0, "bn.running_mean", "shape", (("(4,)", (0, 2)), ("(5,)", (1,))))
    events = []
    for r in range(3):
        events += [ev.ParamsBuilt(r, -1, 10 + r, 0, params, ("bn.running_mean", "bn.n"), ()),
                   ev.VerificationStarted(r, -1, 20 + r, 1, 3, 1, 2),
                   ev.VerificationFailed(r, -1, 30 + r, 2, 3, (bad,))]
    m = matrix_of(events)
    rows = {(r.kind, r.name): r for r in m.rows}
    assert rows[("buffer", "bn.running_mean")].cells == ("same", "differs", "same")
    assert rows[("buffer", "bn.n")].cells == ("same", "same", "same")
    assert rows[("param", "fc.weight")].cells == ("same", "same", "same")
    assert row(m, "bn.running_mean", "buffer").cell(1) == "differs"
    assert "buffer 0 'bn.running_mean' shape differs" in m.verdict


def test_many_ranks_fall_into_groups_of_ranks_that_agree() -> None:
    m = matrix_of(synthetic_run(12, 4, 1, plant=Plant(shape={7: (0, (3, 16))})))
    assert agreeing(m) == [(0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11), (7,)]


def test_a_large_model_keeps_every_row_and_names_the_one_that_differs() -> None:
    m = matrix_of(synthetic_run(4, 1000, 0, plant=Plant(shape={2: (777, (1, 16))})))
    assert len(m.rows) == 1000
    assert [x.name for x in m.rows if x.status != "same"] == ["388.bias"]
    assert row(m, "388.bias").cell(2) == "differs"


def test_a_cut_before_the_result_is_verification_in_progress() -> None:
    events = synthetic_run(2, 4, 1)
    model = model_of(events)
    started = next(e for e in events if isinstance(e, ev.VerificationStarted) and e.rank == 1)
    assert matrix_of(model, started.t_ns).state == "verifying"
    bounds = model.step_bounds(0)
    assert bounds is not None
    assert matrix_of(model, bounds[1]).state == "passed"


def test_at_256_ranks_one_rank_with_another_shape_makes_two_groups() -> None:
    m = matrix_of(synthetic_run(256, 20, 0, plant=Plant(shape={128: (4, (3, 16))})))
    assert agreeing(m) == [(*range(128), *range(129, 256)), (128,)]
    x = row(m, "2.weight")
    assert x.cell(128) == "differs" and x.cell(255) == "same"
    assert [ranks for ranks, _ in grouped_values(x)] == ["ranks 0-127,129-255", "rank 128"]


def test_at_256_ranks_a_healthy_run_is_one_group_and_a_failure_names_the_odd_rank() -> None:
    healthy = matrix_of(synthetic_run(256, 40, 3, plant=Plant(slow={100: 400})))
    assert agreeing(healthy) == [tuple(range(256))]
    m = matrix_of(synthetic_run(256, 10, 0, plant=Plant(shape={200: (4, (3, 16))})))
    assert agreeing(m) == [(*range(200), *range(201, 256)), (200,)]
    assert "2.weight" in m.verdict


def _plain(matrix: Matrix) -> list[tuple[object, ...]]:
    return [(r.kind, r.position, r.name, dict(r.known),
             {k: dict(v) for k, v in r.values.items()}, r.differing, r.counts, dict(r.base),
             r.ranks, r.status, r.cells, tuple(r.ranks_with(c) for c in STATUSES))
            for r in matrix.rows]


@pytest.mark.parametrize("seed", range(60))
def test_rows_built_by_rank_class_equal_the_rows_built_rank_by_rank(seed: int) -> None:
    rng = random.Random(seed)
    world = rng.choice([1, 2, 3, 5, 12, 20])
    model = model_of(random_constructor(rng, world))
    states = model.construction()
    fast = build_matrix(states, model.world_size)
    slow = build_matrix(states, model.world_size, grouped=False)
    assert _plain(fast) == _plain(slow)
    assert fast._replace(rows=()) == slow._replace(rows=())


def test_a_healthy_run_is_one_rank_class_and_its_rows_share_their_values() -> None:
    model = model_of(synthetic_run(40, 30, 1))
    matrix = build_matrix(model.construction(), model.world_size)
    x = matrix.rows[3]
    assert x.known == dict.fromkeys(range(40), "same") and len(x.values) == 40
    assert x.values[0] is x.values[39]  # one dict for the class, not one per rank
    assert x.known.get(40) is None and 40 not in x.values and 39 in x.values
    with pytest.raises(KeyError):
        x.values[40]
