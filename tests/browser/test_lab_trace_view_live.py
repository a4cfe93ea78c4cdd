"""The TraceView anywidget (ddpviz/widgets/trace_view.py) following a live run in real
JupyterLab in Chromium: 2 real gloo ranks (`ddpviz.launch`) training in phases the test lets
go; the view shows the first phase, then, while the kernel is busy in `run.wait()`, the next
phases' events arrive as frames and the view redraws with the iteration and the bucket the
user picked and the notebook's scroll kept; the verdict says "so far" until the run ends,
then is diagnose()'s for the whole run; a second view of the same widget and a reloaded page
get the whole run. A second test feeds 20 "ranks" (a real Session, events sent from a kernel
thread) to check that the many-rank lane picker keeps the rank picked across an update."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import error_outputs, open_lab, start_all_cells, stream_text, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.dist, pytest.mark.timeout(900)]

NAME = "trace_view_live.ipynb"
LAUNCH = """\
import json, time
import ddpviz
from ddpviz.events import BackwardFinished
from ddpviz.widgets.trace_view import TraceView
from tests.browser import rank_fns

run = ddpviz.launch(rank_fns.train_in_phases, 2, args=({go!r}, (3, 3, 3), 0.005), timeout=600)
deadline = time.monotonic() + 300
while len(run.trace.of_type(BackwardFinished)) < 6 and time.monotonic() < deadline:
    time.sleep(0.1)  # phase 0 (steps 0-2) ran on both ranks; they wait for go1
print("phase 0 ran")
"""
SHOW = "view = TraceView(run)\nview"
WAIT = """\
final = run.wait(timeout=300)
time.sleep(1.5)  # the view's thread: its last send
print("KERNEL", json.dumps([view.live, view.events_sent, len(run.trace), view.sends,
      [[f.severity, f.title] for f in ddpviz.diagnose(run)]]))
"""
AGAIN = "view"  # a second view of the same widget, once the run is over

WIDGETS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .ddpviz-widget"


def _go(path: Path) -> None:
    """Let the ranks' next phase go (rank_fns.train_in_phases); never read half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("go")
    tmp.replace(path)


def _kernel_said(page: Any, timeout_s: float = 120) -> str:
    """What the notebook printed after "KERNEL " (in its output, not its source)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in stream_text(page).splitlines():
            if line.startswith("KERNEL "):
                return line[len("KERNEL "):]
        time.sleep(0.2)
    raise AssertionError(f"the kernel said nothing: {stream_text(page)!r}")


def _events(widget: Any) -> int:
    return int(widget.get_attribute("data-events") or 0)


def _steps(widget: Any) -> list[str]:
    return [o.get_attribute("value") for o in
            widget.locator(".ddpviz-step-select option").all()]


def test_a_live_run_is_followed_while_the_kernel_is_busy_and_keeps_what_was_picked(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    write_notebook(lab_root / NAME, [LAUNCH.format(go=str(go)), SHOW, WAIT, AGAIN])
    page.set_viewport_size({"width": 1280, "height": 1200})
    open_lab(page, lab, NAME)
    start_all_cells(page)
    widget = page.locator(WIDGETS).first
    widget.locator(".ddpviz-summary").wait_for(timeout=300_000)
    busy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(2).locator(
        ".jp-InputPrompt")
    busy.get_by_text("[*]:").wait_for(timeout=60_000)  # run.wait(): the kernel is busy

    # the first phase, live: the verdict is one "so far"
    assert widget.locator(".ddpviz-live").get_attribute("data-live") == "running"
    verdict = widget.locator(".ddpviz-verdict")
    assert verdict.get_attribute("data-live") == "running"
    assert verdict.get_attribute("data-scope") == "diagnose"
    assert "So far" in verdict.inner_text()
    page.wait_for_function("el => el.querySelectorAll('.ddpviz-step-select option').length >= 3",
                           arg=widget.element_handle(), timeout=30_000)
    assert _steps(widget) == ["0", "1", "2"]
    select = widget.locator(".ddpviz-step-select")
    select.select_option("1")  # not the last: a redraw must not move it
    widget.locator(".ddpviz-bucketmap[data-rebuilt='false'] .ddpviz-bucket").first.click()
    pressed = widget.locator(".ddpviz-bucket[aria-pressed='true']")
    assert pressed.count() == 1
    scroller = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer")
    scroller.evaluate("el => { el.scrollTop = 300; }")
    top = scroller.evaluate("el => el.scrollTop")
    before, draws = _events(widget), int(widget.get_attribute("data-draws") or 0)

    # the next phase runs while the kernel is still in run.wait(): frames arrive, redrawn
    _go(go.with_name("go1"))
    page.wait_for_function(
        "el => [...el.querySelectorAll('.ddpviz-step-select option')].some(o => o.value === '5')",
        arg=widget.element_handle(), timeout=120_000)
    assert _events(widget) > before
    assert int(widget.get_attribute("data-draws") or 0) > draws
    busy.get_by_text("[*]:").wait_for(timeout=1_000)  # still busy: no kernel round-trip
    assert select.input_value() == "1"  # what the user picked survived the update
    assert pressed.count() == 1  # and the bucket selected
    assert widget.locator(".ddpviz-trace.ddpviz-has-selection").count() == 1
    assert scroller.evaluate("el => el.scrollTop") == top
    assert float(widget.get_attribute("data-draw-ms") or 0) > 0
    screenshot(page, "trace_view_live", widget)

    # the run ends: the final events, then diagnose()'s findings for the whole run
    _go(go.with_name("go2"))
    page.locator(f"{WIDGETS} .ddpviz-live[data-live='finished']").first.wait_for(
        timeout=180_000)
    live, sent, total, sends, found = json.loads(_kernel_said(page))
    assert (live, sent) == ("finished", total)
    assert sends >= 2  # new events went as frames, more than once
    page.wait_for_function(f"el => el.getAttribute('data-events') === '{total}'",
                           arg=widget.element_handle(), timeout=30_000)
    assert widget.locator(".ddpviz-summary").get_attribute("data-events") == str(total)
    assert verdict.get_attribute("data-live") == "finished"
    assert "So far" not in verdict.inner_text()
    items = widget.locator(".ddpviz-finding").all()
    assert [i.get_attribute("data-severity") for i in items] == [s for s, _ in found]
    for item, (_, title) in zip(items, found, strict=True):
        assert title in item.inner_text()
    assert select.input_value() == "1"

    # a second view of the same widget (in this page) draws the whole run at once
    second = page.locator(WIDGETS).nth(1)
    second.locator(".ddpviz-summary").wait_for(timeout=60_000)
    assert second.locator(".ddpviz-summary").get_attribute("data-events") == str(total)

    # a reloaded page starts from the widget's state (the run when the view was made) and
    # asks the now idle kernel for the whole run
    page.keyboard.press("Control+s")
    time.sleep(1.0)
    page.reload()
    again = page.locator(WIDGETS).first
    again.locator(".ddpviz-summary").wait_for(timeout=120_000)
    page.wait_for_function(
        f"el => el.querySelector('.ddpviz-summary')?.getAttribute('data-events') === '{total}'",
        arg=again.element_handle(), timeout=60_000)
    assert error_outputs(page) == []
    assert console.errors == []


MANY = """\
import os, time
import ddpviz
from ddpviz.transport.sender import Sender
from ddpviz.widgets.trace_view import TraceView
from tests.widgets.streams import synthetic_run

