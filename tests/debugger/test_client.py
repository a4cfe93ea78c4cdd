"""The Debugger against simulated ranks: commands out through send_control, answers matched by
request number from the event stream, timeouts that name the silent ranks, refusals raised with
their reason, and the errors that say how to pause first."""

from __future__ import annotations

import numpy as np
import pytest

from ddpviz import events as ev
from ddpviz.debugger import protocol as p
from ddpviz.debugger.client import Debugger, DebuggerError, DebuggerTimeout, NotPaused
from tests.debugger.fake_ranks import (
    FakeRank,
    FakeSession,
    bucket_assigned,
    event,
    params_built,
)

NAMES = ["fc1.weight", "fc1.bias", "fc2.weight"]
SHAPES = [(6, 4), (6,), (2, 6)]


def make(n: int = 3, **rank_kw: object) -> tuple[FakeSession, Debugger]:
    rng = np.random.default_rng(1)
    grads = {name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in zip(NAMES, SHAPES, strict=True)}
    ranks = {}
    for r in range(n):
        tensors = {(name, "grad"): g.copy() for name, g in grads.items()}
        ranks[r] = FakeRank(r, tensors, **rank_kw)  # type: ignore[arg-type]
    history = [e for r in range(n) for e in (
        params_built(r, NAMES, SHAPES), bucket_assigned(r, -1, ((2,), (0, 1))))]
    session = FakeSession(ranks, history)
    return session, Debugger(session, timeout=2.0)  # type: ignore[arg-type]


def test_break_wait_inspect_resume_round_trip() -> None:
    session, dbg = make(3)
    session.ranks[1].tensors[("fc1.weight", "grad")][4, 2] = 7.0  # rank 1 differs here
    assert dbg.status().startswith("running")
    dbg.break_at(step=4, bucket=1)
    assert isinstance(session.collector.sent[0][1][0], p.Arm)  # armed first: bucket points?
    sent = session.collector.sent[-1]
    assert sent[0] is None and isinstance(sent[1][0], p.SetBreaks)
    assert sent[1][0].breaks == (p.BreakAt(step=4, where="bucket", bucket=1),)
    stop = dbg.wait(timeout=5)
    assert stop.agreed and (stop.step, stop.point, stop.bucket) == (4, "bucket", 1)
    assert stop.params == ("fc1.weight", "fc1.bias")  # bucket 1 of the map, by name
    assert "before bucket 1's all-reduce" in repr(stop) and "fc1.weight" in repr(stop)
    assert dbg.status() == "paused at step 4, before bucket 1's all-reduce on ranks 0,1,2"
    values = dbg.inspect("fc1.weight", "grad")
    assert values.bucket_of_param == 1
    assert [g.ranks for g in values.comparison.groups] == [(1,), (0, 2)]
    assert values.difference is not None and values.difference.position == (4, 2)
    assert values.difference.values[1] == 7.0
    equal = dbg.inspect("fc2.weight", "grad")
    assert equal.all_equal and equal.difference is None
    fetched = dbg.fetch("fc1.bias", "grad")
    assert sorted(fetched) == [0, 1, 2] and tuple(fetched[0].shape) == (6,)
    assert fetched[0].tolist() == session.ranks[0].tensors[("fc1.bias", "grad")].tolist()
    out = dbg.run("print(rank)")
    assert {r: c.stdout for r, c in out.items()} == {r: f"rank {r}\n" for r in range(3)}
    stacks = dbg.stacks()
    assert "train.py:11" in stacks.texts()[1] and "--- ranks 0,2 ---" in repr(stacks)
    dbg.resume()
    assert dbg.stop is None and dbg.status().startswith("running")
    session.close()


def test_a_silent_rank_is_named_in_the_timeout() -> None:
    session, dbg = make(3)
    session.ranks[2].silent.add("Inspect")
    dbg.pause()
    dbg.wait(timeout=5)
    with pytest.raises(DebuggerTimeout) as err:
        dbg.inspect("fc1.weight", "grad", timeout=0.5)
    assert err.value.ranks == (2,)
    assert "rank 2 did not answer Inspect within 0.5 s" in str(err.value)
    assert "rank 2 parked at step 3, before DDP's forward" in str(err.value)
    session.close()


def test_wait_before_any_rank_connected_waits_for_them_and_says_so() -> None:
    # `ddpviz record --debug=paused` just started: no rank connected yet is not "ended"
    session = FakeSession({})
    dbg = Debugger(session, timeout=2.0)  # type: ignore[arg-type]
    with pytest.raises(DebuggerTimeout, match=r"no rank connected within 0\.3 s"):
        dbg.wait(timeout=0.3)
    session.collector.stats.received[0] = 1  # one connected and ended: the job is over
    session.collector.stats.closed[0] = (0, 0)
    with pytest.raises(DebuggerError, match="the ranks ended before every one stopped"):
        dbg.wait(timeout=5)
    session.close()


