"""The report's interactive view: the trace viewer's own panels (extension/src/reportView.ts,
built into ddpviz/widgets/static/report_view.js), drawn in the browser from the run embedded in
the page, so the report shows what JupyterLab's file viewer and the notebook's TraceView show,
with the same components, diagnose()'s findings, the iteration and rank pickers, linked
selection and "Open in Perfetto", as one file that works offline.

The run goes in as the bytes of one `.ddpviz` file, diagnose()'s findings and the bucket
advisor's answer as msgpack (the TraceView's own `trace_bytes`, `diagnosis_bytes` and
`advice_bytes`: numbers and words computed here, drawn by the front end), each compressed with
zlib (the view element's `data-encoding='deflate'`: the page inflates them with the browser's
own DecompressionStream, refusing any that would inflate past the 64 MiB a view reads) and
written as base64 text in a `<script type="application/octet-stream">` element: data the
browser never runs or parses as markup, which the front end checks as the viewer checks a
file. The bundle and its stylesheet go in through `markup.raw_text`, which refuses text that
could end their element. A run over EMBED_MAX as a trace, or a ddpviz whose front end is not
built, gets a line saying so instead; the rest of the report does not depend on it.
"""

from __future__ import annotations

import base64
import zlib

from ddpviz import markup
from ddpviz.advisor.wire import REPORT_MAX_EVENTS, advice_bytes
from ddpviz.findings import Finding
from ddpviz.traces.source import RunSource
from ddpviz.traces.view_bytes import STATIC, TraceViewError, diagnosis_bytes, front_end, trace_bytes

# The most a report embeds of a run, as a trace (compressed, then base64 in the page).
EMBED_MAX = 16 << 20
# The data elements' encoding (reportView.ts's ENCODING) and zlib level: 6 measured on the
# scale runs' bytes at 6.0-6.4x smaller (level 9: 6.4-6.5x at 4x the time; level 1: 5.7-5.9x),
# 0.13 s for 4.4 MiB of trace; the page inflates them in tens of ms, and its HTML parser reads
# a sixth of the base64 text it used to (benchmarks/bench_first_paint.py).
ENCODING, LEVEL = "deflate", 6
# bytes an event takes in a .ddpviz file at the least (a COLUMNS frame's row of one-byte
# integers: its kind and six columns; 66-75 as event maps on synthetic runs): a run whose
# events surely exceed the limit is refused before it is written out to be measured
MIN_EVENT_BYTES = 7
# the ids reportView.ts reads (VIEW_ID, TRACE_ID, DIAGNOSIS_ID, ADVICE_ID)
VIEW_ID, TRACE_ID, DIAGNOSIS_ID = "ddpviz-view", "ddpviz-view-trace", "ddpviz-view-diagnosis"
ADVICE_ID = "ddpviz-view-advice"


def interactive_section(source: object, run: RunSource,
                        findings: list[Finding]) -> markup.Markup:
    """The section: the viewer's panels over the run, or why they are not there.

    Args:
        source: what the report was asked for (a path keeps its file's own bytes and name).
        run: `source` opened (`open_run`).
        findings: diagnose()'s, as the report shows them.
    """
    head = markup.fmt("<h2>{}</h2>", "Interactive view")
    script, css = front_end("report_view.js"), front_end("trace_view.css")
    if not script or not css:
        return _section(head, markup.fmt(
            "<p class='muted'>{}</p>", f"Not in this report: ddpviz's front end is not built "
            f"in {STATIC} (install ddpviz from a wheel, or build it in a checkout: cd "
            "extension && jlpm install && jlpm build)."))
    limit = EMBED_MAX
    events = len(run.as_trace())
    if events * MIN_EVENT_BYTES > limit:  # (surely over: not written out to find that out)
        return _section(head, markup.fmt(
            "<p class='muted'>{}</p>", f"Not in this report: the run's {events:,} events are "
            f"over the {limit >> 20} MiB of trace a report embeds. Open its .ddpviz files in "
            "JupyterLab's file browser, or trace.view() in a notebook."))
    try:
        data, name = trace_bytes(source, run, limit=limit, carrier="a report embeds")
    except TraceViewError as exc:
        return _section(head, markup.fmt("<p class='muted'>{}</p>", str(exc)))
    except OSError as exc:  # (written out to a temporary file first: a full disk, ...)
        return _section(head, markup.fmt(
            "<p class='muted'>{}</p>", f"Not in this report: the run could not be written "
            f"out for it ({exc}). The sections above are complete."))
    try:
        parts = [markup.raw_text("style", css),
                 markup.tag("div", markup.fmt("<p class='muted'>{}</p>", _NO_SCRIPT), id=VIEW_ID,
                            data_name=name, data_encoding=ENCODING),
                 _data(TRACE_ID, data), _data(DIAGNOSIS_ID, diagnosis_bytes(findings)),
                 _data(ADVICE_ID, advice_bytes(run, REPORT_MAX_EVENTS, "a report")),
                 markup.raw_text("script", script, type="module")]
    except ValueError as exc:  # (a front end whose text cannot be inlined: said, not embedded)
        return _section(head, markup.fmt("<p class='muted'>{}</p>", f"Not in this report: {exc}"))
    return _section(head, markup.join(parts))


_NO_SCRIPT = ("The run's panels are drawn here by the page's script (the same as JupyterLab's "
              "file viewer): allow scripts for this file to see them. Everything above and "
              "below is plain HTML.")


def _section(*parts: markup.Markup) -> markup.Markup:
    return markup.tag("section", markup.join(parts), id="interactive")


def _data(element_id: str, data: bytes) -> markup.Markup:
    # (A-Z a-z 0-9 + / =: nothing to escape)
    text = base64.b64encode(zlib.compress(data, LEVEL)).decode("ascii")
    return markup.raw_text("script", text, type="application/octet-stream", id=element_id)
