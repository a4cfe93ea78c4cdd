"""Where a widget's events come from: a live Run or Session, a Trace, a saved file, a list.

`attach` feeds everything already there into the model at once and, for live sources,
subscribes so new events are fed on the collector's thread and a redraw is requested. Widgets
keep only the `Source` (what to call for status and to detach), never an engine object.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel

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


@runtime_checkable
class LiveRun(Protocol):
    """What a widget reads of a launch (`ddpviz.Run` is one): its Session, whether it still
    runs, and how it was started. A protocol, so that widgets never import the launcher."""

    @property
    def session(self) -> Session: ...
    @property
    def status(self) -> str: ...  # "running" | "finished" | ...
    nprocs: int
    backend: str


def attach(source: object, model: EventModel, on_events: Callable[[], None]) -> Source:
    """Feed `source`'s events into `model`; call `on_events()` after each live batch.

    Args:
        source: a `ddpviz.Run`, a `Session`, a `Trace`, a path to a `.ddpviz` file, an
            iterable of events, or None (nothing yet: feed the widget by hand).
    """
    from ddpviz.session.live import Session
    from ddpviz.traces.trace import Trace

    if source is None:
        return Source("manual", True, "events fed by hand")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return _from_trace(Trace.load(path), model, f"trace {path.name}")
    if isinstance(source, Trace):
        return _from_trace(source, model, "trace")
    if isinstance(source, LiveRun):
        return _from_run(source, model, on_events)
    if isinstance(source, Session):
        return _from_session(source, model, on_events, "session")
    if isinstance(source, Iterable):
        model.feed(e for e in source if isinstance(e, Event))
        return Source("events", False, f"{len(model):,} events")
    raise TypeError(
        f"ddpviz: cannot show events from a {type(source).__name__}.\n"
        "Pass a ddpviz.Run, a Session (ddpviz.listen()), a Trace, a .ddpviz path or a list of "
        "events.")


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
