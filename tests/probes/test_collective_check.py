"""The comparison of ranks' collective histories (probes/collective_check.py) on histories
made by hand: what is a verdict and what is not; the claim of a position a new call site's
collective takes, by two or three ranks' checkers over one store. The real jobs are in
tests/record/test_collectives.py."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
import torch.distributed as dist

from ddpviz.engine.comm import BUFFERS, EVALUATION
from ddpviz.events import Tap
from ddpviz.probes.collective_check import CollectiveCheck, _Compare
from ddpviz.probes.collectives import Call, Entry, GroupLedger, Mark


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


# --- an evaluation on some ranks only (See [Note: an evaluation on some ranks only]) ----------

def bcast(step: int, forward: int, site: str) -> Entry:
    return Entry(10, 1, "broadcast", "float32 x32 from group rank 0", site, step,
                 forward=forward)


def test_an_evaluation_s_broadcast_paired_with_a_training_forward_s_names_the_evaluating_rank(
        ) -> None:
    f = _compare({0: [bcast(39, EVALUATION, "t.py:49 in evaluate")],
                  1: [bcast(40, BUFFERS, "t.py:72 in main")],
                  2: [bcast(40, BUFFERS, "t.py:72 in main")]})
    assert f is not None and f.kind == "unmatched_collective" and f.ranks == (0,)
    assert f.step == 39
    assert f.title.startswith("rank 0 ran a forward through the DDP without gradients (an "
                              "evaluation) at t.py:49 in evaluate at step 39 that ranks 1,2 "
                              "did not"), f.title
    assert "ranks 1,2 issued DDP's buffer broadcast of the training forward at step 40" \
        in f.title
    texts = {ranks: text for text, ranks in f.values}
    assert "in evaluate" in texts[(0,)] and "without gradients" in texts[(0,)]
    assert texts[(1, 2)].startswith("DDP's buffer broadcast of the training forward at step 40")
    assert "ddp.module" in f.fix


def test_every_rank_evaluating_is_no_finding() -> None:
    assert _compare({r: [bcast(39, EVALUATION, f"t.py:{r} in evaluate")]
                     for r in range(3)}) is None
    # (and DDP's own broadcasts paired with each other, from any call site: none either)
    assert _compare({r: [bcast(39 + r, BUFFERS, f"t.py:{r} in main")] for r in range(3)}) is None


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


# --- claiming a position (See [Note: claiming a position]): two ranks' checkers, one store ----


class _Ledger(GroupLedger):
    """A group's ledger on one rank, its sequence number set by the test."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        super().__init__(None, "0", ranks)  # type: ignore[arg-type]
        self.at = 4

    def seq(self) -> int | None:
        return self.at


def _rank_checker(store: dist.Store, rank: int, emitted: list[Any] | None = None) -> Any:
    """A rank's checker without its thread or hooks: the training thread's side only."""
    check = CollectiveCheck.__new__(CollectiveCheck)
    check.tap = Tap((emitted if emitted is not None else []).append, rank=rank)
    check.store, check.rank, check.epoch = store, rank, 0
    check.posters, check.compares, check.findings = {}, {}, []
    check.stuck_reported = False
    check._blocked_posted = None
    check.world = 0
    check._stale = []
    check._stop = threading.Event()
    check._post_lock, check._tick_lock = threading.Lock(), threading.Lock()
    return check


class _Call(Call):
    """A recorded call whose signature and site text the test gives."""

    sig: str = ""
    site: str = ""

    def entry(self) -> Entry:
        return Entry(self.pos, self.span, self.op, self.sig, self.site, self.step,
                     forward=self.forward)


def _issue(check: Any, g: _Ledger, sig: str, site: str = "t.py:9 in log_metrics") -> None:
    """What the ledger does for a new call site's first collective: record it, then the hook."""
    g.entries.append(_Call(g.at, -1, "all_gather", (), None, 0, 0, False, -1, sig=sig,
                           site=site))
    g.count += 1
    check._post_first(g)