def test_not_paused_says_how() -> None:
    session, dbg = make(2)
    with pytest.raises(NotPaused, match=r"dbg.pause\(\) then dbg.wait\(\)"):
        dbg.inspect("fc1.weight", "grad")
    with pytest.raises(NotPaused):
        dbg.resume()
    session.ranks[1].silent.add("Pause")
    dbg.pause()
    with pytest.raises(DebuggerTimeout) as err:
        dbg.wait(timeout=0.5)
    assert err.value.ranks == (1,)
    with pytest.raises(NotPaused, match="rank 1 is not"):
        dbg.run("x = 1")
    session.close()


def test_refusals_are_raised_with_the_reason() -> None:
    session, dbg = make(2, refuse={"SetBreaks": "watch() without a comm hook has no bucket "
                                                "safe point"})
    dbg.break_at(step=5, bucket=0)
    assert dbg.breaks == (p.BreakAt(step=5, where="bucket", bucket=0),)
    with pytest.raises(DebuggerError, match="rank 0 refused the break set: watch"):
        dbg.wait(timeout=2)
    assert dbg.breaks == ()  # what the ranks kept
    session.close()


def test_a_bucket_break_without_bucket_safe_points_says_the_fix_at_once() -> None:
    session, dbg = make(2, bucket_points=False)
    with pytest.raises(DebuggerError, match=r"guard=True") as err:
        dbg.break_at(step=5, bucket=0)
    assert err.value.ranks == (0, 1)
    assert not any(isinstance(c[0], p.SetBreaks) for _, c in session.collector.sent)
    assert dbg.breaks == ()
    dbg.break_at(step=5, where="forward")  # a forward break works there
    assert dbg.breaks == (p.BreakAt(step=5, where="forward", bucket=-1),)
    session.close()


def test_bad_input_says_what_to_pass() -> None:
    session, dbg = make(2)
    with pytest.raises(ValueError, match="bucket=K"):
        dbg.break_at(step=1)
    with pytest.raises(ValueError, match="step number"):
        dbg.break_at(step=-1, bucket=0)
    with pytest.raises(ValueError, match="did you mean 'nonfinite_gradient'"):
        dbg.break_on("nonfinite_gradients")
    with pytest.raises(ValueError, match="not a Python expression"):
        dbg.break_when("loss >")
    dbg.pause()
    dbg.wait(timeout=5)
    with pytest.raises(ValueError, match=r"did you mean 'fc1\.weight'"):
        dbg.inspect("fc1.weigth", "grad")
    with pytest.raises(ValueError, match="does not parse"):
        dbg.run("def (")
    with pytest.raises(DebuggerError, match="max_elements"):
        dbg.fetch("fc1.weight", "grad", max_elements=3)
    session.close()


def test_step_moves_every_rank_and_returns_the_new_stop() -> None:
    session, dbg = make(2)
    dbg.pause()
    assert dbg.wait(timeout=5).step == 3
    stop = dbg.step("step")
    assert stop.step == 4 and stop.point == "forward" and stop.agreed
    assert [type(c[1][0]).__name__ for c in session.collector.sent][-1] == "Step"
    session.close()


def test_abort_waits_for_every_rank_to_end() -> None:
    session, dbg = make(2)
    assert dbg.abort(timeout=3) == (0, 1)
    with pytest.raises(DebuggerError, match="no rank is connected"):
        dbg.pause()
    session.close()


def test_a_finding_break_stops_once_and_break_on_sets_it_again() -> None:
    """The ranks drop a finding break at the stop it caused (a NaN would stop every later step
    again): the break set shows it gone, and break_on(kind) sends it anew."""
    session, dbg = make(2)
    dbg.break_on("nonfinite_gradient")
    dbg.break_at(step=9, where="forward")
    why = "finding nonfinite_gradient (rank 1, bucket 0)"
    session.deliver([event(ev.Parked, r, 5, "forward", -1, why, 0) for r in range(2)])
    assert dbg.wait(timeout=5).reasons == [(why, (0, 1))]
    assert dbg.breaks == (p.BreakAt(step=9, where="forward"),)
    sent = len(session.collector.sent)
    dbg.break_on("nonfinite_gradient")
    assert session.collector.sent[sent][1][0].breaks == (
        p.BreakAt(step=9, where="forward"), p.BreakOn(kind="nonfinite_gradient"))
    session.close()
