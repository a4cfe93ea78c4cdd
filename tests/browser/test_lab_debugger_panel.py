"""The dashboard's debugger panel in real JupyterLab in Chromium, on 2 real gloo ranks
(`ddpviz.launch(..., debug=True)`, ddpviz's DDP) that wait between phases of training: a click
on a bucket in the hook timeline sets a break there (said in the panel, and in the kernel's
`dbg.breaks`); the ranks stop there (the status line says so, the timeline marks the park on
every lane, the bucket map highlights the bucket's row); the panel's resume clears the marks;
its pause stops the ranks before the next forward, marked too; resumed, the run ends."""

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

NAME = "debugger_panel.ipynb"
BUCKET = 1  # the bucket clicked (the rebuilt map from step 1 on has 2 or more)
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
SHOW = "d = run.dashboard()\nd"
CHECK = ("final = run.wait(timeout=300)\n"
         "print('KERNEL', [(b.step, b.where, b.bucket) for b in dbg.breaks], len(final))")
# the bucket map's plotly shapes (our highlight is named ddpviz-stop)
_SHAPES = "gd => (gd.layout.shapes || []).map(s => [s.name, s.y0, s.y1])"


def _run_new_cell(page: Any, code: str) -> None:
    """Add a cell below the last one, type `code` and run it (Shift+Enter)."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").last.locator(
        ".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")


def _go_after_command(path: Path) -> None:
    """Let the ranks' next phase go, once the command just sent reached each of them
    (rank_fns.train_in_phases); renamed in place, never read half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("after-command")
    tmp.replace(path)


def _said(page: Any, text: str | re.Pattern[str], timeout_s: float = 120) -> None:
    """Wait until the page shows `text` (the panel's status or message, the break set)."""
    page.get_by_text(text).first.wait_for(timeout=timeout_s * 1000)


def _button(page: Any, name: str) -> Any:
    return page.locator(".jp-OutputArea-output").get_by_role("button", name=name, exact=True)


def _shapes_become(plot: Any, n: int, timeout_s: float = 60) -> None:
    """Wait until the bucket map's figure holds `n` shapes (read in the page)."""
    deadline = time.monotonic() + timeout_s
    while len(plot.evaluate(_SHAPES)) != n:
        assert time.monotonic() < deadline, plot.evaluate(_SHAPES)
        time.sleep(0.2)


def _marks(timeline: Any, point: str) -> Any:
    return timeline.locator(f"g.ddpviz-stop[data-point='{point}']")


def test_the_panel_breaks_at_a_clicked_bucket_and_marks_the_park(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        tmp_path: Path) -> None:
    go = tmp_path / "go"
    write_notebook(lab_root / NAME, [LAUNCH.format(go=str(go)), SHOW])
    page.set_viewport_size({"width": 1280, "height": 1400})
    open_lab(page, lab, NAME)
    run_all_cells(page, timeout_s=400)
    assert error_outputs(page) == []
    timeline = page.locator(".jp-OutputArea-output .ddpviz-clickable").first
    plot = page.locator(".jp-OutputArea-output .js-plotly-plot").first
    hit = timeline.locator(f"rect.ddpviz-bucket-hit[data-bucket='{BUCKET}']").first
    hit.wait_for(timeout=120_000)  # step 1 drawn, with its buckets as click targets
    _said(page, re.compile(r"debugger · running"))

    hit.click()  # the break row's step: the first a break set now surely stops (3)
    _said(page, f"break set before bucket {BUCKET}'s all-reduce at step 3")
    _said(page, f"breaks: step 3 bucket {BUCKET}")
    _go_after_command(go.with_name("go1"))  # on once the break reached them
    _said(page, f"paused at step 3, before bucket {BUCKET}'s all-reduce on ranks 0,1")
    marks = _marks(timeline, "bucket")
    page.wait_for_function("n => document.querySelectorAll(\"g.ddpviz-stop[data-point='bucket']"
                           "\").length === n", arg=2)
    for i in range(2):  # one per lane, at the paused step, before the clicked bucket
        assert marks.nth(i).get_attribute("data-step") == "3"
        assert marks.nth(i).get_attribute("data-stop-bucket") == str(BUCKET)
    assert timeline.locator("rect.ddpviz-stop-bucket").count() == 2
    assert "⏸ paused at step 3" in page.locator(".ddpviz-paused").first.inner_text()
    _shapes_become(plot, 1)
    assert [s[0] for s in plot.evaluate(_SHAPES)] == ["ddpviz-stop"]
    screenshot(page, "debugger_panel_paused_at_a_bucket", page.locator(".jp-Cell-outputArea").last)

    _button(page, "resume").click()
    _said(page, re.compile(r"debugger · running"))
    page.wait_for_function("() => document.querySelectorAll('g.ddpviz-stop').length === 0")
    _shapes_become(plot, 0)
    assert page.locator(".ddpviz-paused").count() == 0

    _button(page, "pause").click()
    # after steps 3-4, once the pause reached them: at step 5's forward they agree on step 6
    _go_after_command(go.with_name("go2"))
    _said(page, "paused at step 6, before DDP's forward on ranks 0,1")
    page.wait_for_function("n => document.querySelectorAll(\"g.ddpviz-stop[data-point="
                           "'forward']\").length === n", arg=2)
    assert all(m.get_attribute("data-step") == "6" for m in _marks(timeline, "forward").all())
    _shapes_become(plot, 0)
    _button(page, "resume").click()
    page.wait_for_function("() => document.querySelectorAll('g.ddpviz-stop').length === 0")

    # the kernel: the break the click set, and the run ended (both ranks' results)
    _run_new_cell(page, CHECK)
    out = page.locator("[data-mime-type='application/vnd.jupyter.stdout']",
                       has_text="KERNEL").first
    out.wait_for(timeout=300_000)
    said = out.inner_text().split("KERNEL", 1)[1].strip()
    assert said == f"[(3, 'bucket', {BUCKET})] 2"
    assert error_outputs(page) == []
    assert console.errors == []
