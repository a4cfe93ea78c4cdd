"""The TraceView anywidget in Jupyter Notebook 7 (`jupyter notebook` on 127.0.0.1 with a
token), in Chromium: the cell that makes the view draws the viewer's panels with the run's
numbers, and its iteration picker redraws the hook timeline in the browser.

Skipped where Notebook 7 is not installed (it is not in the test extra yet: installed beside
JupyterLab it adds its own buttons to JupyterLab's notebook toolbar, which the JupyterLab
tests have not been run against)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz.traces.trace import Trace
from tests.browser import rank_fns
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import ROOT, free_port
from tests.browser.ui import write_notebook

pytest.importorskip("notebook", minversion="7", reason="Jupyter Notebook 7 is not installed")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

# Notebook 7.6.5's own keyboard-shortcut settings code (@jupyterlab/shortcuts-extension, bundled
# in notebook_core.js) raises this on page load: on an empty notebook too, with every third-party
# extension (ddpviz's among them) disabled; gone only with that extension disabled.
NOTEBOOK7_OWN = "uncaught: Cannot read properties of undefined (reading 'schema')"
FILE = "nb7_run.ddpviz"
NAME = "nb7_view.ipynb"


class NotebookServer:
    """`jupyter notebook` serving `root` on 127.0.0.1 with a random token."""

    def __init__(self, root: Path, home: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self._log = home / "notebook.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "JUPYTER_CONFIG_DIR": str(home / "config"),
               "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "notebook", "--no-browser", "--allow-root",
             "--ServerApp.ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--ServerApp.terminals_enabled=False"],
            cwd=root, env=env, stdout=self._log.open("wb"), stderr=subprocess.STDOUT)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def wait(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise AssertionError(f"jupyter notebook exited: {self._log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise AssertionError(f"jupyter notebook did not answer in {timeout} s: "
                             f"{self._log.read_text()[-3000:]}")

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[NotebookServer, Trace]]:
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    run = ddpviz.launch(rank_fns.train, 2, args=(3, 0.01), timeout=120)
    run.wait(timeout=150)
    run.trace.save(root / FILE)
    write_notebook(root / NAME, [f"import ddpviz\nddpviz.Trace.load({FILE!r}).view()"])
    server = NotebookServer(root, home)
    try:
        server.wait()
        yield server, Trace.load(root / FILE)
    finally:
        server.close()


def test_notebook_7_draws_the_view_of_a_real_run(browser: Any, console: ConsoleLog,
                                                 served: tuple[NotebookServer, Trace]) -> None:
    server, trace = served
    context = browser.new_context(viewport={"width": 1280, "height": 1500})
    page = context.new_page()
    page.on("console", console.on_console)
    page.on("pageerror", console.on_page_error)
    try:
        page.goto(server.url(f"notebooks/{NAME}"))
        cell = page.locator(".jp-CodeCell").first
        cell.wait_for(timeout=60_000)
        widget = page.locator(".ddpviz-widget")
        # run the cell as a user does (Shift+Enter); right after the page opens the kernel may
        # not be connected yet and the keypress is lost: press again until its prompt moves
        for _ in range(10):
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
        screenshot(page, "trace_view_notebook7", widget)
        assert [e for e in console.errors if not e.startswith(NOTEBOOK7_OWN)] == []
    finally:
        context.close()
