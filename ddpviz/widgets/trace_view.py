"""TraceView: the JupyterLab trace viewer's panels as an anywidget, for every notebook host.

The front end is extension/src/traceWidget.ts, the viewer's own parse, model and view code
bundled on its own (extension/build-widget.js) into static/trace_view.js: one set of
TypeScript components draws a `.ddpviz` file in JupyterLab's file viewer and this widget. The
kernel sends the run once as `.ddpviz` bytes in a binary buffer, never markup; the iteration
and rank pickers, hover and scrolling then run in the browser, also while the kernel is busy
with a cell. Any host that renders anywidget draws it: JupyterLab, Notebook 7, marimo
(`mo.ui.anywidget(view)`), VS Code, Colab (docs/guide/jupyterlab.md says which were tried).

A live source (a Run, a Session) is sent as it is when the view is made; `refresh()` sends it
again.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.findings import Finding
from ddpviz.traces.source import open_run
from ddpviz.traces.view_bytes import (
    STATIC,
    TraceViewError,
    diagnosis_bytes,
    front_end,
    trace_bytes,
)
from ddpviz.widgets.static_copy import static_copy, with_copy

__all__ = ["MAX_BYTES", "TraceView", "TraceViewError"]

# The most a view sends to the browser. A trace's events are ~50 bytes each; the view reads
# `max_events` of them per panel, and a bigger run belongs in the file viewer, which reads the
# file itself (no kernel message), or in the dashboard.
MAX_BYTES = 64 << 20
# the bucket colour schemes of extension/src/colors.ts's PALETTES (test_trace_view checks them)
SCHEMES = ("tableau10", "okabe-ito", "viridis")


class TraceView(anywidget.AnyWidget):
    """The trace viewer's panels for one run, drawn in the browser.

    Its verdict and findings are `ddpviz.diagnose()`'s for the run, computed in the kernel
    when the view is made (and on `refresh()`): the same set `ddpviz diagnose`, the report and
    the CLI give, where JupyterLab's file viewer, which has no kernel, shows only what the ranks
    reported while the job ran.

    Kernel-side state: `trace` (the `.ddpviz` bytes sent), `findings` (diagnose()'s),
    `diagnosis` (those, as sent), `name` (the title shown),
    `scheme` (bucket colours: "tableau10", "okabe-ito", "viridis"), `max_events` (events
    each panel reads at most, as the viewer's setting).

    Args:
        source: a `Trace`, a `.ddpviz` path or a folder of them, a `ddpviz.Run`, a `Session`,
            or a list of events.
        scheme: the bucket colour scheme.
        max_events: events each panel reads at most.
        name: the title shown; None: the file's or folder's name, else the source's type.

    Raises:
        TraceViewError: the run is over `MAX_BYTES` as a trace, or the front end is not built.
        SourceError: `source` is no kind of run (see ddpviz/traces/source.py).
    """

    _esm = front_end("trace_view.js")
    _css = front_end("trace_view.css")
    trace = traitlets.Bytes(b"").tag(sync=True)
    diagnosis = traitlets.Bytes(b"").tag(sync=True)
    name = traitlets.Unicode("").tag(sync=True)
    scheme = traitlets.Unicode("tableau10").tag(sync=True)
    max_events = traitlets.Int(20000).tag(sync=True)

    def __init__(self, source: object, *, scheme: str = "tableau10", max_events: int = 20000,
                 name: str | None = None, **kwargs: Any) -> None:
        if not self._esm or not self._css:
            raise TraceViewError(
                f"ddpviz: the TraceView's front end (trace_view.js and .css) is not built in "
                f"{STATIC}.\nInstall ddpviz from a wheel, or build it in a checkout: cd "
                "extension && jlpm install && jlpm build.")
        if scheme not in SCHEMES:
            raise ValueError(f"ddpviz: scheme must be one of {', '.join(map(repr, SCHEMES))}; "
                             f"got {scheme!r}.")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"ddpviz: max_events must be a positive int, got {max_events!r}.")
        # the source read once (files parsed once), for the bytes, diagnose() and the copy
        self._run = run = open_run(source, refusal="TraceView cannot show")
        data, named = trace_bytes(source, run, limit=MAX_BYTES)
        self.findings: list[Finding] = list(diagnose(run))
        super().__init__(trace=data, diagnosis=diagnosis_bytes(self.findings),
                         name=named if name is None else str(name), scheme=scheme,
                         max_events=max_events, **kwargs)
        self._source = source

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # beside the widget, for hosts without widgets (nbconvert, nbviewer): See static_copy.py
        run = self._run  # (as read when the view was made or last refreshed)
        live = run.kind == "session" or (run.kind == "run" and run.live.status == "running")
        trace = run.gathered
        return with_copy(super()._repr_mimebundle_(**kwargs),
                         static_copy(run, live=live,
                                     events=0 if trace is None else len(trace)))

    def refresh(self) -> None:
        """Send the run again (a live Run or Session has more events by now; files are read
        again), with diagnose()'s findings computed again."""
        self._run = run = open_run(self._source, refusal="TraceView cannot show")
        data, _ = trace_bytes(self._source, run, limit=MAX_BYTES)
        self.findings = list(diagnose(run))
        with self.hold_sync():
            self.trace = data
            self.diagnosis = diagnosis_bytes(self.findings)
