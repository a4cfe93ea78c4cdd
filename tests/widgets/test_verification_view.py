"""VerificationView: every cell's status, the grouped values of a selected row, and the verdict
follow the ParamsBuilt and verification events exactly, including a defect planted on one
rank, a rank not heard from yet, buffers, grouped columns and a model too big to draw whole."""

from __future__ import annotations

import random

import pytest

from ddpviz import events as ev
from ddpviz.events import Mismatch
from ddpviz.model.event_model import EventModel
from ddpviz.model.verification_matrix import Matrix, build_matrix
from ddpviz.widgets import VerificationView
from ddpviz.widgets.verification_view import GLYPHS
from tests.widgets.streams import Plant, synthetic_run


def statuses(v: VerificationView) -> dict[str, tuple[str, ...]]:
    return {r.name: r.cells for r in v.matrix.rows}


def test_identical_ranks_give_an_all_same_matrix_and_a_passing_verdict() -> None:
    v = VerificationView(synthetic_run(3, 6, 1))
    assert v.matrix.state == "passed" and v.matrix.ranks == (0, 1, 2)
    assert set(statuses(v).values()) == {("same", "same", "same")}
    assert v.matrix.verdict.startswith("✔ identical on all 3 ranks: 6 parameters, 0 buffers")
    assert v.matrix_html.value.count("<td class=s>") == 18  # 6 rows x 3 ranks, all green
    assert "0123456789abcdef" in v.verdict_html.value


def test_a_shape_planted_on_one_rank_colours_exactly_that_cell() -> None:
    v = VerificationView(synthetic_run(3, 6, 1, plant=Plant(shape={1: (2, (5, 16))})))
    cells = statuses(v)
    assert cells["1.weight"] == ("same", "differs", "same")
    assert all(c == ("same", "same", "same") for n, c in cells.items() if n != "1.weight")
    assert v.cell("1.weight", 1) == "differs" and v.cell("1.weight", 0) == "same"
    assert v.matrix.state == "failed"
    assert "parameter 2 '1.weight' shape differs" in v.matrix.verdict
    assert v.matrix_html.value.count("<td class=d") == 1
    # the row that differs is selected first; its values are grouped by distinct value
    assert v.row_select.value == "param:1.weight"
    v.select("1.weight", rank=1)
    text = v.details_html.value
    assert "ranks 0,2: index=2 <span style='color:#b42318;font-weight:bold'>shape=(16, 16)" \
        in text
    assert "▶ rank 1: index=2 <span style='color:#b42318;font-weight:bold'>shape=(5, 16)" in text


def test_a_missing_parameter_is_missing_there_and_shifts_no_other_row() -> None:
    v = VerificationView(synthetic_run(2, 6, 1, plant=Plant(missing={1: 3})))
    cells = statuses(v)
    assert cells["1.bias"] == ("same", "missing")
    # rank 1's later parameters sit one index lower there; they are still the same tensors
    assert cells["2.weight"] == ("same", "same") and cells["2.bias"] == ("same", "same")
    assert v.matrix.notes == ("count of parameters: rank 0: 6; rank 1: 5",)
    v.select("1.bias")
    assert "rank 1: missing" in v.details_html.value


def test_a_rank_not_heard_from_is_pending() -> None:
    events = [e for e in synthetic_run(2, 4, 1) if e.rank == 0 and e.step == -1][:2]
    v = VerificationView(events)  # rank 0's ParamsBuilt and VerificationStarted only
    assert v.matrix.ranks == (0, 1)
    assert set(statuses(v).values()) == {("same", "pending")}
    assert v.matrix.state == "verifying"
    assert v.matrix.verdict.startswith("… verifying across 2 ranks: 0 of 2 have a result")


