"""What a ddpviz widget leaves in a notebook for the places that draw no widgets.

A widget's output holds the widget's reference and, beside it, `text/html`, which every
Jupyter front end with a widget manager passes over for the widget, and which `jupyter
nbconvert --to html` (without saved widget state), nbviewer and a front end without
ipywidgets show instead. For a run that is over it is the run's HTML report (report/html.py:
script-free, every value escaped) inside a sandboxed `<iframe srcdoc>`, so the report's page
styles stay in their frame; for a live run, which a report made when the cell runs would judge
before it ended, a line saying how to get one.
"""

from __future__ import annotations

from typing import Any

from ddpviz import markup
from ddpviz.markup import Markup

# A run bigger than this is not copied into the notebook (its report is still a command away).
MAX_EVENTS = 200_000
_NOTE = "<p style='font:13px system-ui,sans-serif;color:#555;margin:4px 0'>{}</p>"
_COPY = ("<p style='font:13px system-ui,sans-serif;color:#555;margin:4px 0'>{}</p>"
         "<iframe sandbox srcdoc='{}' title='ddpviz report' loading='lazy' "
         "style='width:100%;height:720px;border:1px solid #ddd'></iframe>")


def static_copy(source: object, *, live: bool, events: int) -> Markup | None:
    """The `text/html` that stands in for a widget showing `source` (a Trace, a path, a
    finished Run or Session: what report/html.py reads); None where there is no run."""
    if source is None:
        return None
    if live:
        return markup.fmt(_NOTE, "A live ddpviz dashboard: it draws where Jupyter widgets run. "
                          "For a copy that opens anywhere, once the run is over: "
                          "`ddpviz report TRACE_FOLDER -o run.html`, or display "
                          "`run.dashboard()` again.")
    if events > MAX_EVENTS:
        return markup.fmt(_NOTE, f"A ddpviz view of a run of {events:,} events: it draws "
                          "where Jupyter widgets run (a copy of runs over "
                          f"{MAX_EVENTS:,} events is not kept in the notebook). For a page that "
                          "opens anywhere: `ddpviz report TRACE -o run.html`.")
    from ddpviz.report.html import render

    try:
        page = render(source, title="ddpviz report", interactive=False)  # (no script)
    except Exception as exc:  # (never fail the widget's display over its stand-in)
        return markup.fmt(_NOTE, "A ddpviz view: it draws where Jupyter widgets run (no "
                          f"static copy: {exc}).")
    return markup.fmt(
        _COPY, "A static copy of this ddpviz view: the run's report (diagnose()'s findings, the "
        "timeline, the bucket maps) as it was when the cell ran. Open the notebook where "
        "Jupyter widgets run for the interactive view.", page)


def with_copy(bundle: Any, copy: Markup | None) -> Any:
    """A widget's `_repr_mimebundle_` result (ipywidgets' dict, anywidget's (data, metadata)
    pair, or None for a closed widget) with `copy` as its `text/html`."""
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    if isinstance(data, dict) and copy is not None:
        data["text/html"] = str(copy)
    return bundle
