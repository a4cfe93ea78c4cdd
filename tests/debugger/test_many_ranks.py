"""The debugger at 3 and 4 gloo ranks through the public `run.debugger`: a break before a
bucket's all-reduce stops every rank there (torch's DDP under watch(guard=True) at 4 ranks,
ddpviz's DDP at 3), each rank's gradient of one of the bucket's parameters is its own local one
(as an unpaused run's hooks saw it), and the resumed run ends bitwise as the unpaused one.
Abort at 4 ranks: every rank process (and anything it started) is gone within 5 s of the abort,
each rank's last events (leaving its park) reached the session first, no process is left."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from ddpviz import events as ev
from tests.debugger.harness import go_ahead, launch_debug, reference, stopping
from tests.debugger.rank_fns import STEP
from tests.launch.processes import still_alive

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

STEPS = 6
WAIT = 180.0  # seconds for a stop (4 ranks on a loaded 2-core machine)


@pytest.mark.parametrize(("kind", "nprocs"), [("guard", 4), ("twin", 3)])
def test_break_at_a_bucket_reads_every_ranks_gradient_and_resumes_as_unpaused(
        kind: str, nprocs: int, tmp_path: Path):
    ref = reference("torch", STEPS, tmp_path / "ref", nprocs=nprocs)
    run, go = launch_debug(kind, STEPS, tmp_path / "run", nprocs=nprocs)
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=STEP, bucket=1)
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        assert stop.agreed and sorted(stop.ranks) == list(range(nprocs))
        assert (stop.step, stop.point, stop.bucket) == (STEP, "bucket", 1) and stop.params
        name = stop.params[0]
        values = dbg.inspect(name, "grad", timeout=WAIT)
        assert sorted(values.summaries) == list(range(nprocs)) and not values.errors
        for r in range(nprocs):  # each rank's own local gradient, before the all-reduce
            assert values[r].digest == ref[r]["local"][name], (kind, name, r)
        # per-rank data: the local gradients differ, and the first difference is located
        assert not values.all_equal and values.difference is not None
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    assert final == [ref[r]["final"] for r in range(nprocs)]


def test_abort_at_4_ranks_ends_every_process_within_5_s(tmp_path: Path):
    run, go = launch_debug("guard", 100_000, tmp_path / "run", nprocs=4, sleep=0.01)
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=2, where="forward")
        go_ahead(go)
        dbg.wait(timeout=WAIT)
        pids = list(run.pids)
        family = pids + [c.pid for pid in pids for c in psutil.Process(pid).children(
            recursive=True)]  # the ranks and whatever they started (gloo, a Sender: threads)
        assert len(still_alive(pids, within=0)) == 4
        sent = dbg.abort(wait=False)
        assert sent == (0, 1, 2, 3)
        left = still_alive(family, within=5.0)  # from the command's sending on
        assert left == [], f"processes {left} still alive 5 s after the abort"
        with pytest.raises(Exception, match="Aborted"):
            run.wait(timeout=60)
        assert run.status in ("failed", "stopped")
        # each rank said it left its park to abort before it ended, and closed its link: its
        # events were flushed to the session's trace
        assert {e.rank for e in run.trace.events()
                if isinstance(e, ev.Unparked) and e.how == "abort"} == {0, 1, 2, 3}
        assert {e.rank for e in run.trace.events() if isinstance(e, ev.Parked)} == {0, 1, 2, 3}
        assert sorted(run.session.collector.stats.closed) == [0, 1, 2, 3]
        for pid in pids:  # no process left in any rank's process group (each leads one)
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)
