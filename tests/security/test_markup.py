"""No string from a trace becomes markup: every view of a trace whose every string field (of
every event type, found by introspection) and metadata carries script/markup payloads renders
them escaped in what Python still draws (the report; the widgets' kernel-side texts); and the
escaping helper itself. The TS front end's panels at every replay position:
tests/browser/test_hostile_trace.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ipywidgets as w

from ddpviz import markup
from ddpviz.report import html as report
from ddpviz.traces.trace import Trace
from ddpviz.widgets import Dashboard
from tests.security.hostile import (
    PAYLOAD,
    hostile_trace,
    one_of_each,
    raw_markup,
    string_fields,
    without_own_scripts,
)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def widget_texts(widget: w.Widget) -> Iterator[tuple[str, str]]:
    """(where, text) for every string a widget tree sends to the browser: HTML values,
    descriptions, tooltips, option labels and plotly figure data and layout."""
    stack = [widget]
    while stack:
        wd = stack.pop()
        name = type(wd).__name__
        # HTML widgets set innerHTML; other widgets' values and labels are text (safe), but
        # descriptions may be HTML and plotly renders a subset of HTML in its texts
        attrs = ("value", "description") if isinstance(wd, w.HTML | w.HTMLMath) else (
            "description",)
        for attr in attrs:
            for s in _strings(getattr(wd, attr, None)):
                yield f"{name}.{attr}", s
        if hasattr(wd, "to_dict") and hasattr(wd, "data"):  # plotly FigureWidget
            for s in _strings(wd.to_dict()):
                yield f"{name} figure", s
        stack.extend(getattr(wd, "children", ()))


def assert_clean(widget: w.Widget, where: str) -> int:
    n = 0
    for attr, text in widget_texts(widget):
        n += PAYLOAD[:8] in text or "&lt;script" in text
        found = raw_markup(text)
        assert found is None, f"{where}: {attr} holds raw {found!r}: {text[:300]!r}"
    return n


def test_the_hostile_trace_poisons_every_string_field_of_every_event() -> None:
    trace = hostile_trace()
    seen: set[str] = set()
    for e in trace.events():
        for f in e.__struct_fields__:
            key = f"{type(e).__name__}.{f}"
            if key in string_fields() and PAYLOAD in repr(getattr(e, f)).replace("\\'", "'"):
                seen.add(key)
    assert string_fields() - seen == set()
    assert len(string_fields()) >= 10  # names, dtypes, devices, digests, findings, ...


def test_escaping_helper() -> None:
    got = markup.fmt("<td title='{}'>{:,}</td>{}", "a'<b>\"", 12345, markup.Markup("<i>x</i>"))
    assert got == "<td title='a&#x27;&lt;b&gt;&quot;'>12,345</td><i>x</i>"
    assert markup.join(["<b>", markup.escape("<i>")], ", ") == "&lt;b&gt;, &lt;i&gt;"
    assert markup.tag("span", "<x>", class_="a'b", style=None) == \
        "<span class='a&#x27;b'>&lt;x&gt;</span>"


# (the dashboard is a TraceView now: every panel, the hook timeline included, is drawn by the
# TS front end, at every replay position; tests/browser/test_hostile_trace.py opens this
# trace's payloads in them)
def test_report_escapes_every_string() -> None:
    page = report.render(hostile_trace(), title=PAYLOAD)
    assert page.count("&lt;script&gt;") > 10
    body = without_own_scripts(page.split("</style>", 1)[1])  # (its view's: data, not markup)
    assert raw_markup(body) is None, body[body.lower().find("<script") - 200:][:400]


def test_one_event_of_each_type_alone_renders_escaped() -> None:
    for e in one_of_each():
        trace = Trace([e], meta={"x": PAYLOAD})
        assert raw_markup(without_own_scripts(report.render(trace).split("</style>", 1)[1])
                          ) is None, type(e)
        assert_clean(Dashboard(trace), type(e).__name__)
