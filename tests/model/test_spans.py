"""Spans from a rank's events: on the steps recorded without BackwardStarted (watch()'s hook-less
steps), the forward ends at the step's first gradient (BackwardComputed's first_t_ns), so a
clean run has no unfinished forward; BackwardComputed stays an event of its own in the Chrome
export."""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.model.spans import SPAN_TYPES, table_spans
from ddpviz.traces.columns import tables_of
from ddpviz.traces.trace import Trace


def _unsampled(rank: int, steps: int, t0: int = 1_000) -> list[ev.Event]:
    """A forward and a BackwardComputed per step (no BackwardStarted, no all-reduce events)."""
    out: list[ev.Event] = []
    for s in range(steps):
        t = t0 + s * 1_000
        out += [ev.ForwardStarted(rank, s, t, 2 * s),
                ev.BackwardComputed(rank, s, t + 600, 2 * s + 1, param=3, first_t_ns=t + 250)]
    return out


def _spans(events: list[ev.Event], offset: int = 0) -> list:
    (table,) = tables_of(events).values()
    return table_spans(table, offset)


def test_a_forward_ends_at_its_steps_first_gradient() -> None:
    spans = _spans(_unsampled(0, 3), offset=7)
    forwards = [s for s in spans if s.name == "forward"]
    assert [(s.step, s.start_ns, s.end_ns, s.finished) for s in forwards] == [
        (s, 1_000 + s * 1_000 + 7, 1_000 + s * 1_000 + 250 + 7, True) for s in range(3)]
    assert all(s.args["ended_by"].startswith("BackwardComputed") for s in forwards)
    assert not [s for s in spans if not s.finished]  # the last step's forward ended too


def test_a_first_gradient_outside_the_pass_ends_the_forward_at_the_mark() -> None:
    events = [ev.ForwardStarted(0, 0, 1_000, 0),
              ev.BackwardComputed(0, 0, 1_600, 1, param=0, first_t_ns=0)]  # not recorded
    (forward,) = _spans(events)
    assert (forward.start_ns, forward.end_ns, forward.finished) == (1_000, 1_600, True)


def test_a_mark_of_another_step_leaves_the_forward_open() -> None:
    events = [ev.ForwardStarted(0, 1, 1_000, 0),
              ev.BackwardComputed(0, 0, 1_600, 1, param=0, first_t_ns=1_200)]
    (forward,) = _spans(events)
    assert forward.step == 1 and not forward.finished  # the rank stopped in its forward


def test_with_backward_started_the_backward_span_is_unchanged() -> None:
    events = [ev.ForwardStarted(0, 0, 1_000, 0), ev.BackwardStarted(0, 0, 1_200, 1),
              ev.BackwardComputed(0, 0, 1_500, 2, param=0, first_t_ns=1_250),
              ev.BackwardFinished(0, 0, 1_900, 3)]
    got = {s.name: (s.start_ns, s.end_ns, s.finished) for s in _spans(events)}
    assert got == {"forward": (1_000, 1_200, True), "backward": (1_200, 1_900, True)}


def test_backward_computed_stays_an_instant_in_the_chrome_export() -> None:
    assert ev.BackwardComputed not in SPAN_TYPES
    doc = Trace(_unsampled(0, 2)).to_chrome_trace()
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "i"]
    assert names.count("BackwardComputed") == 2
    assert [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"] == ["forward"] * 2
