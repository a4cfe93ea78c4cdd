"""ddpviz/model/phases.py is the one phase table: the status header, the phase spans and the
demo's progress lines read their texts from it, and say what they said before it existed."""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.model.phases import DEMO_LINE, PHASES, SPAN_CLOSES, SPAN_OPENS, STATUS_OF
from ddpviz.model.spans import SPAN_TYPES, table_spans
from ddpviz.traces.trace import Trace


def test_each_reader_sees_the_phases_it_showed_before() -> None:
    assert STATUS_OF[ev.VerificationFailed] == "verification failed"
    assert STATUS_OF[ev.BackwardFinished] == "after backward"
    assert ev.EventsDropped not in STATUS_OF and ev.FindingReported not in STATUS_OF
    opens = {ev.VerificationStarted: "verify", ev.BroadcastStarted: "broadcast",
             ev.ForwardStarted: "forward", ev.BackwardStarted: "backward",
             ev.OptimizerStepStarted: "optimizer step"}  # (a span since stop 31)
    closes = {ev.VerificationPassed: "verify", ev.VerificationFailed: "verify",
              ev.BroadcastFinished: "broadcast", ev.ForwardStarted: "forward",
              ev.BackwardStarted: "forward", ev.BackwardFinished: "backward",
              ev.OptimizerStepFinished: "optimizer step"}
    assert opens == SPAN_OPENS and closes == SPAN_CLOSES
    assert set(SPAN_OPENS) | set(SPAN_CLOSES) <= set(SPAN_TYPES)
    assert DEMO_LINE[ev.BroadcastFinished] == "state broadcast from rank 0"
    assert set(DEMO_LINE) < set(PHASES)


def test_a_forward_closes_the_open_forward_and_the_status_follows_the_table() -> None:
    events = [ev.ForwardStarted(0, 0, 10, 0), ev.ForwardStarted(0, 0, 20, 1),
              ev.BackwardStarted(0, 0, 30, 2), ev.BackwardFinished(0, 0, 40, 3)]
    spans = table_spans(Trace(events).columns()[0], 0)
    assert [(s.name, s.start_ns, s.end_ns, s.args.get("ended_by")) for s in spans] == [
        ("forward", 10, 20, "ForwardStarted"), ("forward", 20, 30, "BackwardStarted"),
        ("backward", 30, 40, "BackwardFinished")]
    model = EventModel()
    model.feed(events[:3])
    assert model.status().phases == {0: "backward"}
    assert model.status(as_of=45).phases == {0: "backward"}
    model.feed(events[3:])
    assert model.status().phases == {0: "after backward"}
