"""Linked selection (extension/src/selection.ts) in real JupyterLab in Chromium, on a trace from 2
real gloo ranks whose constructor map (one bucket of all 6 parameters) and rebuilt map
((5, 4, 3, 2), (1, 0)) group the parameters differently: clicking a bucket highlights exactly
its parameters in both maps and those parameters' gradient marks and all-reduces in the hook
timeline (each checked against what Python's `ddpviz.Trace` reads), dims the rest, survives
the iteration picker, and clears on a second click, Escape or a click on empty space; Enter
and Space select from the keyboard; a parameter segment or a gradient mark selects its
bucket. A parameter's row of the verification matrix selects that one parameter (and a bucket
marks its parameters' rows there). Each bucket map zooms and pans in the browser (+, -, fit,
Ctrl + wheel about the pointer), and a redraw keeps the zoom. In `trace.view()` the same happens
while the kernel is busy with a cell."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import SETTINGS, LabServer
from tests.browser.ui import (
    double_click_file,
    error_outputs,
    open_lab,
    start_all_cells,
    stream_text,
    wait_for_viewer,
    write_notebook,
)
from tests.widgets.streams import summarize_steps, synthetic_run

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

FILE = "run.ddpviz"  # conftest.real_trace
VIEWER = SETTINGS["ddpviz:plugin"]
SLEEP_S = 90  # the busy cell: the bucket is clicked while it runs


def maps_of(trace: Trace) -> dict[bool, tuple[tuple[int, ...], ...]]:
    """The constructor's map (False) and the rebuilt map (True), as rank 0 recorded them."""
    return {e.rebuilt: e.buckets for e in trace.of_type(ev.BucketAssigned, rank=0)}


def params_of(locator: Any) -> list[int]:
    """data-param of each element the locator matches."""
    return [int(v) for v in locator.evaluate_all("els => els.map(e => e.dataset.param)")]


def buckets_of(locator: Any) -> list[int]:
    return [int(v) for v in locator.evaluate_all("els => els.map(e => e.dataset.bucket)")]


def has_class(locator: Any, name: str) -> bool:
    found: bool = locator.evaluate(f"e => e.classList.contains({name!r})")
    return found


def check_highlight(root: Any, trace: Trace, rebuilt: bool, bucket: int) -> set[int]:
    """Everything selecting `bucket` of the (rebuilt or constructor) map shows, against the
    trace: returns that bucket's parameters."""
    chosen = set(maps_of(trace)[rebuilt][bucket])
    n_maps = root.locator(".ddpviz-bucketmap").count()
    assert n_maps == 2
    for i in range(n_maps):
        shown = root.locator(".ddpviz-bucketmap").nth(i)
        kind = shown.get_attribute("data-rebuilt") == "true"
        # every segment of every map: highlighted if it is one of the bucket's, else dimmed
        assert set(params_of(shown.locator(".ddpviz-param.ddpviz-selected"))) == chosen
        others = params_of(shown.locator(".ddpviz-param.ddpviz-dimmed"))
        assert set(others) == set(params_of(shown.locator(".ddpviz-param"))) - chosen
        assert len(others) + len(chosen) == shown.locator(".ddpviz-param").count()
        for b, indices in enumerate(maps_of(trace)[kind]):
            cell = shown.locator(f".ddpviz-bucket[data-bucket='{b}']")
            me = kind == rebuilt and b == bucket
            assert cell.get_attribute("aria-pressed") == str(me).lower()
            assert has_class(cell, "ddpviz-selected") == me
            # a bucket none of whose parameters is selected is dimmed
            assert has_class(cell, "ddpviz-dimmed") == (not (chosen & set(indices)))
    # the bucket's own segments, in the clicked map, are exactly its parameters
    clicked = root.locator(f".ddpviz-bucketmap[data-rebuilt='{str(rebuilt).lower()}'] "
                           f".ddpviz-bucket[data-bucket='{bucket}']")
    assert params_of(clicked.locator(".ddpviz-param.ddpviz-selected")) == list(
        maps_of(trace)[rebuilt][bucket])

    # the timeline of the iteration drawn: the marks of those parameters, and the all-reduces
    # of the buckets they were reduced in at that iteration, and nothing else
    svg = root.locator("svg.ddpviz-timeline")
    step = int(svg.get_attribute("data-step"))
    grads = [e for e in trace.of_type(ev.GradReady) if e.step == step]
    mine = [e for e in grads if e.param in chosen]
    lit = params_of(svg.locator("line.ddpviz-grad.ddpviz-selected"))
    assert sorted(lit) == sorted(e.param for e in mine)
    assert len(lit) == len(mine) > 0
    dim = params_of(svg.locator("line.ddpviz-grad.ddpviz-dimmed"))
    assert len(dim) == len(grads) - len(mine) and not set(dim) & chosen
    reduced_in = {e.bucket for e in mine}
    done = [e for e in trace.of_type(ev.AllReduceDone) if e.step == step]
    assert sorted(buckets_of(svg.locator("rect.ddpviz-allreduce.ddpviz-selected"))) == sorted(
        e.bucket for e in done if e.bucket in reduced_in)
    assert sorted(buckets_of(svg.locator("rect.ddpviz-allreduce.ddpviz-dimmed"))) == sorted(
        e.bucket for e in done if e.bucket not in reduced_in)
    return chosen


