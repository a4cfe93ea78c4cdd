"""Where a widget's events come from: a live Run or Session, a Trace, saved files, a list
(what counts as a run is traces/source.py's to say, for every verb).

`attach` feeds everything already there into the model at once and, for live sources,
subscribes so new events are fed on the collector's thread and a redraw is requested. Widgets
keep only the `Source` (what to call for status and to detach), never an engine object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel
from ddpviz.traces.source import LiveRun, open_run

if TYPE_CHECKING:
    from ddpviz.session.live import Session
    from ddpviz.traces.trace import Trace


@dataclass
class Source:
    """What a widget knows of its event source."""

    kind: str  # "run" | "session" | "trace" | "events" | "manual"
    live: bool  # new events may still arrive
    label: str
    detach: Callable[[], None] = lambda: None
    stats: Callable[[], Any] | None = None  # -> CollectorStats (live sources)
    run_status: Callable[[], str] | None = None  # -> "running" | "finished" | ...
    extra: dict[str, Any] = field(default_factory=dict)

    def is_live(self) -> bool:
        """False once a Run has finished (its session is closed)."""
        if self.run_status is not None:
            return self.run_status() == "running"
        return self.live


def feed_model(source: object, model: EventModel, on_events: Callable[[], None]) -> Source:
    """Feed `source`'s events into `model`; call `on_events()` after each live batch.

    Args:
        source: a `ddpviz.Run`, a `Session`, a `Trace`, a path to a `.ddpviz` file or a
            folder of them, an iterable of events (what counts as a run: traces/source.py), or
            None (nothing yet: feed the widget by hand).

    Returns:
        The `Source` the widget keeps: what it shows, whether it is live, how to detach.
    """
    if source is None:
        return Source("manual", True, "events fed by hand")
    run = open_run(source, refusal="cannot show events from")
    if run.kind == "run":
        return _from_run(run.live, model, on_events)
    if run.kind == "session":
        return _from_session(run.live, model, on_events, "session")
    if run.trace is not None:
        return _from_trace(run.trace, model, run.label)
    model.feed(e for e in run.events if isinstance(e, Event))
    return Source("events", False, f"{len(model):,} events")


def _from_trace(trace: Trace, model: EventModel, label: str) -> Source:
    model.set_clock(trace.clock)
    for table in trace.columns().values():  # per rank, in its order; columns, no objects
        model.feed_table(table)
    return Source("trace", False, f"{label}: {len(trace):,} events from {len(trace.ranks)} "
                  "ranks")


def _from_session(session: Session, model: EventModel, on_events: Callable[[], None],
                  label: str) -> Source:
    model.set_clock(session.trace.clock)

    def receive(batch: list[Event]) -> None:
        model.feed(batch)
        on_events()

    def history(trace: Trace) -> None:  # what came before: as columns, like a loaded trace
        model.set_clock(trace.clock)
        for table in trace.columns().values():
            model.feed_table(table)

    unsubscribe = session.subscribe(receive, batch=True, history=history)
    return Source("session", True, f"{label} {session.collector.address}", unsubscribe,
                  lambda: session.stats)


def _from_run(run: LiveRun, model: EventModel, on_events: Callable[[], None]) -> Source:
    src = _from_session(run.session, model, on_events, "run")
    src.kind = "run"
    src.label = f"ddpviz.launch: {run.nprocs} ranks ({run.backend})"
    src.run_status = lambda: run.status
    src.extra["nprocs"] = run.nprocs
    return src
