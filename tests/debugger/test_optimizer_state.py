"""`dbg.optimizer_state(name, "exp_avg")` with Adam at a break after the optimizer step, on real
gloo ranks: every rank holds the same state, bitwise the unpaused run's at that step (its
training loop recorded the digests after the same step), and the resumed run ends bitwise as
the unpaused one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.debugger.harness import go_ahead, launch_debug, reference, stopping
from tests.debugger.rank_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

STEPS = 6
WAIT = 120.0
NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")


@pytest.mark.parametrize("kind", ["twin", "guard"])
def test_adam_exp_avg_at_the_optimizer_step_is_the_unpaused_runs(kind: str, tmp_path: Path):
    ref = reference("torch", STEPS, tmp_path / "ref", optim="adam")
    run, go = launch_debug(kind, STEPS, tmp_path / "run", optim="adam")
    with stopping(run):
        dbg = run.debugger
        dbg.break_at(step=STEP, where="optimizer_step")
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        assert stop.agreed and (stop.step, stop.point) == (STEP, "optimizer_step")
        for name in NAMES:
            values = dbg.optimizer_state(name, "exp_avg", timeout=WAIT)
            assert not values.errors and values.all_equal, (name, values.errors)
            for r in (0, 1):
                assert values[r].digest == ref[r]["exp_avg"][name], (kind, name, r)
        sq = dbg.optimizer_state("fc1.weight", "exp_avg_sq", timeout=WAIT)
        assert sq.all_equal and sq[0].digest != values[0].digest
        missing = dbg.optimizer_state("fc1.weight", "momentum_buffer", timeout=WAIT)
        assert all("exp_avg" in missing.errors[r] for r in (0, 1))  # names the keys it has
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    assert final == [ref[0]["final"], ref[1]["final"]]
