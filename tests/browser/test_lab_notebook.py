"""The tour notebooks in real JupyterLab in Chromium: 'Run All Cells' runs every cell without an
error, and the widgets render in the page holding the kernel's data: 00_tour's dashboards (the one
front end: verification matrix, broadcast progress, bucket maps) agree with what the kernel
printed; 01_buckets' plotly figure draws the same bar segments the kernel-side figure holds and
its controls show the kernel's values; 07_debugger stops two ranks at every bucket and shows
each buffer before and after its all-reduce, its debugger views rendered. No console errors."""

from __future__ import annotations

import ast
import contextlib
import html
import io
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import ROOT, LabServer
from tests.browser.ui import error_outputs, open_lab, run_all_cells, stream_text
from tests.test_notebooks import check_07_debugger_text

pytestmark = pytest.mark.browser

# Plotly keeps each figure's traces on its div: the bar segments as (row, offset, bytes).
_FIGURE_BARS = """gd => gd.data.filter(t => t.type === 'bar').flatMap(
    t => Array.from(t.x, (x, i) => [String(t.y[i]), Number(t.base[i]), Number(x)]))"""


def run_in_process(path: Path) -> dict[str, Any]:
    """Execute a notebook's code cells here (no kernel, output discarded): the widgets the
    kernel builds, built by the same code, for comparison with what the browser shows."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                exec(compile(cell.source, str(path), "exec"), namespace)
    return namespace


def letters(text: str) -> str:
    """Text without tags, entities and white space: what textContent and an HTML value
    share."""
    return "".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())


def test_01_buckets_widgets_render_with_the_kernels_data(
        page: Any, lab: LabServer, console: ConsoleLog) -> None:
    from ddpviz.widgets import bucket_figure

    bucket_map = run_in_process(ROOT / "notebooks" / "01_buckets.ipynb")["bucket_map"]
    expected_bars = sorted(
        (str(y), int(base), int(x)) for t in bucket_figure.bar_traces(bucket_map.figure)
        for y, base, x in zip(t.y, t.base, t.x, strict=True))
    assert len(expected_bars) == len(bucket_map.plan.params) == 52

    open_lab(page, lab, "01_buckets.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []

    plots = page.locator(".jp-OutputArea-output .js-plotly-plot")
    plots.first.wait_for(state="attached")
    # one BucketMap displayed in two cells: two views of its one figure, both up to date
    assert plots.count() == 2
    for i in range(2):
        shown = sorted(tuple(bar) for bar in plots.nth(i).evaluate(_FIGURE_BARS))
        assert shown == expected_bars
        plots.nth(i).locator("g.point").first.wait_for()  # plotly draws after the div exists
        assert plots.nth(i).locator("g.point").count() == 52  # every segment drawn as SVG

    maps = page.locator(".jp-OutputArea-output .widget-vbox:has(.js-plotly-plot)")
    for i in range(2):
        view = maps.nth(i)
        dropdown = view.locator(".widget-dropdown select")
        assert dropdown.evaluate("s => s.selectedOptions[0].textContent").replace(
            "\xa0", " ") == bucket_map.cap_dropdown.label
        assert view.locator(".widget-toggle-button.mod-active").text_content() \
            == bucket_map.map_toggle.label
        assert view.locator(".widget-checkbox input").evaluate_all(
            "boxes => boxes.map(b => b.checked)") == [
                bucket_map.find_unused_checkbox.value, bucket_map.static_graph_checkbox.value]
        assert letters(view.locator(".widget-html").text_content()) \
            == letters(bucket_map.summary_html.value)

    maps.first.scroll_into_view_if_needed()
    screenshot(page, "bucket_map_in_jupyterlab", maps.first)
    assert console.errors == []


def stdout_of(page: Any, prefix: str) -> list[str]:
    """The lines of the first stdout output that starts with `prefix`."""
    for text in page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                             "[data-mime-type='application/vnd.jupyter.stdout']").all_text_contents():
        if text.startswith(prefix):
            return text.splitlines()
    raise AssertionError(f"no output starting with {prefix!r}")


def cell_with(page: Any, source: str) -> Any:
    """The code cell whose source contains `source`."""
    return page.locator(".jp-CodeCell").filter(
        has=page.locator(".jp-InputArea", has_text=source)).first


def test_00_tour_dashboards_draw_the_kernels_data(
        page: Any, lab: LabServer, console: ConsoleLog) -> None:
    open_lab(page, lab, "00_tour.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []

    # the dashboard of the run where rank 1 built another last layer: its verification matrix
    # (drawn in the browser from the run's events) has exactly the cells the kernel printed as
    # differing, every other cell "same"
    printed = ast.literal_eval(stdout_of(page, "✘ the model differs")[1])
    assert printed == {"4.weight": ("same", "differs"), "4.bias": ("same", "differs")}
    # (each cell scrolled into view first: JupyterLab skips drawing cells out of view)
    cell_with(page, "bad.dashboard()").scroll_into_view_if_needed()
    bad = cell_with(page, "bad.dashboard()").locator(".ddpviz-widget")
    matrix = bad.locator("table.ddpviz-vm")
    matrix.wait_for(timeout=120_000)
    drawn = {row["name"]: tuple(row["cells"]) for row in matrix.evaluate(
        "t => [...t.querySelectorAll('tbody tr[data-name]')].map(r => ({name: r.dataset.name,"
        " cells: [...r.querySelectorAll('td[data-status]')].map(c => c.dataset.status)}))")}
    assert len(drawn) == 6  # the MLP's parameters
    assert {k: v for k, v in drawn.items() if v != ("same", "same")} == printed
    assert "shape=(3, 16)" in matrix.locator("td[data-status=differs]").first.get_attribute(
        "title")

    # the live dashboard, once the run ended: each rank's broadcast as done as the kernel says
    cell_with(page, "dash = run.dashboard()").scroll_into_view_if_needed()
    live = cell_with(page, "dash = run.dashboard()").locator(".ddpviz-widget")
    live.locator("p.ddpviz-live[data-live=finished]").wait_for(timeout=120_000)
    said = stdout_of(page, "rank 0: from rank")
    totals = {int(line.split(":")[0].removeprefix("rank ")): int(line.split(", ")[-1].split()[0])
              for line in said if line.startswith("rank ")}
    rows = live.locator("[data-section=broadcast] .ddpviz-progress-row")
    assert rows.count() == len(totals) == 2
    for row in rows.all():
        rank = int(row.get_attribute("data-rank"))
        assert int(row.get_attribute("data-done")) == int(row.get_attribute("data-total"))
        if rank != 0:  # (the source's own row counts what it sent)
            assert int(row.get_attribute("data-total")) == totals[rank]

    # the replayed dashboard's bucket maps: the constructor's and the rebuilt, with as many
    # buckets as the kernel's observed plan (printed beside the planner's)
    said = stdout_of(page, "initial:")
    initial, rebuilt = (ast.literal_eval(line.split("planner:")[0].split(":", 1)[1].strip())
                        for line in said[:2])
    cell_with(page, "replay = ddpviz.Trace.load(path)").scroll_into_view_if_needed()
    replay = cell_with(page, "replay = ddpviz.Trace.load(path)").locator(".ddpviz-widget")
    maps = replay.locator(".ddpviz-bucketmap")
    maps.first.wait_for(timeout=120_000)
    drawn_maps = {m.get_attribute("data-rebuilt"): int(m.get_attribute("data-buckets"))
                  for m in maps.all()}
    assert drawn_maps == {"false": len(initial), "true": len(rebuilt)}
    replay.locator(".ddpviz-replay").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    screenshot(page, "tour_dashboard", page.locator("#jp-main-dock-panel"))
    assert console.errors == []


def test_07_debugger_walks_every_bucket_in_the_lab(
        page: Any, lab: LabServer, console: ConsoleLog) -> None:
    open_lab(page, lab, "07_debugger.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []
    # every bucket of step 1: before its all-reduce each rank's own (scaled) gradients, after
    # it the same bits on both ranks, the mean; the paused run ends as the unpaused one
    check_07_debugger_text(stream_text(page))
    # the debugger's HTML views render: where the ranks stopped, and bucket 0's buffer on
    # both ranks after the backward, one bitwise group
    start = cell_with(page, 'debug="paused"').locator(".jp-OutputArea-output").last
    assert "paused at step 0, before DDP's forward on all 2 ranks" in start.inner_text()
    values = cell_with(page, "dbg.inspect_bucket(0, timeout=60)").locator("table")
    rows = values.locator("tr").evaluate_all(
        "rows => rows.slice(1).map(r => [...r.cells].map(c => c.textContent))")
    assert [row[0] for row in rows] == ["0", "1"]
    assert len({row[7] for row in rows}) == 1  # the same digest on both ranks
    assert "bitwise equal on all 2 ranks" in cell_with(
        page, "dbg.inspect_bucket(0, timeout=60)").inner_text()
    values.scroll_into_view_if_needed()
    screenshot(page, "debugger_notebook", page.locator("#jp-main-dock-panel"))
    assert console.errors == []
