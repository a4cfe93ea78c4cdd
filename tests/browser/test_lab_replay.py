"""Replay and the status line of the one front end (extension/src/replay.ts) in real JupyterLab
in Chromium. A TraceView of a finished 2-rank gloo run: while a cell keeps the kernel busy,
the time slider and the iteration control move and every panel is drawn again as of the
instant picked (the events up to it; the hook timeline shows the iteration picked), all in
the browser. A TraceView of a live run says, from its kernel's `status` trait, that 2 of 2
ranks are connected while the run goes on, then that the run finished; an instant picked
while it ran stays picked across the live redraws."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import error_outputs, open_lab, start_all_cells, stream_text, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

FILE = "run.ddpviz"  # conftest.real_trace
WIDGETS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .ddpviz-widget"
SLEEP_S = 10  # the busy cell: replay is used while it runs

# move a range input as a drag does: its value, then an `input` event
MOVE = "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', {bubbles: true})); }"


def _busy(page: Any, cell: int) -> Any:
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(cell).locator(
        ".jp-InputPrompt").get_by_text("[*]:")


def _drawn(page: Any, panels: Any, as_of: str) -> None:
    """Wait until the panels are drawn as of `as_of` ('' : everything)."""
    page.wait_for_function("([el, v]) => el.dataset.asOf === v",
                           arg=[panels.element_handle(), as_of], timeout=10_000)


def test_replay_redraws_every_panel_while_the_kernel_is_busy(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        real_trace: Trace) -> None:
    name = "replay.ipynb"
    write_notebook(lab_root / name, [
        f"from ddpviz.widgets.trace_view import TraceView\nview = TraceView({FILE!r})\nview",
        f"import time\ntime.sleep({SLEEP_S})\nprint('the busy cell ended')"])
    page.set_viewport_size({"width": 1280, "height": 1400})
    open_lab(page, lab, name)
    start_all_cells(page)
    widget = page.locator(WIDGETS).first
    widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
    _busy(page, 1).wait_for(timeout=60_000)  # the kernel sleeps from here on
    started = time.monotonic()
    bar = widget.locator(".ddpviz-replay")
    panels = widget.locator(".ddpviz-panels")
    summary = widget.locator(".ddpviz-summary")
    total = len(real_trace)
    steps = sorted({e.step for e in real_trace.events() if e.step >= 0})
    # a finished run opens on everything, its last iteration; no "follow live"
    assert panels.get_attribute("data-as-of") == ""
    assert bar.get_attribute("data-step") == str(steps[-1])
    assert bar.locator(".ddpviz-replay-follow").count() == 0
    assert summary.get_attribute("data-events") == str(total)
    status = widget.locator(".ddpviz-status")
    assert "2 of 2 ranks in the trace" in status.inner_text()
    draws = int(panels.get_attribute("data-draws") or 0)

    # the time slider at its start: the first instant, a rank's first event or two
    time_input = bar.locator(".ddpviz-replay-time")
    time_input.evaluate(MOVE, 0)
    page.wait_for_function("el => el.dataset.asOf !== ''", arg=panels.element_handle(),
                           timeout=10_000)
    t0 = int(panels.get_attribute("data-as-of") or 0)
    assert int(summary.get_attribute("data-events") or 0) < 4
    assert bar.get_attribute("data-step") == "-1"
    assert "constructor" in bar.locator(".ddpviz-replay-readout").inner_text()
    assert widget.locator(".ddpviz-progress-row").count() == 0  # no broadcast yet
    assert int(panels.get_attribute("data-draws") or 0) > draws

    # halfway: an instant inside the iterations; the timeline shows the one going on then
    time_input.evaluate(MOVE, 500)
    page.wait_for_function("([el, t]) => Number(el.dataset.asOf) > t",
                           arg=[panels.element_handle(), t0], timeout=10_000)
    half = int(summary.get_attribute("data-events") or 0)
    assert 4 <= half <= total
    assert "phase:" in status.inner_text()

    # the iteration control: the end of iteration 1, the timeline on it
    step_input = bar.locator(".ddpviz-replay-step")
    step_input.evaluate(MOVE, 1)
    page.wait_for_function("el => el.dataset.step === '1'", arg=panels.element_handle(),
                           timeout=10_000)
    assert widget.locator(".ddpviz-step-select").input_value() == "1"
    at_one = int(summary.get_attribute("data-events") or 0)
    assert at_one < total
    assert "iteration 1" in bar.locator(".ddpviz-replay-readout").inner_text()
    # back to the constructor's end (the hook timeline has no iteration then)
    step_input.evaluate(MOVE, -1)
    page.wait_for_function("el => el.dataset.step === '-1'", arg=panels.element_handle(),
                           timeout=10_000)
    constructor = int(summary.get_attribute("data-events") or 0)
    assert constructor < at_one
    assert widget.locator(".ddpviz-step-select").count() == 0
    rows = widget.locator(".ddpviz-progress-row")
    assert rows.count() == 2  # the constructor's broadcast, done on both ranks
    assert all(r.get_attribute("data-done") == r.get_attribute("data-total") for r in rows.all())

    # the slider's end: everything again
    time_input.evaluate(MOVE, 1000)
    page.wait_for_function(f"el => el.querySelector('.ddpviz-summary')?.dataset.events === "
                           f"'{total}'", arg=widget.element_handle(), timeout=10_000)

    # all of it while the kernel slept: nothing waited on it
    assert time.monotonic() - started < SLEEP_S
    _busy(page, 1).wait_for(timeout=1_000)
    assert "the busy cell ended" not in stream_text(page)
    screenshot(page, "replay", widget)
    assert error_outputs(page) == []
    assert console.errors == []


LAUNCH = """\
import time
import ddpviz
from ddpviz.events import BackwardFinished
from ddpviz.widgets.trace_view import TraceView
from tests.browser import rank_fns