def check_param(root: Any, trace: Trace, param: int) -> None:
    """Everything a matrix row of `param` selected shows, against the trace."""
    for shown in root.locator(".ddpviz-bucketmap").all():
        kind = shown.get_attribute("data-rebuilt") == "true"
        assert params_of(shown.locator(".ddpviz-param.ddpviz-selected")) == [param]
        assert shown.locator(".ddpviz-param.ddpviz-dimmed").count() == \
            shown.locator(".ddpviz-param").count() - 1
        for b, indices in enumerate(maps_of(trace)[kind]):
            cell = shown.locator(f".ddpviz-bucket[data-bucket='{b}']")
            assert cell.get_attribute("aria-pressed") == "false"  # a parameter, not a bucket
            assert has_class(cell, "ddpviz-dimmed") == (param not in indices)
    svg = root.locator("svg.ddpviz-timeline")
    step = int(svg.get_attribute("data-step"))
    mine = [e for e in trace.of_type(ev.GradReady) if e.step == step and e.param == param]
    assert params_of(svg.locator("line.ddpviz-grad.ddpviz-selected")) == [param] * len(mine)
    assert len(mine) > 0
    assert sorted(buckets_of(svg.locator("rect.ddpviz-allreduce.ddpviz-selected"))) == sorted(
        e.bucket for e in trace.of_type(ev.AllReduceDone)
        if e.step == step and e.bucket in {g.bucket for g in mine})
    assert params_of(root.locator("table.ddpviz-vm tr.ddpviz-selected[data-param]")) == [param]
    assert params_of(root.locator("table.ddpviz-vm tr[aria-pressed='true']")) == [param]
    name = next(p.name for p in trace.of_type(ev.ParamsBuilt, rank=0)[0].params
                if p.index == param)
    where = ", ".join(
        f"bucket {next(b for b, ix in enumerate(maps_of(trace)[kind]) if param in ix)} of the "
        f"{'rebuilt' if kind else 'constructor'} map" for kind in (False, True))
    status = root.locator(".ddpviz-buckets .ddpviz-selection-status").inner_text()
    assert status.startswith(f"parameter {param} '{name}': in {where} — ")


def check_cleared(root: Any) -> None:
    assert root.locator(".ddpviz-selected, .ddpviz-dimmed").count() == 0
    assert root.locator(".ddpviz-bucket[aria-pressed='true']").count() == 0
    assert root.locator(".ddpviz-selection-status").all_inner_texts() == ["", ""]