@pytest.fixture
def store() -> dist.Store:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))


def test_the_rank_that_claims_second_names_a_mismatch_before_its_call_runs(
        store: dist.Store) -> None:
    ranks = (0, 1)
    emitted: list[Any] = []
    checks = {r: _rank_checker(store, r, emitted if r == 0 else None) for r in ranks}
    ledgers = {r: _Ledger(ranks) for r in ranks}
    _issue(checks[1], ledgers[1], "float32 x4 into 2")
    assert checks[1].findings == []  # first there: nothing to compare with yet
    _issue(checks[0], ledgers[0], "float32 x3 into 2")
    [f] = checks[0].findings
    assert f.kind == "collective_mismatch" and f.ranks == (0, 1)
    texts = {ranks: text for text, ranks in f.values}
    assert "float32 x3 into 2" in texts[(0,)] and "float32 x4 into 2" in texts[(1,)]
    assert "t.py:9 in log_metrics" in texts[(0,)]
    assert "the 5th collective" in f.detail[0]
    assert [type(x).__name__ for x in emitted] == ["FindingReported"]
    # rank 1's call returned (rank 0 died in its own): its comparison at exit finds the same
    # difference, and says nothing more of it
    ledgers[1].at, ledgers[1].entries[-1].span = 5, 1
    checks[1]._post(ledgers[1])
    checks[1]._check(ledgers[1])
    assert checks[1].compares["0"].done and checks[1].findings == []


def test_the_same_call_claimed_by_every_rank_is_no_finding(store: dist.Store) -> None:
    ranks = (0, 1, 2)
    checks = {r: _rank_checker(store, r) for r in ranks}
    for r in (2, 0, 1):
        _issue(checks[r], _Ledger(ranks), "float32 x3 into 3", site=f"t.py:{r} in f")
    assert all(c.findings == [] for c in checks.values())
    assert not store.check(["ddpviz/coll/0/0/named"])


def test_a_rank_not_yet_there_leaves_the_two_calls_observed(store: dist.Store) -> None:
    ranks = (0, 1, 2)
    checks = {r: _rank_checker(store, r) for r in ranks}
    _issue(checks[2], _Ledger(ranks), "float32 x3 into 3")
    _issue(checks[1], _Ledger(ranks), "float32 x4 into 3")  # rank 0 has not posted at all
    [f] = checks[1].findings
    assert f.ranks == (1, 2)
    assert sorted(ranks for _, ranks in f.values) == [(1,), (2,)]


def test_the_rank_that_claims_second_names_an_evaluation_before_its_broadcast_runs(
        store: dist.Store) -> None:
    ranks = (0, 1)
    checks = {r: _rank_checker(store, r) for r in ranks}
    ledgers = {r: _Ledger(ranks) for r in ranks}
    # rank 1's training forward claims first (its broadcast's site changed: See [Note: a
    # known call site that changed]); it would meet rank 0 there: claimed without meeting
    ledgers[1].entries.append(_Call(4, -1, "broadcast", (), None, 0, 40, False, -1,
                                    BUFFERS, sig="float32 x32 from group rank 0",
                                    site="t.py:72 in main"))
    ledgers[1].count += 1
    checks[1]._post(ledgers[1], issuing=True)
    checks[1]._claim(ledgers[1], ledgers[1].entries[-1].entry())
    assert checks[1].findings == []
    # rank 0's evaluation: a new site, posted and claimed before its broadcast runs
    ledgers[0].entries.append(_Call(4, -1, "broadcast", (), None, 0, 39, False, -1,
                                    EVALUATION, sig="float32 x32 from group rank 0",
                                    site="t.py:49 in evaluate"))
    ledgers[0].count += 1
    checks[0]._post_first(ledgers[0])
    [f] = checks[0].findings
    assert f.kind == "unmatched_collective" and f.ranks == (0,) and f.step == 39