events = synthetic_run(20, steps=6)
per = {{r: [e for e in events if e.rank == r] for r in range(20)}}
session = ddpviz.listen(show=False)
senders = {{r: Sender(session.connect_string, r, batch=64) for r in per}}

def send(part):
    for r, es in per.items():
        half = len(es) // 2
        for e in (es[:half] if part == 0 else es[half:]):
            senders[r](e)
        senders[r].flush()

send(0)
deadline = time.monotonic() + 60
while len(session.trace) < sum(len(es) // 2 for es in per.values()) and time.monotonic() < deadline:
    time.sleep(0.05)
view = TraceView(session)
view
"""
MANY_BUSY = """\
while not os.path.exists({go!r}):
    time.sleep(0.05)
send(1)
deadline = time.monotonic() + 60
while view.events_sent < len(events) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)  # the browser draws while the kernel is still busy
session.close()
time.sleep(1)
print("KERNEL", len(session.trace), view.events_sent, len(events), view.live)
"""


def test_the_picked_rank_of_many_survives_an_update(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    write_notebook(lab_root / "trace_view_many.ipynb", [MANY.format(), MANY_BUSY.format(
        go=str(go))])
    page.set_viewport_size({"width": 1280, "height": 1200})
    open_lab(page, lab, "trace_view_many.ipynb")
    start_all_cells(page)
    widget = page.locator(WIDGETS).first
    widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
    busy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").nth(1).locator(
        ".jp-InputPrompt")
    busy.get_by_text("[*]:").wait_for(timeout=60_000)
    ranks = widget.locator(".ddpviz-rank-select")
    ranks.select_option("7")
    steps = _steps(widget)
    picked = steps[0]
    widget.locator(".ddpviz-step-select").select_option(picked)
    before = _events(widget)
    _go(go)
    page.wait_for_function(f"el => Number(el.getAttribute('data-events')) > {before}",
                           arg=widget.element_handle(), timeout=60_000)
    page.wait_for_function(
        f"el => el.querySelectorAll('.ddpviz-step-select option').length > {len(steps)}",
        arg=widget.element_handle(), timeout=60_000)
    assert ranks.input_value() == "7"
    assert widget.locator(".ddpviz-step-select").input_value() == picked
    said = _kernel_said(page).split()
    assert said[0] == said[1] == said[2] and said[3] == "closed", said
    page.wait_for_function(f"el => el.getAttribute('data-events') === '{said[0]}'",
                           arg=widget.element_handle(), timeout=30_000)
    assert error_outputs(page) == []
    assert console.errors == []
