"""The TraceView anywidget in Jupyter Notebook 7 (`jupyter notebook` on 127.0.0.1 with a
token), in Chromium: the cell that makes the view (`trace.view()`, or the notebook dashboard,
the same anywidget) draws the viewer's panels with the run's numbers, its iteration picker
redraws the hook timeline and its replay bar every panel, in the browser.

Notebook 7 is in the test extra. Installed beside JupyterLab it adds its own buttons to
JupyterLab's notebook toolbar; every JupyterLab browser test passed with it installed (33 of 33,
2026-11-29). Skipped where it is not installed."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import ROOT, free_port
from tests.browser.served import ServedProcess, logged_page
from tests.browser.ui import write_notebook

pytest.importorskip("notebook", minversion="7", reason="Jupyter Notebook 7 is not installed")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

# Notebook 7.6.5's own keyboard-shortcut settings code (@jupyterlab/shortcuts-extension, bundled
# in notebook_core.js) raises this on page load: on an empty notebook too, with every third-party
# extension (ddpviz's among them) disabled; gone only with that extension disabled.
NOTEBOOK7_OWN = "uncaught: Cannot read properties of undefined (reading 'schema')"
FILE = "nb7_run.ddpviz"
NAME = "nb7_view.ipynb"


class NotebookServer(ServedProcess):
    """`jupyter notebook` serving `root` on 127.0.0.1 with a random token."""

    def __init__(self, root: Path, home: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "JUPYTER_CONFIG_DIR": str(home / "config"),
               "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
        super().__init__(
            "jupyter notebook",
            [sys.executable, "-m", "jupyter", "notebook", "--no-browser", "--allow-root",
             "--ServerApp.ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--ServerApp.terminals_enabled=False"],
            cwd=root, env=env, log=home / "notebook.log")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"


@pytest.fixture(params=["view", "dashboard"])
def served(request: pytest.FixtureRequest, tmp_path: Path, lab_root: Path, real_trace: Trace
           ) -> Iterator[tuple[NotebookServer, Trace]]:
    """The notebook's one cell shows the run as `trace.view()`, or as the notebook dashboard
    (the same anywidget, with its replay bar)."""
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    shutil.copy2(lab_root / "run.ddpviz", root / FILE)  # conftest.real_trace
    write_notebook(root / NAME, [f"import ddpviz\nddpviz.Trace.load({FILE!r}).{request.param}()"])
    server = NotebookServer(root, home)
    try:
        server.wait(server.url("api/status"))
        yield server, real_trace
    finally:
        server.close()


def _answer_kernel_choice(page: Any) -> None:
    """A Shift+Enter pressed before the kernel is connected opens Notebook 7's "Select Kernel"
    dialog, which then covers the cell: choose its default (the notebook's own kernel), as a
    user does. Any other dialog fails the test with its text."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() == 0:
        return
    text = dialog.first.inner_text()
    if "Select Kernel" not in text:
        raise AssertionError(f"Notebook 7 shows a dialog: {text!r}")
    dialog.first.locator(".jp-Dialog-button.jp-mod-accept").click()
    dialog.first.wait_for(state="detached", timeout=10_000)


def test_notebook_7_draws_the_view_of_a_real_run(browser: Any, console: ConsoleLog,
                                                 served: tuple[NotebookServer, Trace]) -> None:
    server, trace = served
    with logged_page(browser, console) as page:
        page.goto(server.url(f"notebooks/{NAME}"))
        cell = page.locator(".jp-CodeCell").first
        cell.wait_for(timeout=60_000)
        widget = page.locator(".ddpviz-widget")
        # run the cell as a user does (Shift+Enter); right after the page opens the kernel may
        # not be connected yet and the keypress is lost: press again until its prompt moves
        for _ in range(10):
            _answer_kernel_choice(page)
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            try:
                cell.locator(".jp-InputPrompt").get_by_text("[1]:").wait_for(timeout=8_000)
                break
            except Exception:  # playwright's TimeoutError: not run yet
                continue
        widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
        summary = widget.locator(".ddpviz-summary")
        assert summary.get_attribute("data-ranks") == str(len(trace.ranks)) == "2"
        assert summary.get_attribute("data-events") == str(len(trace))
        assert widget.locator(".ddpviz-verdict").get_attribute("data-scope") == "diagnose"
        select = widget.locator(".ddpviz-step-select")
        steps = [o.get_attribute("value") for o in select.locator("option").all()]
        holder = widget.locator(".ddpviz-timeline-holder")
        before = holder.inner_html()
        select.select_option(steps[0])
        page.wait_for_function("([el, before]) => el.innerHTML !== before",
                               arg=[holder.element_handle(), before], timeout=10_000)
        assert widget.locator(".ddpviz-replay").count() == 1  # every view's: move it here
        panels = widget.locator(".ddpviz-panels")
        at = panels.get_attribute("data-as-of")
        widget.locator("input.ddpviz-replay-time").fill("0")
        page.wait_for_function("([el, at]) => el.dataset.asOf !== at",
                               arg=[panels.element_handle(), at], timeout=10_000)
        screenshot(page, "trace_view_notebook7", widget)
        assert [e for e in console.errors if not e.startswith(NOTEBOOK7_OWN)] == []
