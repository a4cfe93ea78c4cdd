"""The JupyterLab trace viewer on a trace with steps recorded per bucket only (GradsSummarized,
detail "sampled"): those steps draw one span per bucket from its first to its last gradient
ready, at the times in the file, with a note naming the steps that have per-parameter hooks;
a full step of the same trace is drawn hook by hook, with no note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog
from tests.browser.lab import LabServer
from tests.browser.ui import open_lab, wait_for_viewer
from tests.widgets.streams import summarize_steps, synthetic_run

pytestmark = pytest.mark.browser

NAME = "summarized.ddpviz"


@pytest.fixture(scope="module")
def summarized(lab_root: Path) -> Trace:
    events = summarize_steps(synthetic_run(2, 12, 4, cap=400), {3})
    trace = Trace(events)
    trace.save(lab_root / NAME)
    return Trace.load(lab_root / NAME)


def test_a_summarized_step_draws_one_span_per_bucket_and_says_so(
        page: Any, lab: LabServer, summarized: Trace, console: ConsoleLog) -> None:
    open_lab(page, lab, NAME)
    viewer = wait_for_viewer(page, NAME)
    select = viewer.locator(".ddpviz-step-select")
    select.select_option("3")
    svg = viewer.locator("svg.ddpviz-timeline")
    assert svg.get_attribute("data-step") == "3"
    assert svg.get_attribute("data-grads") == "0"
    sums = summarized.of_type(ev.GradsSummarized)
    assert sums and {e.step for e in sums} == {3}
    offset = {r: summarized.clock.get(r, (0, 0))[0] for r in summarized.ranks}
    want = sorted((e.bucket, e.first_t_ns + offset[e.rank], e.last_t_ns + offset[e.rank])
                  for e in sums)
    rects = svg.locator("rect.ddpviz-grad-summary")
    got = sorted((int(r.get_attribute("data-bucket")), int(float(r.get_attribute("data-first"))),
                  int(float(r.get_attribute("data-last")))) for r in rects.all())
    assert got == want
    note = viewer.locator(".ddpviz-summary-note")
    assert note.get_attribute("data-ranks") == "0,1"
    assert "Step 3: per-bucket summaries; per-parameter hooks recorded on steps 0-2 " \
        "(Recording(every=1): every step)" in note.inner_text()
    select.select_option("2")
    assert svg.get_attribute("data-step") == "2"
    hooks = [e for e in summarized.of_type(ev.GradReady) if e.step == 2]
    assert svg.get_attribute("data-grads") == str(len(hooks)) != "0"
    assert viewer.locator("rect.ddpviz-grad-summary").count() == 0
    assert viewer.locator(".ddpviz-summary-note").count() == 0