def test_clicking_a_bucket_highlights_its_parameters_in_the_maps_and_the_timeline(
        page: Any, lab: LabServer, console: ConsoleLog, real_trace: Trace) -> None:
    trace = real_trace
    maps = maps_of(trace)
    assert len(maps[False]) == 1 and len(maps[True]) == 2  # grouped differently
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab)
    double_click_file(page, FILE)
    viewer = wait_for_viewer(page, FILE)
    check_cleared(viewer)
    rebuilt = viewer.locator(".ddpviz-bucketmap[data-rebuilt='true']")
    constructor = viewer.locator(".ddpviz-bucketmap[data-rebuilt='false']")
    select = viewer.locator(".ddpviz-step-select")
    steps = sorted({e.step for e in trace.of_type(ev.GradReady)})
    assert select.input_value() == str(steps[-1])  # after the rebuild (iteration 1)

    # the rebuilt map's bucket 1: parameters 1 and 0, also inside the constructor's bucket 0
    rebuilt.locator(".ddpviz-bucket[data-bucket='1'] .ddpviz-bucket-label").click()
    chosen = check_highlight(viewer, trace, True, 1)
    assert chosen == set(maps[True][1])
    nbytes = viewer.locator(".ddpviz-bucketmap[data-rebuilt='true'] "
                            ".ddpviz-bucket[data-bucket='1']").get_attribute("data-bytes")
    status = viewer.locator(".ddpviz-buckets .ddpviz-selection-status").inner_text()
    assert status.startswith(f"bucket 1 (rebuilt map): {len(chosen)} parameters, ")
    assert status == viewer.locator(".ddpviz-toolbar .ddpviz-selection-status").inner_text()
    assert int(nbytes) > 0 and "click it again" in status
    screenshot(page, "linked_selection", viewer.locator(".ddpviz-buckets"))
    screenshot(page, "linked_selection_timeline", viewer.locator("svg.ddpviz-timeline"))

    # the iteration picker redraws the timeline; the selection is drawn again, at iteration 0
    # under the constructor's map (its one bucket holds them)
    for step in (steps[0], steps[-1]):
        select.select_option(str(step))
        assert viewer.locator("svg.ddpviz-timeline").get_attribute("data-step") == str(step)
        check_highlight(viewer, trace, True, 1)

    # a second click clears it
    rebuilt.locator(".ddpviz-bucket[data-bucket='1']").click()
    check_cleared(viewer)

    # the keyboard: Enter selects the focused bucket, Escape clears, Space selects
    cell = rebuilt.locator(".ddpviz-bucket[data-bucket='0']")
    assert cell.get_attribute("role") == "button" and cell.get_attribute("tabindex") == "0"
    cell.focus()
    page.keyboard.press("Enter")
    check_highlight(viewer, trace, True, 0)
    page.keyboard.press("Escape")
    check_cleared(viewer)
    cell.focus()
    page.keyboard.press("Space")
    check_highlight(viewer, trace, True, 0)
    page.keyboard.press("Space")  # again: cleared
    check_cleared(viewer)

    # a parameter segment selects its bucket: here the constructor's only one
    constructor.locator(".ddpviz-param[data-param='3']").click()
    check_highlight(viewer, trace, False, 0)
    # the selected outline follows the theme's text colour (light or dark theme alike)
    outline = constructor.locator(".ddpviz-bucket.ddpviz-selected .ddpviz-params")
    light = outline.evaluate("e => getComputedStyle(e).outlineColor")
    viewer.evaluate("e => e.style.setProperty('--jp-ui-font-color1', 'rgb(250, 250, 250)')")
    assert outline.evaluate("e => getComputedStyle(e).outlineColor") == "rgb(250, 250, 250)"
    viewer.evaluate("e => e.style.removeProperty('--jp-ui-font-color1')")
    assert outline.evaluate("e => getComputedStyle(e).outlineColor") == light

    # a gradient mark selects the bucket its parameter was in at that iteration: the rebuilt
    # map's bucket 1 at the last iteration
    viewer.locator("svg.ddpviz-timeline line.ddpviz-grad[data-param='0']").first.dispatch_event(
        "click")
    check_highlight(viewer, trace, True, 1)
    # empty space (a panel's heading) clears it
    viewer.locator(".ddpviz-buckets h3").click()
    check_cleared(viewer)
    assert console.errors == []


