"""The debugger on NCCL, a GPU per rank (world size 1 on one GPU): a break before bucket 1's
all-reduce at step 3, with ddpviz's DDP and with torch's DDP under watch(guard=True); each
rank's gradient there is its own local one (as an unpaused torch DDP run's gradient hooks saw
it), and the resumed run ends with the unpaused run's bits. A parked rank launches nothing, so
NCCL's watchdog has no work to time out while it waits. Skipped without CUDA (conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.debugger.harness import go_ahead, launch_debug, reference
from tests.debugger.rank_fns import STEP
from tests.gpu.conftest import world_size

pytestmark = pytest.mark.timeout(900)

STEPS = 6
WAIT = 180.0


@pytest.mark.parametrize("kind", ["twin", "guard"])
def test_a_bucket_break_on_nccl_reads_the_local_gradient_and_resumes_as_unpaused(
        kind: str, tmp_path: Path) -> None:
    n = world_size()
    ref = reference("torch", STEPS, tmp_path / "ref", nprocs=n, device="cuda")
    run, go = launch_debug(kind, STEPS, tmp_path / "run", nprocs=n, device="cuda")
    try:
        dbg = run.debugger
        dbg.break_at(step=STEP, bucket=1)
        go_ahead(go)
        stop = dbg.wait(timeout=WAIT)
        assert stop.agreed and sorted(stop.ranks) == list(range(n))
        assert (stop.step, stop.point, stop.bucket) == (STEP, "bucket", 1) and stop.params
        name = stop.params[0]
        values = dbg.inspect(name, "grad", timeout=WAIT)
        assert values[0].device.startswith("cuda"), values[0]
        for r in range(n):  # each rank's own local gradient, before the all-reduce
            assert values[r].digest == ref[r]["local"][name], (kind, name, r)
        dbg.resume(timeout=WAIT)
        final = run.wait(timeout=300)
    finally:
        if not run.done():
            run.stop()
    assert final == [ref[r]["final"] for r in range(n)]
