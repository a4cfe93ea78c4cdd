"""The dashboard's debugger panel (`run.dashboard()` of a launch with debug=True: a TraceView
with `debugger=True`; extension/src/
debuggerPanel.ts, ddpviz/widgets/debugger_wire.py) in real JupyterLab in Chromium, on 2 real
gloo ranks (`ddpviz.launch(..., debug=True)`, ddpviz's DDP) that wait between phases of
training: a click on a bucket in the bucket map sets a break there (said in the panel; "clear
breaks" removes it), and so does a click on a bucket in the hook timeline (said in the panel,
and in the kernel's `dbg.breaks`); the ranks stop there (the status line says so, the timeline
marks the park on every lane, the bucket map outlines the bucket); the panel's resume clears
the marks; its pause stops the ranks before the next forward, marked too; resumed, the run
ends. A hostile parameter name typed into the inspect row comes back in the error line as
text, never markup."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import error_outputs, open_lab, run_all_cells, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.dist, pytest.mark.timeout(900)]

NAME = "debugger_view.ipynb"
BUCKET = 1  # the bucket clicked (the rebuilt map from step 1 on has 2 or more)
HOSTILE = "<img src=x onerror=alert(1)>"
LAUNCH = """\
import time
import ddpviz
from tests.browser import rank_fns

run = ddpviz.launch(rank_fns.train_in_phases, 2, args=({go!r}, (2, 3, 3), 0.005), debug=True,
                    timeout=600)
dbg = run.debugger
deadline = time.monotonic() + 300
while dbg.next_step() < 2 and time.monotonic() < deadline:  # steps 0-1 ran; the ranks wait
    time.sleep(0.1)
print("the ranks wait before step", dbg.next_step())
"""
SHOW = "view = run.dashboard()  # a launch with debug=True: the debugger's panel\nview"
CHECK = ("final = run.wait(timeout=300)\n"
         "print('KERNEL', [(b.step, b.where, b.bucket) for b in dbg.breaks], len(final))")
PANEL = ".jp-OutputArea-output .ddpviz-debugger"


def _run_new_cell(page: Any, code: str) -> None:
    """Add a cell below the last one, type `code` and run it (Shift+Enter)."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").last.locator(
        ".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")