run = ddpviz.launch(rank_fns.train_in_phases, 2, args=({go!r}, (2, 2), 0.005), timeout=600)
deadline = time.monotonic() + 300
while len(run.trace.of_type(BackwardFinished)) < 4 and time.monotonic() < deadline:
    time.sleep(0.1)  # phase 0 ran on both ranks; they wait for go1
view = TraceView(run)
view"""
WAIT = "final = run.wait(timeout=300)\ntime.sleep(1.5)\nprint('the run ended', run.status)"


def test_the_status_line_of_a_live_run_says_ranks_connected_then_finished(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog, tmp_path: Path) -> None:
    name = "replay_live.ipynb"
    go = tmp_path / "go"
    write_notebook(lab_root / name, [LAUNCH.format(go=str(go)), WAIT])
    page.set_viewport_size({"width": 1280, "height": 1200})
    open_lab(page, lab, name)
    start_all_cells(page)
    widget = page.locator(WIDGETS).first
    status = widget.locator(".ddpviz-status")
    status.wait_for(timeout=300_000)
    _busy(page, 1).wait_for(timeout=60_000)  # run.wait(): the kernel is busy
    assert status.get_attribute("data-run-status") == "running"
    assert status.get_attribute("data-connected") == "2"
    text = status.inner_text()
    assert "2 of 2 ranks connected, 0 finished" in text, text
    assert "run running" in text and "ddpviz.launch: 2 ranks" in text
    assert widget.locator(".ddpviz-replay-follow").is_checked()
    losses = widget.locator(".ddpviz-status-losses")
    assert losses.get_attribute("data-dropped") == "0"
    assert "ddpviz-status-bad" not in (losses.get_attribute("class") or "")

    # replay while it runs: follow turns off and the instant picked survives the live redraws
    panels = widget.locator(".ddpviz-panels")
    widget.locator(".ddpviz-replay-time").evaluate(MOVE, 500)
    page.wait_for_function("el => el.dataset.asOf !== ''", arg=panels.element_handle(),
                           timeout=10_000)
    as_of = panels.get_attribute("data-as-of")
    assert not widget.locator(".ddpviz-replay-follow").is_checked()

    tmp = go.with_name("go1.tmp")
    tmp.write_text("go")
    tmp.replace(go.with_name("go1"))
    widget.locator(".ddpviz-status[data-run-status='finished']").wait_for(timeout=180_000)
    text = widget.locator(".ddpviz-status").inner_text()
    assert "2 of 2 ranks connected, 2 finished" in text, text
    assert "run finished" in text
    assert widget.locator(".ddpviz-replay-follow").count() == 0  # over: nothing to follow
    assert widget.locator(".ddpviz-panels").get_attribute("data-as-of") == as_of
    screenshot(page, "replay_live", widget)
    page.wait_for_function("() => document.body.innerText.includes('the run ended')",
                           timeout=120_000)
    assert error_outputs(page) == []
    assert console.errors == []
