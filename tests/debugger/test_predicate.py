"""`break_when` in the training loop's names, on real gloo ranks: a predicate on the loop's own
`loss` and loop variable stops every rank at one agreed forward, code run there reads the loop's
names, and the run resumed ends bitwise as an unpaused one. A predicate naming what no point
has is dropped, saying so, and the job runs on untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpviz import events as ev
from tests.debugger.harness import reference, stopping
from tests.debugger.test_client_e2e import _launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 8


def test_a_predicate_on_the_loops_loss_stops_every_rank_and_resume_ends_as_unpaused(
        tmp_path: Path) -> None:
    ref = reference("twin", STEPS, tmp_path / "ref")
    # true once: on rank 1 after step 3's optimizer step, where the loop's `s` is 3 and its
    # `loss` is step 3's (a float comparison with the unpaused run's own value)
    loss3 = ref[1]["losses"][3]
    predicate = f"rank == 1 and s == 3 and loss.item() == {loss3!r}"
    run, go = _launch(tmp_path / "run", STEPS)
    with stopping(run):
        dbg = run.debugger
        dbg.break_when(predicate)
        go.touch()
        stop = dbg.wait(timeout=120)
        # claimed at the next forward after that optimizer step: every rank at step 5's
        assert stop.agreed and (stop.step, stop.point) == (5, "forward")
        assert all(r.reason == f"predicate: {predicate}" for r in stop.ranks.values()), stop
        # parked before step 5's forward: the loop's `s` is 5 and its `loss` still step 4's
        out = dbg.run("(s, loss.item())", timeout=60)
        assert {r: out[r].result for r in (0, 1)} == \
            {r: repr((5, ref[r]["losses"][4])) for r in (0, 1)}
        dbg.clear()
        dbg.resume(timeout=60)
        final = run.wait(timeout=240)
    assert final == [ref[0]["final"], ref[1]["final"]]


def test_a_predicate_naming_nothing_the_loop_has_is_dropped_saying_so(tmp_path: Path) -> None:
    ref = reference("twin", STEPS, tmp_path / "ref")
    run, go = _launch(tmp_path / "run", STEPS, sleep=0.05)
    refused: list[ev.DebugRefused] = []
    run.session.collector.subscribe(
        lambda batch: refused.extend(e for e in batch if isinstance(e, ev.DebugRefused)),
        batch=True)
    with stopping(run):
        run.debugger.break_when("lost > 1")  # a typo of the loop's `loss`
        go.touch()
        final = run.wait(timeout=240)
    assert final == [ref[0]["final"], ref[1]["final"]]  # never stopped, untouched
    assert sorted(e.rank for e in refused) == [0, 1], refused  # once per rank
    for e in refused:
        assert "'lost'" in e.reason and "dropped" in e.reason, e.reason
    records = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["losses"] for r in records] == [r["losses"] for r in ref]
