"""Break on a planted NaN through the public API: rank 1's fc1.weight gradient gets two NaNs at
one step; `break_on("nonfinite_gradient")` stops every rank, and inspecting the gradient the
origin rank kept from before its all-reduce shows where the NaNs are, on that rank only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.debugger.harness import stopping
from tests.debugger.rank_fns import STEP
from tests.debugger.test_client_e2e import _launch

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]


def test_break_on_a_planted_nan_shows_the_origin_ranks_positions(tmp_path: Path) -> None:
    run, go = _launch(tmp_path, 8, nan_at=STEP)
    with stopping(run):
        dbg = run.debugger
        dbg.break_on("nonfinite_gradient")
        ready = tmp_path / "go.tmp"  # the ranks train once they have the break (rank_fns)
        ready.write_text("commands")
        ready.replace(go)
        stop = dbg.wait(timeout=120)
        # the next forward after the step where the NaN was said
        assert stop.agreed and (stop.step, stop.point) == (STEP + 1, "forward")
        assert any("nonfinite_gradient" in why for why, _ in stop.reasons)
        kept = dbg.inspect("fc1.weight", "grad_before_allreduce", timeout=60)
        assert 1 in kept.summaries, kept.errors
        origin = kept[1]
        assert origin.n_nan == 2 and set(origin.nonfinite_at) == {(0, 1), (2, 3)}
        assert 1 in kept.comparison.nonfinite and 0 not in kept.comparison.nonfinite
        assert "rank 1: 2 NaN" in repr(kept) and "first at [[0, 1], [2, 3]]" in repr(kept)
        assert 0 in kept.errors  # nothing non-finite there, so nothing was kept
        dbg.abort(timeout=10)