def test_a_matrix_row_selects_its_parameter_and_the_maps_zoom_in_the_browser(
        page: Any, lab: LabServer, console: ConsoleLog, real_trace: Trace) -> None:
    trace = real_trace
    params = [p.index for p in trace.of_type(ev.ParamsBuilt, rank=0)[0].params]
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab)
    double_click_file(page, FILE)
    viewer = wait_for_viewer(page, FILE)
    rows = viewer.locator("table.ddpviz-vm tr[data-param]")
    assert sorted(params_of(rows)) == sorted(params)  # one row a parameter, each selectable

    # a parameter's row: that parameter alone, in both maps, the timeline and the matrix
    row = viewer.locator("table.ddpviz-vm tr[data-param='3']")
    row.locator("td").first.click()
    check_param(viewer, trace, 3)
    screenshot(page, "matrix_selection", viewer.locator(".ddpviz-vm-panel"))
    screenshot(page, "matrix_selection_maps", viewer.locator(".ddpviz-buckets"))
    row.locator("td").first.click()  # again: cleared
    check_cleared(viewer)
    row.focus()  # the keyboard, as on a bucket
    page.keyboard.press("Enter")
    check_param(viewer, trace, 3)
    page.keyboard.press("Escape")
    check_cleared(viewer)
    # a bucket marks its parameters' rows
    rebuilt = viewer.locator(".ddpviz-bucketmap[data-rebuilt='true']")
    rebuilt.locator(".ddpviz-bucket[data-bucket='1'] .ddpviz-bucket-label").click()
    chosen = check_highlight(viewer, trace, True, 1)
    assert sorted(params_of(viewer.locator("table.ddpviz-vm tr.ddpviz-selected"))) == sorted(
        chosen)
    assert viewer.locator("table.ddpviz-vm tr[aria-pressed='true']").count() == 0
    viewer.locator(".ddpviz-buckets h3").click()
    check_cleared(viewer)

    # zoom: + doubles the bar's width in its scroller, about the middle; fit returns to 1x
    zoom = rebuilt.locator(".ddpviz-zoom")
    scroller = zoom.locator(".ddpviz-zoom-scroll")
    bar = scroller.locator(".ddpviz-bar")
    width = scroller.evaluate("e => e.clientWidth")
    assert scroller.get_attribute("data-zoom") == "1"
    assert zoom.locator("button", has_text="fit").is_disabled()
    for level in (2, 4, 8):
        zoom.locator("button", has_text="+").click()
        assert scroller.get_attribute("data-zoom") == str(level)
        assert abs(bar.evaluate("e => e.getBoundingClientRect().width") - level * width) < 2
    assert zoom.locator(".ddpviz-zoom-level").inner_text() == "8x"
    screenshot(page, "bucket_map_zoom", rebuilt)
    # about the middle: the bar's point at the scroller's middle stayed there
    middle = scroller.evaluate("e => (e.scrollLeft + e.clientWidth / 2) / e.scrollWidth")
    assert abs(middle - 0.5) < 0.01
    # Ctrl + wheel about the pointer: the point of the bar under it stays under it
    box = scroller.bounding_box()
    x = box["x"] + box["width"] * 0.25
    page.mouse.move(x, box["y"] + 10)
    under = scroller.evaluate(f"e => (e.scrollLeft + {x - box['x']}) / e.scrollWidth")
    page.keyboard.down("Control")
    page.mouse.wheel(0, -100)
    page.keyboard.up("Control")
    page.wait_for_function("e => e.dataset.zoom === '10'", arg=scroller.element_handle())
    after = scroller.evaluate(f"e => (e.scrollLeft + {x - box['x']}) / e.scrollWidth")
    assert abs(after - under) < 0.01
    # the replay's redraw keeps the zoom
    steps = sorted({e.step for e in trace.events() if e.step >= 0})
    viewer.locator(".ddpviz-replay-step").evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', "
        "{bubbles: true})); }", steps[0])
    page.wait_for_function(f"el => el.dataset.step === '{steps[0]}'",
                           arg=viewer.locator(".ddpviz-panels").element_handle())
    again = viewer.locator(".ddpviz-bucketmap[data-rebuilt='true'] .ddpviz-zoom-scroll")
    if again.count():  # (the rebuilt map is drawn from iteration 1 on)
        assert again.get_attribute("data-zoom") == "10"
    assert viewer.locator(".ddpviz-bucketmap[data-rebuilt='false'] .ddpviz-zoom-scroll"
                          ).get_attribute("data-zoom") == "1"
    viewer.locator(".ddpviz-replay-step").evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', "
        "{bubbles: true})); }", steps[-1])
    page.wait_for_function(f"el => el.dataset.step === '{steps[-1]}'",
                           arg=viewer.locator(".ddpviz-panels").element_handle())
    assert again.get_attribute("data-zoom") == "10"
    zoom = viewer.locator(".ddpviz-bucketmap[data-rebuilt='true'] .ddpviz-zoom")
    zoom.locator("button", has_text="fit").click()
    assert again.get_attribute("data-zoom") == "1"
    assert zoom.locator(".ddpviz-zoom-level").inner_text() == ""
    assert console.errors == []