def test_buffers_get_rows_and_their_mismatches_colour_them() -> None:
    params = (ev.ParamInfo(0, "fc.weight", (4, 4), "float32", "cpu", False),)
    bad = Mismatch("buffer", 0, "bn.running_mean", "shape", (("(4,)", (0, 2)), ("(5,)", (1,))))
    events = []
    for r in range(3):
        events += [ev.ParamsBuilt(r, -1, 10 + r, 0, params, ("bn.running_mean", "bn.n"), ()),
                   ev.VerificationStarted(r, -1, 20 + r, 1, 3, 1, 2),
                   ev.VerificationFailed(r, -1, 30 + r, 2, 3, (bad,))]
    v = VerificationView(events)
    rows = {(r.kind, r.name): r for r in v.matrix.rows}
    assert rows[("buffer", "bn.running_mean")].cells == ("same", "differs", "same")
    assert rows[("buffer", "bn.n")].cells == ("same", "same", "same")
    assert rows[("param", "fc.weight")].cells == ("same", "same", "same")
    assert v.cell("bn.running_mean", 1, kind="buffer") == "differs"
    assert "buffer 0 'bn.running_mean' shape differs" in v.matrix.verdict


def test_many_ranks_are_grouped_into_columns_of_ranks_that_agree() -> None:
    v = VerificationView(synthetic_run(12, 4, 1, plant=Plant(shape={7: (0, (3, 16))})))
    assert v.group_checkbox.value  # more than 8 ranks: grouped by default
    assert v.columns() == [(0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11), (7,)]
    assert "0,1,2,3,4,5,6,8" not in v.matrix_html.value  # runs are folded
    assert "<th title='0-6, 8-11'>11 ranks: 0-6, 8-11</th>" in v.matrix_html.value
    assert "<th title='7'>r7</th>" in v.matrix_html.value
    v.group_checkbox.value = False
    assert len(v.columns()) == 12


def test_a_large_model_draws_the_rows_that_differ_and_keeps_every_row_selectable() -> None:
    v = VerificationView(synthetic_run(4, 1000, 0, plant=Plant(shape={2: (777, (1, 16))})),
                         max_rows=30)
    shown = v.shown_rows()
    assert len(shown) == 30 and any(r.name == "388.bias" for r in shown)
    assert len(v.row_select.options) == 1000
    assert "… and 970 more rows" in v.matrix_html.value
    assert v.cell("388.bias", 2) == "differs"


def test_replaying_before_the_result_shows_verification_in_progress() -> None:
    events = synthetic_run(2, 4, 1)
    v = VerificationView(events)
    started = next(e for e in events if isinstance(e, ev.VerificationStarted) and e.rank == 1)
    assert v.controls is not None
    span = v.model.time_range()
    assert span is not None
    v.controls.show_time((started.t_ns - span[0]) / (span[1] - span[0]))
    assert v.matrix.state == "verifying"
    v.controls.show_step(0)
    assert v.matrix.state == "passed"


def test_selecting_an_unknown_row_says_which_rows_exist() -> None:
    v = VerificationView(synthetic_run(2, 2, 0))
    with pytest.raises(KeyError, match="ddpviz: no row 'param:nope'"):
        v.select("nope")


def test_at_256_ranks_one_rank_with_another_shape_makes_two_columns() -> None:
    events = synthetic_run(256, 20, 0, plant=Plant(shape={128: (4, (3, 16))}))
    v = VerificationView(events)
    assert v.columns() == [(*range(128), *range(129, 256)), (128,)]
    assert "<th title='0-127, 129-255'>255 ranks: 0-127, 129-255</th>" in v.matrix_html.value
    assert v.matrix_html.value.count("<th title=") == 2
    assert v.cell("2.weight", 128) == "differs" and v.cell("2.weight", 255) == "same"
    v.select("2.weight", 128)
    assert "▶ rank 128: " in v.details_html.value and "ranks 0-127,129-255: " in \
        v.details_html.value


def _plain(matrix: Matrix) -> list[tuple[object, ...]]:
    return [(r.kind, r.position, r.name, dict(r.known),
             {k: dict(v) for k, v in r.values.items()}, r.differing, r.counts, dict(r.base),
             r.ranks, r.status, r.cells, tuple(r.ranks_with(c) for c in GLYPHS))
            for r in matrix.rows]


