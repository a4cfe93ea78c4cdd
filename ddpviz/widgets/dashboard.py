"""Dashboard: everything about a DDP run in one widget, live or replayed, drawn in the browser.

`run.dashboard()`, `session.dashboard()` and `Trace.load(p).dashboard()` build one. It is the
one front end (extension/src, bundled into static/trace_view.js) that JupyterLab's file viewer
and the HTML report draw too, as an anywidget, so every notebook host that renders anywidget
draws it (JupyterLab, Notebook 7, marimo, VS Code, Colab): a `TraceView` (trace_view.py: the
run sent as `.ddpviz` bytes, a live run's new events as frames, diagnose()'s findings and the
bucket advisor's answer as data, never markup) with the debugger's panel for a launch with
`debug=True` (debugger_wire.py). Replay, rank and iteration picks, linked selection and hover
run in the browser, so they answer while the kernel is busy with a cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpviz.widgets.trace_view import TraceView

if TYPE_CHECKING:
    from ddpviz.debugger.client import Debugger

# what the kernel-drawn dashboard took (until issue #40), said instead of a bare TypeError
_GONE = {
    "max_hz": "a live run's new events reach the browser at most twice a second "
              "(trace_feed.EVENTS_HZ), and the browser redraws at most once a frame",
    "timeline_bytes_per_s": "the hook timeline is drawn in the browser, not sent as markup",
}


class Dashboard(TraceView):
    """Everything about a DDP run in one widget, live or replayed.

    A `TraceView` (its kernel-side state: `trace`, `events_sent`, `live`, `findings`,
    `advice`, ...; `refresh()`, `close()`) with, for a run that can be paused, the debugger's
    panel: its controls call the `Debugger`'s own functions in the kernel.

    Args:
        source: a `ddpviz.Run`, a `Session`, a `Trace`, a `.ddpviz` path or folder, or a list
            of events.
        debugger: show the debugger's panel for this `Debugger`; True: the source's
            (`run.debugger`, `session.debugger`); None (default): for a launch with
            `debug=True`; False: never.
        kwargs: passed to the TraceView (`scheme`, `max_events`, `name`).

    Raises:
        ValueError: no source, or `debugger=True` for a source that cannot be paused.
        TraceViewError: the run is over what a view sends to the browser, or the front end
            is not built.
    """

    def __init__(self, source: object = None, *, debugger: Debugger | bool | None = None,
                 **kwargs: Any) -> None:
        for old in _GONE.keys() & kwargs.keys():
            raise TypeError(f"ddpviz: Dashboard() no longer takes {old}=: {_GONE[old]}. "
                            f"Remove the argument.")
        if source is None:
            raise ValueError(
                "ddpviz: Dashboard() needs a run: a ddpviz.Run (launch()), a Session "
                "(listen(), connect()), a Trace, a .ddpviz path or folder, or a list of events. "
                "To show events as they come, stream them into a Session and pass that.")
        if debugger is None:  # a launch with debug=True: its ranks take the debugger's commands
            debugger = bool(getattr(source, "debug", False))
        super().__init__(source, debugger=debugger, **kwargs)


def dashboard(source: object = None, **kwargs: Any) -> Dashboard:
    """A Dashboard for a Run, Session, Trace, `.ddpviz` path or list of events."""
    return Dashboard(source, **kwargs)
