"""The comparison of ranks' collective histories (probes/collective_check.py) on histories
made by hand: what is a verdict and what is not. The real jobs are in
tests/record/test_collectives.py."""

from __future__ import annotations

from typing import Any

from ddpviz.probes.collective_check import CollectiveCheck, _Compare
from ddpviz.probes.collectives import Entry, Mark


class _Group:
    name = "0"
    ranks = (0, 1, 2)


def _checker() -> Any:
    return CollectiveCheck.__new__(CollectiveCheck)  # no thread, no store: the logic only


def _compare(histories: dict[int, list[Entry]], marks: dict[int, list[Mark]] | None = None,
             pos: int = 10) -> Any:
    c = _Compare((0, 1, 2))
    for r, entries in histories.items():
        for e in entries:
            c.histories[r].by_pos[e.pos] = e
    for r, rank_marks in (marks or {}).items():
        c.histories[r].marks = rank_marks
    return _checker()._compare_at(_Group(), c, pos)


def e(pos: int, op: str = "all_reduce", sig: str = "float32 x3 sum", site: str = "t.py:1 in f",
      span: int = 1) -> Entry:
    return Entry(pos, span, op, sig, site, 4)


def test_the_same_call_on_every_rank_is_no_finding() -> None:
    assert _compare({r: [e(10)] for r in range(3)}) is None


def test_another_call_site_with_the_same_collective_is_no_finding() -> None:
    # rank-dependent code may issue the matching collective from another line
    assert _compare({0: [e(10, site="a.py:1 in x")], 1: [e(10)], 2: [e(10)]}) is None


def test_a_different_size_names_the_odd_rank_out_with_every_rank_s_call() -> None:
    f = _compare({0: [e(10)], 1: [e(10, sig="float32 x4 sum")], 2: [e(10)]})
    assert f.kind == "collective_mismatch" and f.ranks == (1,)
    assert [ranks for _, ranks in f.values] == [(0, 2), (1,)]
    assert "the 11th collective" in f.detail[0]


def test_no_majority_names_every_rank() -> None:
    c = _Compare((0, 1))
    c.histories[0].by_pos[3] = e(3, sig="float32 x3 sum")
    c.histories[1].by_pos[3] = e(3, sig="float32 x4 sum")

    class G:
        name, ranks = "0", (0, 1)

    f = _checker()._compare_at(G(), c, 3)
    assert f.ranks == (0, 1)


def test_a_collective_only_one_rank_issued_names_what_the_others_did_there() -> None:
    marks = {r: [Mark(8, 6)] for r in (0, 2)}
    f = _compare({1: [e(10, site="t.py:9 in debug_print")]}, marks)
    assert f.kind == "unmatched_collective" and f.ranks == (1,)
    texts = dict((ranks, text) for text, ranks in f.values)
    assert "DDP's collectives at step 6" in texts[(0, 2)]
    assert "debug_print" in texts[(1,)]


def test_a_position_inside_another_rank_s_object_collective_is_covered() -> None:
    # all_gather_object issues two collectives: position 11 is inside it on every rank
    gathered = {r: [e(10, "all_gather_object", "", span=2)] for r in range(3)}
    assert _compare(gathered, pos=11) is None
    assert _compare(gathered, pos=10) is None


def test_a_history_with_a_gap_gives_no_verdict() -> None:
    c = _Compare((0, 1, 2))
    c.histories[0].by_pos[10] = e(10)
    c.histories[1].gap = True
    assert _checker()._compare_at(_Group(), c, 10) is None


def test_point_to_point_entries_are_not_compared_by_position() -> None:
    p2p = Entry(10, 1, "send", "float32 x3 to rank 1", "t.py:2 in f", 4, True)
    assert _compare({0: [p2p]}) is None