def test_a_step_recorded_per_bucket_highlights_the_buckets_that_reduced_them(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    """Step 3 has no per-parameter marks (GradsSummarized): its per-bucket spans and
    all-reduces are highlighted by the map in effect there (the rebuilt one, from iteration
    1), whichever map the bucket was clicked in."""
    name = "summarized_selection.ddpviz"
    Trace(summarize_steps(synthetic_run(2, 12, 4, cap=400), {3})).save(lab_root / name)
    trace = Trace.load(lab_root / name)
    rebuilt = maps_of(trace)[True]
    assert len(maps_of(trace)[False]) == 1 and len(rebuilt) == 6
    open_lab(page, lab, name)
    viewer = wait_for_viewer(page, name)
    viewer.locator(".ddpviz-step-select").select_option("3")
    svg = viewer.locator("svg.ddpviz-timeline")
    assert svg.get_attribute("data-grads") == "0"
    spans = svg.locator("rect.ddpviz-grad-summary")
    done = sorted(e.bucket for e in trace.of_type(ev.AllReduceDone) if e.step == 3)
    for kind, bucket, lit in ((True, 2, {2}), (False, 0, set(range(len(rebuilt))))):
        viewer.locator(f".ddpviz-bucketmap[data-rebuilt='{str(kind).lower()}'] "
                       f".ddpviz-bucket[data-bucket='{bucket}']").click()
        assert set(params_of(viewer.locator(".ddpviz-param.ddpviz-selected"))) == set(
            maps_of(trace)[kind][bucket])
        assert set(buckets_of(svg.locator("rect.ddpviz-grad-summary.ddpviz-selected"))) == lit
        assert sorted(buckets_of(svg.locator("rect.ddpviz-grad-summary.ddpviz-dimmed"))) == sorted(
            b for b in buckets_of(spans) if b not in lit)
        assert sorted(buckets_of(svg.locator("rect.ddpviz-allreduce.ddpviz-selected"))) == [
            b for b in done if b in lit]
    viewer.locator(".ddpviz-buckets h3").click()
    check_cleared(viewer)
    assert console.errors == []


def test_in_trace_view_a_bucket_highlights_its_parameters_while_the_kernel_is_busy(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        real_trace: Trace) -> None:
    name = "linked_selection.ipynb"
    write_notebook(lab_root / name, [
        "from ddpviz.widgets.trace_view import TraceView\n"
        f"view = TraceView({FILE!r}, scheme={VIEWER['colorScheme']!r}, "
        f"max_events={VIEWER['maxEvents']})\nview",
        f"import time\ntime.sleep({SLEEP_S})\nprint('the busy cell ended')",
    ])
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab, name)
    start_all_cells(page)
    widget = page.locator(".jp-OutputArea-output .ddpviz-widget")
    widget.locator(".ddpviz-bucketmap").first.wait_for(timeout=120_000)
    busy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(1).locator(
        ".jp-InputPrompt")
    busy.get_by_text("[*]:").wait_for(timeout=60_000)
    started = time.monotonic()

    widget.locator(".ddpviz-bucketmap[data-rebuilt='true'] .ddpviz-bucket[data-bucket='1'] "
                   ".ddpviz-bucket-label").click()
    check_highlight(widget, real_trace, True, 1)
    select = widget.locator(".ddpviz-step-select")
    steps = [o.get_attribute("value") for o in select.locator("option").all()]
    select.select_option(steps[0])
    check_highlight(widget, real_trace, True, 1)
    widget.locator(".ddpviz-bucketmap[data-rebuilt='false'] .ddpviz-bucket").click()
    check_highlight(widget, real_trace, False, 0)
    widget.locator(".ddpviz-bucketmap[data-rebuilt='false'] .ddpviz-bucket").click()
    check_cleared(widget)
    # the keyboard inside a notebook: JupyterLab's own Enter and Escape (edit the cell,
    # command mode) do not take them from a focused bucket
    widget.locator(".ddpviz-bucketmap[data-rebuilt='true'] .ddpviz-bucket[data-bucket='0']").focus()
    page.keyboard.press("Enter")
    check_highlight(widget, real_trace, True, 0)
    page.keyboard.press("Escape")
    check_cleared(widget)
    assert page.locator(".jp-Notebook.jp-mod-editMode").count() == 0

    assert time.monotonic() - started < SLEEP_S - 20  # well inside the busy cell
    assert "the busy cell ended" not in stream_text(page)
    busy.get_by_text("[*]:").wait_for(timeout=1_000)  # still running
    assert error_outputs(page) == []
    assert console.errors == []
