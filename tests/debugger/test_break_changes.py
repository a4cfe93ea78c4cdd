"""Break-set changes in a row, agreed while the ranks train: each change is claimed for the next
forward on the store (one key per step), and a fast rank that read one claim and made the next
must not erase the claim a slower rank has yet to read. With one key for every claim the ranks
disagreed on the break set of a step: one parked before a bucket while the other waited in
that bucket's all-reduce (found with five `dbg.break_at` calls in a row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpviz.debugger.protocol import BreakAt, Resume, SetBreaks
from tests.debugger.harness import debug_job, reference, request
from tests.debugger.rank_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 6


def test_break_set_changes_in_a_row_stop_every_rank_at_the_same_points(tmp_path: Path) -> None:
    ref = reference("torch", STEPS, tmp_path / "ref")
    wanted = [BreakAt(STEP, "bucket", 0), BreakAt(STEP, "bucket", 1),
              BreakAt(STEP + 1, "forward"), BreakAt(STEP + 1, "optimizer_step")]
    # what a notebook sends for four break_at calls: each time the whole set so far; claimed
    # one a step from step 1 on, so the set of step STEP holds both bucket breaks
    sets = [SetBreaks(request(), tuple(wanted[:i + 1])) for i in range(len(wanted))]
    points = [(STEP, "bucket", 0), (STEP, "bucket", 1), (STEP + 1, "forward", -1),
              (STEP + 1, "optimizer_step", -1)]
    with debug_job("twin", STEPS, tmp_path / "run", commands=tuple(sets)) as job:
        for n, point in enumerate(points):
            parked = job.parked(n + 1, timeout=120)[2 * n:]
            assert {(p.rank, p.step, p.point, p.bucket) for p in parked} == {
                (r, *point) for r in range(2)}, (n, parked)
            job.send(Resume(request()))
        values = job.run.wait(timeout=240)
    assert values == [ref[0]["final"], ref[1]["final"]]


def test_the_newest_break_set_before_a_boundary_is_the_one_in_force(tmp_path: Path) -> None:
    """A break set, cleared, set and cleared again, then a break elsewhere, all before the ranks
    reach a boundary (a notebook user who clicks a bucket, thinks better of it and clicks
    another): each set is whole, so the newest is the one in force at the next boundary. Claimed
    one a boundary in turn, the third (bucket 0 at STEP) was still in force at STEP and every
    rank parked there instead (found with the dashboard's "clear breaks")."""
    ref = reference("torch", STEPS, tmp_path / "ref")
    first, last = BreakAt(STEP, "bucket", 0), BreakAt(STEP, "bucket", 1)
    sets = tuple(SetBreaks(request(), breaks)
                 for breaks in ((first,), (), (first,), (), (last,)))
    with debug_job("twin", STEPS, tmp_path / "run", commands=sets) as job:
        parked = job.parked(1, timeout=120)
        assert {(p.rank, p.step, p.point, p.bucket) for p in parked} == {
            (r, STEP, "bucket", 1) for r in range(2)}, parked
        job.send(Resume(request()))
        values = job.run.wait(timeout=240)
        assert len([e for e in job.replies.events if type(e).__name__ == "Parked"]) == 2
    assert values == [ref[0]["final"], ref[1]["final"]]
