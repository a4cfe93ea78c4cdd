"""A finding break stops once per finding: a finding said late (a check that says it a pulse
after the step) about a step before the stop it caused does not stop the ranks again once the
break is set anew; a finding about a later step does. (In one rank's Controller: the
agreement across ranks is the real-rank tests'; the bench that found it:
benchmarks/bench_debugger.py latency.)"""

from __future__ import annotations

from typing import Any

from torch import nn

from ddpviz import events as ev
from ddpviz.debugger import controller, protocol
from ddpviz.debugger.agreement import Claim


def test_a_finding_said_late_about_an_answered_step_does_not_stop_again() -> None:
    said: list[Any] = []
    c = controller.Controller(said.append, 0)
    model = nn.Linear(2, 2)
    c.att = controller.Attachment(c, model, list(model.parameters()), ["weight", "bias"],
                                  ev.Tap(said.append, 0), kind="twin", bucket_points=True)
    c.armed, c.step = True, 11
    c._kinds = {"nonfinite_gradient"}
    c.finding_said("nonfinite_gradient", 10)  # before the stop: it stops the ranks
    assert [d[1] for d in c._deferred] == ["trigger"]
    c._queue.append(protocol.Resume(5))  # (what the notebook sends the parked rank)
    why = "finding nonfinite_gradient (rank 1, bucket 0)"
    assert c._act(Claim("t1.10", 11, "trigger", why, "raw"), "forward", -1)
    assert [type(e).__name__ for e in said] == ["Parked", "Unparked"]
    assert "nonfinite_gradient" not in c._kinds and c._deferred == []
    c._kinds.add("nonfinite_gradient")  # break_on("nonfinite_gradient") again
    c.finding_said("nonfinite_gradient", 10)  # step 10's NaN, said again after its stop
    assert c._deferred == []
    c.finding_said("nonfinite_gradient", 30)  # a NaN of a later step stops the ranks
    assert [d[2] for d in c._deferred] == ["finding nonfinite_gradient (rank 0, step 30)"]