def _variant(rng: random.Random, params: list[ev.ParamInfo]) -> list[ev.ParamInfo]:
    """`params` with at most one defect a rank can have (or a copy of the same list)."""
    out = list(params)
    i = rng.randrange(len(out))
    what = rng.choice(["copy", "shape", "dtype", "device", "missing", "extra", "duplicate"])
    p = out[i]
    if what == "shape":
        out[i] = ev.ParamInfo(p.index, p.name, (rng.randint(1, 3), 7), p.dtype, p.device, False)
    elif what == "dtype":
        out[i] = ev.ParamInfo(p.index, p.name, p.shape, "bfloat16", p.device, False)
    elif what == "device":  # the matrix compares the device type only: cuda:1 == cuda:0
        out[i] = ev.ParamInfo(p.index, p.name, p.shape, p.dtype,
                              rng.choice(["cuda:1", "meta"]), False)
    elif what == "missing":
        del out[i]
        out = [ev.ParamInfo(j, q.name, q.shape, q.dtype, q.device, False)
               for j, q in enumerate(out)]
    elif what == "extra":
        out.append(ev.ParamInfo(len(out), f"extra{rng.randrange(3)}", (2,), "float32", "cpu",
                                False))
    elif what == "duplicate":
        out.append(ev.ParamInfo(len(out), p.name, (9,), "float32", "cpu", False))
    return out


def _constructor(rng: random.Random, world: int) -> list[ev.Event]:
    params = [ev.ParamInfo(i, f"l{i // 2}.{'bias' if i % 2 else 'weight'}", (4, 4 + i % 3),
                           "float32", "cuda:0", False) for i in range(rng.randint(1, 8))]
    kinds = [params] + [_variant(rng, params) for _ in range(rng.choice([1, 3, 12]))]
    buffer_sets = [("bn.mean",), ("bn.mean", "bn.var"), ()]
    events: list[ev.Event] = []
    reporting = [r for r in range(world) if rng.random() < 0.9]
    outcome = rng.choice(["none", "passed", "failed", "failed"])
    mismatches: list[Mismatch] = []
    for _ in range(rng.randint(1, 4)):
        p = rng.choice(params)
        field = rng.choice(["shape", "present", "stride", "order"])
        bad = tuple(sorted(rng.sample(range(world), min(world, rng.randint(1, 2)))))
        good = tuple(r for r in range(world) if r not in bad)
        value = "missing" if field == "present" else f"v{rng.randrange(3)}"
        mismatches.append(Mismatch(rng.choice(["param", "param", "buffer"]), p.index,
                                   rng.choice([p.name, "bn.mean", "ghost"]), field,
                                   (("ok", good), (value, bad))))
    if rng.random() < 0.3:
        mismatches.append(Mismatch("count", -1, "parameters", "count",
                                   (("8", tuple(range(world - 1))), ("7", (world - 1,)))))
    shared = [tuple(k) for k in kinds]  # one list object per variant, as a trace keeps it
    for r in reporting:
        k = rng.randrange(len(shared)) if rng.random() < 0.5 else 0
        listed = shared[k] if rng.random() < 0.8 else tuple(list(shared[k]))  # equal copy
        events.append(ev.ParamsBuilt(r, -1, 10 + r, 0, listed, rng.choice(buffer_sets), ()))
        events.append(ev.VerificationStarted(r, -1, 20 + r, 1, world, len(listed), 0))
        if outcome == "passed" and rng.random() < 0.8:
            events.append(ev.VerificationPassed(r, -1, 30 + r, 2, world, "abc"))
        elif outcome == "failed" and rng.random() < 0.8:
            events.append(ev.VerificationFailed(r, -1, 30 + r, 2, world, tuple(mismatches)))
    return events


@pytest.mark.parametrize("seed", range(60))
def test_rows_built_by_rank_class_equal_the_rows_built_rank_by_rank(seed: int) -> None:
    rng = random.Random(seed)
    world = rng.choice([1, 2, 3, 5, 12, 20])
    model = EventModel()
    model.feed(_constructor(rng, world))
    states = model.construction()
    fast = build_matrix(states, model.world_size)
    slow = build_matrix(states, model.world_size, grouped=False)
    assert _plain(fast) == _plain(slow)
    assert fast._replace(rows=()) == slow._replace(rows=())


def test_a_healthy_run_is_one_rank_class_and_its_rows_share_their_values() -> None:
    model = EventModel()
    model.feed(synthetic_run(40, 30, 1))
    matrix = build_matrix(model.construction(), model.world_size)
    row = matrix.rows[3]
    assert row.known == dict.fromkeys(range(40), "same") and len(row.values) == 40
    assert row.values[0] is row.values[39]  # one dict for the class, not one per rank
    assert row.known.get(40) is None and 40 not in row.values and 39 in row.values
    with pytest.raises(KeyError):
        row.values[40]
