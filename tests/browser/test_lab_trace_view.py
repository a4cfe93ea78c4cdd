"""The TraceView anywidget (ddpviz/widgets/trace_view.py) in real JupyterLab in Chromium: a
trace recorded from 2 real gloo ranks, drawn in a notebook, reads exactly as JupyterLab's file
viewer reads the same file (one set of TypeScript components, panel by panel), its verdict
and findings are `ddpviz.diagnose()`'s (the file viewer, without a kernel, says the ranks'
reported ones, labelled as such), and its
iteration picker redraws the hook timeline while the kernel is busy with another cell (the
drawing runs in the browser, not in the kernel)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz._diagnose.verdict import verdict
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import SETTINGS, LabServer
from tests.browser.test_perfetto import PERFETTO_PAGE, serve_perfetto
from tests.browser.ui import (
    double_click_file,
    error_outputs,
    open_lab,
    start_all_cells,
    stream_text,
    wait_for_viewer,
    write_notebook,
)
from tests.extension.test_chrome_trace_mirror import as_json_reads

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

FILE = "run.ddpviz"  # conftest.real_trace
NAME = "trace_view.ipynb"
SLEEP_S = 90  # the busy cell: the picker is used while it runs
VIEWER = SETTINGS["ddpviz:plugin"]  # the file viewer's settings: the widget gets the same
CELLS = [
    "from ddpviz.widgets.trace_view import TraceView\n"
    f"view = TraceView({FILE!r}, scheme={VIEWER['colorScheme']!r}, "
    f"max_events={VIEWER['maxEvents']})\nview",
    f"import time\ntime.sleep({SLEEP_S})\nprint('the busy cell ended')",
]


def sections(root: Any) -> dict[str, str]:
    """Each panel's text, by its data-section, without the line that says what a button did
    (the widget's Perfetto button was pressed, the viewer's not)."""
    found: dict[str, str] = {}
    for el in root.locator("[data-section]").all():
        found[el.get_attribute("data-section")] = el.evaluate(
            "e => { const c = e.cloneNode(true); c.querySelectorAll('.ddpviz-action-status')"
            ".forEach(s => s.remove()); document.body.append(c); const t = c.innerText; "
            "c.remove(); return t; }")
    return found


def test_the_widget_reads_as_the_viewer_and_answers_while_the_kernel_is_busy(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        real_trace: Trace) -> None:
    write_notebook(lab_root / NAME, CELLS)
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab, NAME)
    start_all_cells(page)
    widget = page.locator(".jp-OutputArea-output .ddpviz-widget")
    widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
    summary = widget.locator(".ddpviz-summary")
    assert summary.get_attribute("data-ranks") == str(len(real_trace.ranks)) == "2"
    assert summary.get_attribute("data-events") == str(len(real_trace))

    # the kernel is busy with the second cell; the picker still redraws the timeline
    busy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(1).locator(
        ".jp-InputPrompt")
    busy.get_by_text("[*]:").wait_for(timeout=60_000)
    started = time.monotonic()
    select = widget.locator(".ddpviz-step-select")
    steps = [o.get_attribute("value") for o in select.locator("option").all()]
    assert len(steps) >= 2, steps
    holder = widget.locator(".ddpviz-timeline-holder")
    before = holder.inner_html()
    assert select.input_value() == steps[-1]  # opens at the last iteration
    select.select_option(steps[0])
    page.wait_for_function(
        "([el, before]) => el.innerHTML !== before",
        arg=[holder.element_handle(), before], timeout=10_000)
    assert time.monotonic() - started < SLEEP_S - 20  # well inside the busy cell
    assert "the busy cell ended" not in stream_text(page)
    busy.get_by_text("[*]:").wait_for(timeout=1_000)  # still running
    # "Open in Perfetto" works from the browser alone too: Python's Chrome trace of the file
    serve_perfetto(page, PERFETTO_PAGE)
    with page.expect_popup() as popup_info:
        widget.locator("button.ddpviz-perfetto").click()
    popup_info.value.wait_for_function("window.got !== null", timeout=30_000)
    got = popup_info.value.evaluate("window.got")
    assert as_json_reads(json.loads(got["text"])) == as_json_reads(
        json.loads(json.dumps(real_trace.to_chrome_trace())))
    assert "the busy cell ended" not in stream_text(page)
    popup_info.value.close()
    screenshot(page, "trace_view_widget", widget)
    select.select_option(steps[-1])  # back where the viewer opens

    # the verdict and findings are diagnose()'s, computed in the kernel
    found = ddpviz.diagnose(lab_root / FILE)
    said = widget.locator(".ddpviz-verdict")
    assert said.get_attribute("data-scope") == "diagnose"
    assert said.get_attribute("data-verdict") == verdict(found)
    items = widget.locator(".ddpviz-finding").all()
    assert [i.get_attribute("data-severity") for i in items] == [f.severity for f in found]
    for item, f in zip(items, found, strict=True):
        assert f.title in item.inner_text()

    # the file viewer draws the same file with the same components: the same panels, the
    # same text in each, but for the verdict's scope (the viewer has no kernel: the ranks'
    # reported findings, said as such) and the findings diagnose() adds
    drawn = sections(widget)
    double_click_file(page, FILE)
    viewer = wait_for_viewer(page, FILE)
    assert viewer.locator(".ddpviz-verdict").get_attribute("data-scope") == "reported"
    shown = sections(viewer)
    other = ("verdict", "findings")
    same = [k for k in drawn if k not in other]
    assert same == [k for k in shown if k not in other]
    assert {"summary", "buckets", "timeline"} <= set(same), same
    for kind in same:
        assert drawn[kind] == shown[kind], kind
    assert error_outputs(page) == []
    assert console.errors == []
