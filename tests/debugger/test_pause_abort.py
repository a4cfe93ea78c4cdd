"""Pause at the next boundary (every rank parks at the same step), run code and take stacks
there, resume to the end bitwise as unpaused; abort ends every rank within 5 s with its events
flushed and no process left; a NaN planted on rank 1 stops the job, and rank 1's gradient from
before the all-reduce shows where; a peer without the secret cannot pause the job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from ddpviz import events as ev
from ddpviz.debugger.protocol import (
    Abort,
    BreakOn,
    Fetch,
    Inspect,
    Pause,
    Resume,
    RunCode,
    SetBreaks,
    Stacks,
)
from ddpviz.transport.codec import Codec, make_header
from ddpviz.transport.handshake import secure_client
from tests.debugger.harness import debug_job, reference, request
from tests.debugger.rank_fns import STEP
from tests.launch.processes import still_alive

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

LONG = 60  # steps of a job paused while it runs (a few ms each, plus `sleep`)


def test_pause_parks_every_rank_at_one_step_and_resume_ends_as_unpaused(tmp_path: Path):
    ref = reference("twin", LONG, tmp_path / "ref")
    with debug_job("twin", LONG, tmp_path / "run", sleep=0.02) as job:
        job.replies.wait(lambda e: False, 0, 1)
        time.sleep(0.3)  # training is under way
        job.send(Pause(request()))
        parked = job.parked(1)
        steps = {p.step for p in parked}
        assert len(steps) == 1 and {p.point for p in parked} == {"forward"}, parked
        step = steps.pop()
        assert 0 < step < LONG
        ran = job.ask(RunCode(request(), "print(rank, step)\nstep * 10"), ev.CodeRan)
        for rank, reply in ran.items():
            assert reply.error == "" and reply.stdout == f"{rank} {step}\n"
            assert reply.result_repr == repr(step * 10)
        bad = job.ask(RunCode(request(), "1 / 0"), ev.CodeRan)
        assert all("ZeroDivisionError" in r.error for r in bad.values())
        stacks = job.ask(Stacks(request()), ev.StacksTaken)
        assert all(any("_park" in s for s in r.stacks) for r in stacks.values())
        value = job.ask(Inspect(request(), "fc1.weight", "value"), ev.Inspected)
        assert value[0].digest == value[1].digest
        fetched = job.ask(Fetch(request(), "fc1.weight", "value", max_elements=10), ev.Fetched)
        assert all("max_elements=10" in r.error and "slice" in r.error
                   for r in fetched.values())
        job.send(Resume(request()))
        values = job.run.wait(timeout=240)
    assert values == [ref[0]["final"], ref[1]["final"]]


def test_abort_ends_every_rank_within_5_s_events_flushed(tmp_path: Path):
    with debug_job("twin", 100_000, tmp_path / "run", sleep=0.01) as job:
        time.sleep(0.3)
        job.send(Pause(request()))
        job.parked(1)
        pids = list(job.run.pids)
        assert len(still_alive(pids, within=0)) == 2
        t0 = time.monotonic()
        job.send(Abort(request()))
        left = still_alive(pids, within=5.0)
        took = time.monotonic() - t0
        assert left == [], f"ranks {left} still alive {took:.1f} s after the abort"
        # each rank said it left its park, and its sender said goodbye: events flushed
        unparked = job.replies.wait(lambda e: isinstance(e, ev.Unparked), 2, timeout=10)
        assert {(e.rank, e.how) for e in unparked} == {(0, "abort"), (1, "abort")}
        assert job.session.collector.wait(lambda s: sorted(s.closed) == [0, 1], timeout=10)
        with pytest.raises(Exception, match="Aborted"):
            job.run.wait(timeout=30)


def test_a_planted_nan_stops_the_job_and_shows_rank_1s_local_gradient(tmp_path: Path):
    arm = SetBreaks(request(), (BreakOn("nonfinite_gradient"),))
    with debug_job("twin", 8, tmp_path / "run", nan_at=STEP, commands=(arm,)) as job:
        parked = job.parked(1)
        assert {(p.rank, p.step, p.point) for p in parked} == {
            (r, STEP + 1, "forward") for r in range(2)}
        assert all("nonfinite_gradient" in p.reason for p in parked)
        kept = job.ask(Inspect(request(), "fc1.weight", "grad_before_allreduce"), ev.Inspected)
        assert kept[1].error == "" and kept[1].n_nan == 2
        assert kept[1].nonfinite_at == ((0, 1), (2, 3))
        assert kept[1].shape == (16, 8) and kept[1].finiteness[0] > 0
        assert "no local gradient" in kept[0].error  # rank 0's own gradient was finite
        job.send(Resume(request()))
        job.run.wait(timeout=240)


def test_a_peer_without_the_secret_cannot_pause_the_job(tmp_path: Path):
    ref = reference("twin", 30, tmp_path / "ref")
    with debug_job("twin", 30, tmp_path / "run", sleep=0.02) as job:
        collector = job.session.collector
        wrong = b"ab" * 32
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_client(sock, wrong)
        sock.connect(collector.address)
        for r in range(2):  # what a collector would send, signed with the wrong secret
            sock.send_multipart(Codec(wrong).encode(make_header("control", r, "x", r, count=1),
                                                    [Pause(request())]))
        values = job.run.wait(timeout=240)
        sock.close(0)
        assert collector.stats.rejected["auth"] >= 1
        assert not [e for e in job.replies.events if isinstance(e, ev.Parked)]
    assert values == [ref[0]["final"], ref[1]["final"]]


def test_a_finding_said_by_the_hookless_watch_stops_every_rank_at_one_step(tmp_path: Path):
    """No bucket safe point there: the nonfinite_gradient finding the watch says (its own NaN
    check) triggers the break, at the next forward every rank can reach. That check says it
    from the ranks' gathered states, a pulse (about half a second) after the step: the steps
    sleep 0.25 s so that the job is still running then (without, all 12 steps were over first)."""
    arm = SetBreaks(request(), (BreakOn("nonfinite_gradient"),))
    with debug_job("hookless", 12, tmp_path / "run", nan_at=STEP, commands=(arm,),
                   sleep=0.25) as job:
        parked = job.parked(1)
        steps = {p.step for p in parked}
        assert len(steps) == 1 and steps.pop() > STEP
        assert {p.point for p in parked} == {"forward"}
        assert all("finding nonfinite_gradient" in p.reason for p in parked)
        job.send(Resume(request()))
        job.run.wait(timeout=240)
    assert len([e for e in job.replies.events if isinstance(e, ev.Parked)]) == 2  # only once
