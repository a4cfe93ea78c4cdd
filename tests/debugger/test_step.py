"""`dbg.step(...)` on real gloo ranks through the public `run.debugger`: "bucket" walks the
buckets of a step in launch order (at each one every rank holds its own local gradients of that
bucket's parameters, those an unpaused run's hooks saw) and from the last bucket goes on to
bucket 0 of the next step; "step" goes to the next forward (from a bucket and from a forward);
"finding" goes to the forward after the step where a planted NaN is found. Each run, resumed,
ends with bitwise the unpaused run's parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpviz.debugger.client import DebuggerError
from tests.debugger.harness import buckets, go_ahead, launch_debug, reference, stopping
from tests.debugger.rank_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

STEPS = 8
WAIT = 120.0  # seconds for a stop (a loaded machine)


@pytest.mark.parametrize("kind", ["twin", "guard"])
def test_step_bucket_walks_the_buckets_then_step_goes_to_the_next_forward(kind: str,
                                                                          tmp_path: Path):
    ref = reference("torch", STEPS, tmp_path / "ref")
    run, go = launch_debug(kind, STEPS, tmp_path / "run")
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=STEP, bucket=0)
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        dbg.clear()  # from here on only step() stops the ranks
        seen = []
        while stop.step == STEP:
            assert stop.agreed and stop.point == "bucket" and stop.params, stop
            seen.append(stop.bucket)
            # before bucket k's all-reduce: each rank's own gradients of bucket k's parameters
            for name in stop.params:
                values = dbg.inspect(name, "grad", locate=False, timeout=WAIT)
                assert not values.errors, values.errors
                for r in range(2):
                    assert values[r].digest == ref[r]["local"][name], (kind, name, r)
            stop = dbg.step("bucket", timeout=WAIT)
        n = buckets(run, STEP)
        assert n >= 2  # the model is cut in several buckets (bucket_cap_mb in rank_fns)
        assert seen == list(range(n))  # every bucket of the step, in launch order
        # from the last bucket: before bucket 0 of the next step
        assert stop.agreed and (stop.step, stop.point, stop.bucket) == (STEP + 1, "bucket", 0)
        assert all(s.reason == "step" for s in stop.ranks.values())
        stop = dbg.step("step", timeout=WAIT)  # from a bucket: the next step's forward
        assert stop.agreed and (stop.step, stop.point) == (STEP + 2, "forward")
        replicas = dbg.inspect("fc1.weight", "value", timeout=WAIT)
        assert replicas.all_equal  # at a forward every replica holds the same parameters
        stop = dbg.step("step", timeout=WAIT)  # from a forward: the next one
        assert stop.agreed and (stop.step, stop.point) == (STEP + 3, "forward")
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    assert final == [ref[0]["final"], ref[1]["final"]]


def test_step_bucket_from_the_last_bucket_of_the_last_step_says_the_ranks_ended(tmp_path: Path):
    steps = STEP + 1
    ref = reference("torch", steps, tmp_path / "ref")
    run, go = launch_debug("twin", steps, tmp_path / "run")
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=STEP, where="forward")  # the bucket map is known from here on
        go_ahead(go)
        dbg.wait(timeout=WAIT)
        last = buckets(run, STEP) - 1
        dbg.clear()
        dbg.break_at(step=STEP, bucket=last)
        dbg.resume(timeout=WAIT)
        stop = dbg.wait(timeout=WAIT)
        assert stop.agreed and (stop.step, stop.point, stop.bucket) == (STEP, "bucket", last)
        dbg.clear()
        # no bucket follows: the ranks finish the job, and step() says so instead of waiting
        with pytest.raises(DebuggerError, match="ended before every one stopped"):
            dbg.step("bucket", timeout=WAIT)
        final = run.wait(timeout=300)
    assert final == [ref[0]["final"], ref[1]["final"]]


def test_step_finding_goes_to_the_forward_after_the_nan(tmp_path: Path):
    nan_at = STEP + 2  # rank 1 plants two NaNs in its local fc1.weight gradient there
    ref = reference("twin", STEPS, tmp_path / "ref", nan_at=nan_at)
    run, go = launch_debug("twin", STEPS, tmp_path / "run", nan_at=nan_at)
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=STEP, where="forward")
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        assert (stop.step, stop.point) == (STEP, "forward")
        dbg.clear()
        stop = dbg.step("finding", timeout=WAIT)
        # rank 1's bucket holding fc1.weight was non-finite at step nan_at: every rank stops at
        # the next forward every rank can reach, saying which rank found it
        assert stop.agreed and (stop.step, stop.point) == (nan_at + 1, "forward"), stop
        assert [rs for why, rs in stop.reasons] == [(0, 1)]
        assert "nonfinite_gradient (rank 1" in stop.reasons[0][0]
        # the averaged NaNs reached every replica through the optimizer step
        values = dbg.inspect("fc1.weight", "value", timeout=WAIT)
        assert values.all_equal and all(values[r].n_nan > 0 for r in (0, 1))
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    # NaN parameters in both runs, bitwise the same bytes
    assert final == [ref[0]["final"], ref[1]["final"]]
