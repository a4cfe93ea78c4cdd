"""EventView: what every event widget shares: a model, a source, a throttle, replay sliders.

A view draws from an `EventModel` at a `Cursor`. Standalone, it owns the model, attaches its
source (live subscription or a trace), throttles redraws (<= max_hz, in a background thread
while live) and shows ReplayControls. Inside the Dashboard it is "embedded": the dashboard owns
the model, the throttle and the sliders, and calls `render(cursor)` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import ipywidgets as w

from ddpviz.events import Event
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import gc_paused
from ddpviz.widgets.replay_controls import Cursor, ReplayControls
from ddpviz.widgets.source import Source, feed_model
from ddpviz.widgets.throttle import Throttle


class EventView(w.VBox):
    """Base of the event widgets. Subclasses build `body` widgets and implement `render`.

    Args:
        source: a Run, Session, Trace, `.ddpviz` path, list of events, or None (feed by hand).
        model: share an existing model instead (the source is then not attached again).
        controls: show the iteration/time sliders (standalone widgets only).
        max_hz: live redraws per second at most.
    """

    def __init__(self, source: object = None, *, model: EventModel | None = None,
                 controls: bool = True, max_hz: float = 10.0, embedded: bool = False,
                 **kwargs: Any) -> None:
        # The first build and paint make ~100,000 objects that all live on (no cycles to
        # free): cyclic GC passes over the notebook's whole heap on the way (~0.25 s of a
        # 256-rank dashboard's 1.4 s), so it is paused, as trace loading pauses it.
        with gc_paused():
            self.model = model if model is not None else EventModel()
            self.embedded = embedded
            self._render_lock = threading.RLock()
            self._ready = False  # no background redraw before the widget is fully built
            self.throttle: Throttle | None = None
            self.controls: ReplayControls | None = None
            self.source: Source = Source("embedded", False, "embedded")
            body = self._build()
            children: list[w.Widget] = []
            if not embedded:
                self.throttle = Throttle(self._tick, max_hz,
                                         name=f"ddpviz-{type(self).__name__}")
                if model is None:
                    self.source = feed_model(source, self.model, self._request)
                else:
                    self.source = Source("model", True, "shared model")
                if controls:
                    self.controls = ReplayControls(self.model, self._on_cursor,
                                                   live=self.source.live)
                    children.append(self.controls)
            super().__init__(children=[*children, *body], **kwargs)
            self._ready = True
            if not embedded:
                self.refresh()

    # --- for subclasses -------------------------------------------------------------------

    def _build(self) -> list[w.Widget]:
        """Create the widgets (empty); called once before the first render. Overridden."""
        return []

    def render(self, cursor: Cursor) -> bool:
        """Draw the model at `cursor`. Returns True if a part was held back (bytes budget).
        Overridden; the base draws nothing."""
        return False

    # --- public ---------------------------------------------------------------------------

    def cursor(self) -> Cursor:
        return self.controls.cursor() if self.controls is not None else Cursor(None, None)

    def refresh(self) -> None:
        """Redraw now, in this thread (also what tests and scripts call)."""
        with self._render_lock:
            if self.controls is not None:
                self.controls.sync_range()
            self.render(self.cursor())

    def feed(self, events: Iterable[Event]) -> None:
        """Add events by hand (any thread); a redraw follows within 1/max_hz seconds."""
        self.model.feed(events)
        self._request()

    def close(self) -> None:
        """Stop listening and redrawing, then close this widget and everything inside it."""
        self.source.detach()
        if self.throttle is not None:
            self.throttle.close()
        _close_tree(self)

    def _close_self(self) -> None:
        super().close()


    # --- plumbing -------------------------------------------------------------------------

    def _request(self) -> None:
        if self._ready and self.throttle is not None:
            self.throttle.request()

    def _tick(self) -> bool:
        with self._render_lock:
            if self.controls is not None:
                self.controls.sync_range()
            return self.render(self.cursor())

    def _on_cursor(self) -> None:
        with self._render_lock:
            self.render(self.cursor())


def _close_tree(widget: w.Widget) -> None:
    children = tuple(getattr(widget, "children", ()))
    if children:
        # Detach first, so the browser removes the children's views: a plotly FigureWidget
        # closed while its view is still attached keeps reacting to scrolling and resizing
        # and throws "Syncing error: no comm channel defined" (seen in Chromium).
        widget.children = ()
    for child in children:
        if isinstance(child, EventView):
            child.close()
        else:
            _close_tree(child)
    if isinstance(widget, EventView):
        widget._close_self()
    else:
        widget.close()
