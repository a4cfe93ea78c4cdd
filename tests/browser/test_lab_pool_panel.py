"""The debugger panel of a `%%ddp --debug` pool in real JupyterLab in Chromium, on 2 real gloo
ranks: a training cell parks at a break (it returns, the ranks keep the rest of it); the panel's
resume button runs the rest of that cell, whose output (every rank's remaining steps and its
result) shows in the panel's output area, not lost to the log; the panel says the ranks run.
The panel is the dashboard's (the one front end) of the pool's session, given its debugger."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import (
    error_outputs,
    open_lab,
    run_all_cells,
    stream_text,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.dist, pytest.mark.timeout(900)]

NAME = "pool_panel.ipynb"
STEPS = 6
BREAK = 3
CELLS = [
    "%load_ext ddpviz",
    "%%ddp -n 2 --backend gloo --debug\nfrom tests.debugger import pool_fns as f\n"
    "st = f.build('twin')\n",
    "dbg = %ddp_debugger\n"
    f"dbg.break_at(step={BREAK}, where='forward')\n"
    "from ddpviz.widgets import Dashboard\n"
    "panel = Dashboard(dbg.session, debugger=dbg)\npanel",
    "%%ddp\n"
    f"for s in range({STEPS}):\n"
    "    loss = f.train_step(st, s)\n"
    "    print(f'step {s} loss {loss:.6f}')\n"
    "sorted(f.final(st))[:2]\n",
]


def test_the_panels_resume_runs_the_rest_of_the_parked_cell_into_the_panel(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    write_notebook(lab_root / NAME, CELLS)
    page.set_viewport_size({"width": 1280, "height": 1400})
    open_lab(page, lab, NAME)
    run_all_cells(page, timeout_s=400)
    assert error_outputs(page) == []
    # the training cell returned with every rank parked before step BREAK's forward
    text = stream_text(page)
    assert f"every rank stopped at step {BREAK}" in " ".join(text.split()), text
    for rank in (0, 1):
        assert f"[rank {rank}] step {BREAK - 1} loss" in text
        assert f"[rank {rank}] step {BREAK} loss" not in text
    panel = page.locator(".jp-OutputArea-output section.ddpviz-debugger").first
    page.get_by_text(re.compile(rf"paused at step {BREAK}")).first.wait_for(timeout=60_000)

    panel.locator("button[data-op=resume]").click()
    last = f"[rank 1] step {STEPS - 1} loss"
    panel_out = panel.locator("pre.ddpviz-debugger-output")
    panel_out.get_by_text(last).first.wait_for(timeout=300_000)
    got = panel_out.inner_text()
    for rank in (0, 1):  # the rest of the cell, on every rank, in the panel
        for s in range(BREAK, STEPS):
            assert f"[rank {rank}] step {s} loss" in got, got
        assert f"[rank {rank}] Out: " in got, got
    # and not in the notebook's own cell outputs
    assert f"[rank 0] step {STEPS - 1} loss" not in stream_text(page).replace(got, "")
    page.get_by_text(re.compile(r"debugger · running")).first.wait_for(timeout=60_000)
    screenshot(page, "pool_panel_resumed", page.locator(".jp-Cell-outputArea").nth(2))
    assert error_outputs(page) == []
    assert console.errors == []
