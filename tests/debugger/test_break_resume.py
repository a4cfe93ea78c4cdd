"""Break at a bucket of a step, inspect every rank's gradients there, resume: the paused run
ends bitwise as the unpaused one (ddpviz's DDP, torch's DDP under watch(guard=True), and under
the default watch() with its forward/optimizer-step safe points)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.debugger.protocol import BreakAt, Inspect, Resume, SetBreaks
from tests.debugger.harness import Job, debug_job, reference, request
from tests.debugger.rank_fns import STEP

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")
STEPS = 6


def _on_to_the_optimizer_step_and_the_end(job: Job, ref: list[dict[str, Any]]) -> Any:
    """Resume to the break after step STEP's optimizer step; there every gradient is averaged,
    equal across ranks and equal to the unpaused run's; resume to the end: what the ranks
    returned."""
    job.send(Resume(request()))
    second = job.parked(2)[2:]
    assert {(p.rank, p.step, p.point) for p in second} == {
        (r, STEP, "optimizer_step") for r in range(2)}
    for name in NAMES:
        got = job.ask(Inspect(request(), name, "grad"), ev.Inspected)
        assert got[0].digest == got[1].digest == ref[0]["averaged"][name], name
    job.send(Resume(request()))
    return job.run.wait(timeout=240)


@pytest.mark.parametrize("kind", ["twin", "guard"])
def test_break_at_a_bucket_inspect_and_resume_ends_as_unpaused(kind: str, tmp_path: Path):
    ref = reference("torch", STEPS, tmp_path / "ref")
    breaks = SetBreaks(request(), (BreakAt(STEP, "bucket", 1), BreakAt(STEP, "optimizer_step")))
    with debug_job(kind, STEPS, tmp_path / "run", commands=(breaks,)) as job:
        first = job.parked(1)
        assert {(p.rank, p.step, p.point, p.bucket) for p in first} == {
            (r, STEP, "bucket", 1) for r in range(2)}
        # at the bucket: the gradients computed so far are this rank's local ones, exactly
        # those an unpaused torch DDP run had at this step (its gradient hooks saw them)
        matched = 0
        for name in NAMES:
            got = job.ask(Inspect(request(), name, "grad"), ev.Inspected)
            for rank, reply in got.items():
                if reply.error:
                    assert "no gradient" in reply.error  # a later bucket: not computed yet
                    continue
                assert reply.digest == ref[rank]["local"][name], (kind, name, rank)
                matched += 1
        assert matched >= 2  # bucket 1's parameters (on both ranks) at least
        buf = job.ask(Inspect(request(), "", "bucket_buffer", bucket=1), ev.Inspected)
        grads = job.ask(Inspect(request(), "", "bucket_grads", bucket=1), ev.Inspected)
        for rank in range(2):
            # the flat buffer holds bucket 1's local gradients (pre-divided by the world size
            # where DDP's built-in all-reduce does so): as many elements, all finite
            assert not buf[rank].error and buf[rank].numel == grads[rank].numel > 0
            assert buf[rank].n_nan == 0 and len(buf[rank].chunk_digests) > 0
        assert buf[0].digest != buf[1].digest  # unreduced: each rank its own data
        values = _on_to_the_optimizer_step_and_the_end(job, ref)
    assert values == [ref[0]["final"], ref[1]["final"]]
    assert values[0] == values[1]


def test_the_hookless_watch_stops_at_the_forward_and_the_optimizer_step(tmp_path: Path):
    ref = reference("torch", STEPS, tmp_path / "ref")
    set_breaks = SetBreaks(request(), (BreakAt(STEP, "forward"), BreakAt(STEP, "bucket", 0),
                                       BreakAt(STEP, "optimizer_step")))
    with debug_job("hookless", STEPS, tmp_path / "run", commands=(set_breaks,)) as job:
        refused = job.replies.wait(lambda e: isinstance(e, ev.DebugRefused), 2)
        assert all("guard=True" in e.reason for e in refused)
        first = job.parked(1)
        assert {(p.rank, p.step, p.point) for p in first} == {
            (r, STEP, "forward") for r in range(2)}
        value = job.ask(Inspect(request(), "fc2.weight", "value"), ev.Inspected)
        assert value[0].digest == value[1].digest  # replicas agree
        values = _on_to_the_optimizer_step_and_the_end(job, ref)
    assert values == [ref[0]["final"], ref[1]["final"]]
