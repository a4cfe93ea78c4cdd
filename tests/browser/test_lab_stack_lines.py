"""The JupyterLab trace viewer shows a hang finding's stack lines (issue #25: where each rank
is, in code) as the engine formats them: a real thread parked in its data loading, read and
folded by probes/where.py and stack_text.py, put in a rank_hang finding's detail by
whereabouts.stack_detail, as the pulse thread does. Every line shows, in order, with its
indentation and as text (a `<module>` frame is not markup). And a rank's file that ends with
its end record (listen(follow=)'s "finished") opens like any other."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.findings import Finding, fix_for
from ddpviz.probes import stack_text
from ddpviz.probes import where as wh
from ddpviz.probes.whereabouts import Where, stack_detail
from ddpviz.traces.fileformat import End, read_end
from ddpviz.traces.trace import Trace
from ddpviz.transport import Sender
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import double_click_file, open_lab, wait_for_viewer
from tests.diagnose.synthetic import Ranks

pytestmark = pytest.mark.browser

NAME = "hang_stacks.ddpviz"


def parked_stack() -> list[stack_text.Frame]:
    """The frames of a thread blocked in its data loading (innermost first), under a notebook
    cell's `<module>` frame, as a rank's training thread in a %%ddp cell would be."""
    reached, release = threading.Event(), threading.Event()

    def load_batch() -> None:
        reached.set()
        release.wait(60)  # blocked, as in a slow read

    thread = threading.Thread(target=load_batch, daemon=True)
    thread.start()
    assert reached.wait(60)
    frame = None
    for _ in range(500):  # until it is inside the wait, not between the two calls
        frame = wh.thread_frame(thread.ident or 0)
        if frame is not None and frame.f_code.co_name == "wait":
            break
        time.sleep(0.01)
    stack = wh.frames(frame)
    release.set()
    thread.join(60)
    return [*stack, stack_text.Frame("<ddp-cell-3>", 4, "<module>")]


@pytest.fixture(scope="module")
def detail(lab_root: Path) -> tuple[str, ...]:
    stack = parked_stack()
    behind = Where(3, time.time(), stack_text.summary(stack), tuple(stack_text.stack_lines(stack)))
    waiting = Where(3, time.time(), "train.py:57 in main; inside torch/distributed: wait")
    lines = stack_detail({1: behind}, (1,), 0, waiting, 2)
    finding = Finding(kind="rank_hang", severity="error",
                      title="rank 1 never launched bucket 0 of step 3", ranks=(1,), bucket=0,
                      step=3, detail=lines, fix=fix_for("rank_hang"), world_size=2)
    ranks = Ranks(2)
    ranks.construct()
    for step in range(3):
        for r in (0, 1):
            ranks.iteration(r, step)
    ranks.iteration(0, 3, finish=False)
    ranks.emit(0, ev.FindingReported, finding)
    Trace(ranks.events).save(lab_root / NAME)
    return lines


def test_the_viewer_shows_a_hang_finding_s_stack_lines(page: Any, lab: LabServer,
                                                       console: ConsoleLog,
                                                       detail: tuple[str, ...]) -> None:
    assert detail[0].startswith("rank 1 is at ")
    assert any("in load_batch: release.wait(60)" in line for line in detail), detail
    assert any(line.startswith("  ... ") and "stdlib" in line for line in detail), detail
    assert any("<ddp-cell-3>:4 in <module>" in line for line in detail), detail
    assert detail[-1].startswith("rank 0 (waiting) is at train.py:57 in main")
    open_lab(page, lab)
    double_click_file(page, NAME)
    viewer = wait_for_viewer(page, NAME)
    finding = viewer.locator(".ddpviz-finding[data-severity='error']")
    assert finding.count() == 1
    assert "rank 1 never launched bucket 0 of step 3 (rank 1)" in finding.inner_text()
    shown = finding.locator("pre.ddpviz-finding-detail")
    assert shown.inner_text().split("\n") == list(detail)  # every line, in order, indented
    assert shown.locator("*").count() == 0  # text only: `<module>` made no element
    screenshot(page, "trace_viewer_hang_stacks", finding)
    assert console.errors == []


def test_the_viewer_opens_a_rank_s_file_that_ends_with_its_end_record(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    # A rank's own file as `ddpviz record` leaves it: its sender closed it with the end
    # record (tracefile.py), a frame kind the viewer does not know and skips.
    path = lab_root / "ddpviz-trace-rank0.ddpviz"
    ranks = Ranks(1)
    ranks.construct()
    for step in range(3):
        ranks.iteration(0, step)
    with Sender.to_file(path, 0) as sender:
        for e in ranks.events:
            sender(e)
    assert read_end(path) == End(0, len(ranks.events), 0)
    open_lab(page, lab)
    double_click_file(page, path.name)
    viewer = wait_for_viewer(page, path.name)
    summary = viewer.locator(".ddpviz-summary")
    assert summary.get_attribute("data-events") == str(len(ranks.events))
    assert summary.locator(".ddpviz-warning").count() == 0  # not torn, nothing rejected
    assert console.errors == []