def _go_after_command(path: Path, *until: int) -> None:
    """Let the ranks' next phase go, once the command just sent reached each of them
    (rank_fns.train_in_phases; `until` (step, bucket): once the break set holding only that
    break did); renamed in place, never read half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(" ".join(["after-command", *map(str, until)]))
    tmp.replace(path)


def _said(page: Any, text: str | re.Pattern[str], timeout_s: float = 120) -> None:
    """Wait until the panel shows `text` (its status, message or break set)."""
    page.locator(PANEL).get_by_text(text).first.wait_for(timeout=timeout_s * 1000)


def _button(page: Any, name: str) -> Any:
    return page.locator(PANEL).get_by_role("button", name=name, exact=True)


def _count_becomes(page: Any, selector: str, n: int, timeout_s: float = 60) -> None:
    page.wait_for_function("([s, n]) => document.querySelectorAll(s).length === n",
                           arg=[selector, n], timeout=timeout_s * 1000)


def test_the_view_breaks_at_a_clicked_bucket_and_marks_the_park(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        tmp_path: Path) -> None:
    go = tmp_path / "go"
    write_notebook(lab_root / NAME, [LAUNCH.format(go=str(go)), SHOW])
    page.set_viewport_size({"width": 1280, "height": 1400})
    open_lab(page, lab, NAME)
    run_all_cells(page, timeout_s=400)
    assert error_outputs(page) == []
    _said(page, re.compile(r"debugger · running"))
    timeline = page.locator(".jp-OutputArea-output svg.ddpviz-timeline").first
    hit = timeline.locator(f"rect.ddpviz-allreduce[data-bucket='{BUCKET}']").first
    hit.wait_for(timeout=120_000)  # step 1 drawn, with its buckets' all-reduces

    # a hostile name comes back as text in the error line (no element made of it)
    page.locator(PANEL).get_by_label("parameter name").fill(HOSTILE)
    _button(page, "inspect").click()
    _said(page, f"no parameter '{HOSTILE}'")
    error = page.locator(f"{PANEL} .ddpviz-debugger-error").first
    assert HOSTILE in error.inner_text() and error.locator("img").count() == 0
    assert page.locator(PANEL).get_by_label("parameter name").input_value() == HOSTILE

    # a bucket of the (rebuilt) bucket map sets a break too; "clear breaks" removes it
    other = 1 - BUCKET
    page.locator(f".jp-OutputArea-output .ddpviz-bucketmap[data-rebuilt='true'] "
                 f".ddpviz-bucket[data-bucket='{other}'] .ddpviz-bucket-label").first.click()
    _said(page, f"break set before bucket {other}'s all-reduce at step 3")
    _said(page, f"breaks: step 3 bucket {other}")
    _button(page, "clear breaks").click()
    _said(page, "breaks: none")

    hit.click()  # the break row's step: the first a break set now surely stops (3)
    _said(page, f"break set before bucket {BUCKET}'s all-reduce at step 3")
    _said(page, f"breaks: step 3 bucket {BUCKET}")
    _go_after_command(go.with_name("go1"), 3, BUCKET)  # on once the break reached them
    _said(page, f"paused at step 3, before bucket {BUCKET}'s all-reduce on ranks 0,1")
    marks = "svg.ddpviz-timeline g.ddpviz-stop[data-point='bucket']"
    _count_becomes(page, marks, 2)
    for i in range(2):  # one per lane, at the paused step, before the clicked bucket
        mark = page.locator(marks).nth(i)
        assert mark.get_attribute("data-step") == "3"
        assert mark.get_attribute("data-stop-bucket") == str(BUCKET)
    # (the bucket's band in each lane: drawn once the ranks' events of step 3 arrived, which
    # may be a live update after the park's own marks)
    _count_becomes(page, "svg.ddpviz-timeline rect.ddpviz-stop-bucket", 2)
    assert "⏸ paused at step 3" in page.locator(".ddpviz-paused").first.inner_text()
    stopped = page.locator(".ddpviz-bucketmap .ddpviz-bucket.ddpviz-stop-bucket")
    assert stopped.count() >= 1
    assert all(b.get_attribute("data-bucket") == str(BUCKET) for b in stopped.all())
    screenshot(page, "debugger_view_paused_at_a_bucket",
               page.locator(".jp-Cell-outputArea").last)

    _button(page, "resume").click()
    _said(page, re.compile(r"debugger · running"))
    _count_becomes(page, "g.ddpviz-stop", 0)
    _count_becomes(page, ".ddpviz-stop-bucket", 0)
    assert page.locator(".ddpviz-paused").count() == 0

    # steps 3-4 drawn, so run by the ranks, which then wait for go2: the pause sent after it
    # is the command each waits for (rank_fns.train_in_phases)
    page.locator(".jp-OutputArea-output .ddpviz-step-select option[value='4']").first.wait_for(
        state="attached", timeout=120_000)
    time.sleep(1.0)
    _button(page, "pause").click()
    # after steps 3-4, once the pause reached them: at step 5's forward they agree on step 6
    _go_after_command(go.with_name("go2"))
    _said(page, "paused at step 6, before DDP's forward on ranks 0,1")
    forward = "svg.ddpviz-timeline g.ddpviz-stop[data-point='forward']"
    _count_becomes(page, forward, 2)
    assert all(m.get_attribute("data-step") == "6" for m in page.locator(forward).all())
    assert page.locator(".ddpviz-bucketmap .ddpviz-stop-bucket").count() == 0
    _button(page, "resume").click()
    _count_becomes(page, "g.ddpviz-stop", 0)

    # the kernel: the break the click set, and the run ended (both ranks' results)
    _run_new_cell(page, CHECK)
    out = page.locator("[data-mime-type='application/vnd.jupyter.stdout']",
                       has_text="KERNEL").first
    out.wait_for(timeout=300_000)
    said = out.inner_text().split("KERNEL", 1)[1].strip()
    assert said == f"[(3, 'bucket', {BUCKET})] 2"
    assert error_outputs(page) == []
    assert console.errors == []
