"""The TraceView anywidget (ddpviz/widgets/trace_view.py) in real JupyterLab in Chromium: a
trace recorded from 2 real gloo ranks, drawn in a notebook, reads exactly as JupyterLab's file
viewer reads the same file (one set of TypeScript components, panel by panel), its verdict
and findings are `ddpviz.diagnose()`'s (the file viewer, without a kernel, says the ranks'
reported ones, labelled as such), and its
iteration picker redraws the hook timeline while the kernel is busy with another cell (the
drawing runs in the browser, not in the kernel). A run with a planted replica divergence shows
the replica panel Python's replica_matrix computes, in the widget and the file viewer, and the
widget the bucket advisor's answer (computed in the kernel, sent as data), which the file
viewer, without a kernel, says where to get."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz._diagnose.verdict import verdict
from ddpviz.findings import Finding
from ddpviz.traces.trace import Trace
from ddpviz.widgets.replica_matrix import ReplicaMatrix, replica_matrix
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
    other = ("verdict", "findings", "advice")  # (advice: the kernel's; the viewer has none)
    same = [k for k in drawn if k not in other]
    assert same == [k for k in shown if k not in other]
    assert {"summary", "buckets", "timeline"} <= set(same), same
    for kind in same:
        assert drawn[kind] == shown[kind], kind
    assert error_outputs(page) == []
    assert console.errors == []


DIVERGED = "diverged.ddpviz"
EDIT_STEP = 2


@pytest.fixture(scope="module")
def diverged(lab_root: Path) -> Path:
    """6 steps on 2 real gloo ranks recorded in full, rank 1 editing a weight after step 2."""
    from tests.browser import rank_fns

    run = ddpviz.launch(rank_fns.train_diverging, 2, args=(6, EDIT_STEP), timeout=120)
    run.wait(timeout=150)
    assert run.status == "finished", run.status
    return run.trace.save(lab_root / DIVERGED)


_REPLICAS = """root => {
    const panel = root.querySelector("[data-section=replicas]");
    return {columns: [...panel.querySelectorAll("thead th")].slice(2).map(t => t.innerText),
            rows: [...panel.querySelectorAll("tbody tr")].map(tr => {
                const td = [...tr.querySelectorAll("td")];
                return [td[0].innerText, td[1].innerText, td.slice(2).map(c => c.innerText),
                        td.slice(2).map(c => c.title)]; }),
            verdict: panel.querySelector(".ddpviz-replica-verdict").innerText};
}"""


def drawn_replicas(root: Any) -> dict[str, Any]:
    return dict(root.evaluate(_REPLICAS))


def python_replicas(m: ReplicaMatrix) -> tuple[list[str], list[list[Any]]]:
    """What the panel must show: replica_matrix's columns, and per row its step, tensor, each
    column's letter and hover text (as the dashboard's ReplicaView draws them)."""
    rows = []
    for r in m.rows:
        letters = [r.cells.get(spans[0][0], "") for _, spans in m.columns]
        rows.append([str(r.step), r.name, [x or "·" for x in letters],
                     [r.sizes.get(x, "") for x in letters]])
    return [label for label, _ in m.columns], rows


def test_the_replica_and_advice_panels_of_a_diverged_run(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        diverged: Path) -> None:
    found = list(ddpviz.diagnose(diverged))
    matrix = replica_matrix(found)
    assert [(r.step, r.name) for r in matrix.rows] == [(EDIT_STEP, "2.weight")]
    assert [r.cells[k] for r in matrix.rows for k in (0, 1)] == ["A", "B"]
    advice = ddpviz.advise(diverged)
    write_notebook(lab_root / "diverged.ipynb", [
        "from ddpviz.widgets.trace_view import TraceView\n"
        f"TraceView({DIVERGED!r})"])
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab, "diverged.ipynb")
    start_all_cells(page)
    widget = page.locator(".jp-OutputArea-output .ddpviz-widget")
    widget.locator(".ddpviz-summary").wait_for(timeout=120_000)

    # the replica panel: replica_matrix's rows, letters and hover texts, from diagnose()
    columns, rows = python_replicas(matrix)
    shown = drawn_replicas(widget.element_handle())
    assert (shown["columns"], shown["rows"]) == (columns, rows) == (
        ["0", "1"], [[str(EDIT_STEP), "2.weight", ["A", "B"], rows[0][3]]])
    assert shown["verdict"].startswith(
        f"replicas diverged: 1 tensor(s) differ across ranks, first seen after step {EDIT_STEP}")

    # the advice panel: the advisor's words and numbers, computed in the kernel
    panel = widget.locator("[data-section=advice]")
    assert panel.locator(".ddpviz-advice-reason").inner_text() == advice.reason
    points = panel.locator(".ddpviz-advice-point")
    assert points.count() == len(advice.rows) - 1  # every candidate but the current (a star)
    assert sorted(float(p.get_attribute("data-step-ms")) for p in points.all()) == \
        pytest.approx(sorted(r.prediction.step_s * 1e3 for r in advice.rows[1:]))
    assert float(panel.locator(".ddpviz-advice-current").get_attribute("data-step-ms")) == \
        pytest.approx(advice.current.prediction.step_s * 1e3)
    assert panel.locator(".ddpviz-advice-recommended").get_attribute("data-label") == \
        advice.recommended.label
    assert panel.locator(".ddpviz-advice-map .ddpviz-bucket").count() == len(
        advice.recommended.buckets)
    screenshot(page, "trace_view_replicas_advice", widget)

    # the file viewer: the same replica panel from the ranks' reported finding (the replica
    # check's own); no advice, and it says where to get it
    reported = {(f.kind, f.title, f.ranks): f for r in Trace.load(diverged).ranks
                for e in Trace.load(diverged).events(r)
                if isinstance(e, ev.FindingReported) for f in [e.finding]}
    expected: list[Finding] = list(reported.values())
    double_click_file(page, DIVERGED)
    viewer = wait_for_viewer(page, DIVERGED)
    seen = drawn_replicas(viewer.element_handle())
    assert (seen["columns"], seen["rows"]) == python_replicas(replica_matrix(expected))
    assert seen["rows"] == shown["rows"]
    viewer_advice = viewer.locator("[data-section=advice]")
    assert viewer_advice.locator("[data-advice=needs-kernel]").count() == 1
    assert viewer_advice.locator(".ddpviz-advice-reason, svg").count() == 0
    assert error_outputs(page) == []
    assert console.errors == []
