"""The TraceView anywidget in marimo (`mo.ui.anywidget`), served by `marimo run` on 127.0.0.1
with a token, in Chromium: marimo renders anywidget but not ipywidgets (marimo#5099), so the
dashboard's ipywidgets panels never draw there; this view does, with the same panels and text
as JupyterLab's file viewer draws for the same file (tests/browser/test_lab_trace_view.py)."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import ROOT, free_port
from tests.browser.served import ServedProcess, logged_page

pytest.importorskip("marimo", reason="the test extra (pip install -e '.[test]')")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

APP = '''import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo

    from ddpviz.traces.trace import Trace

    trace = Trace.load({path!r})
    view = mo.ui.anywidget(trace.view(name="marimo_run.ddpviz"))
    view
    return


if __name__ == "__main__":
    app.run()
'''


class MarimoServer(ServedProcess):
    """`marimo run APP` on 127.0.0.1 with a random token; `url` includes it."""

    def __init__(self, app: Path, log: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/?access_token={self.token}"
        super().__init__(
            "marimo run",
            [sys.executable, "-m", "marimo", "run", str(app), "--headless", "--host",
             "127.0.0.1", "--port", str(self.port), "--token", "--token-password",
             self.token, "--no-sandbox"],
            cwd=app.parent, log=log,
            env={**os.environ, "PYTHONPATH": str(ROOT), "MARIMO_SKIP_UPDATE_CHECK": "1"})


@pytest.fixture
def marimo_app(tmp_path: Path, lab_root: Path, real_trace: Trace
               ) -> Iterator[tuple[MarimoServer, Trace]]:
    app = tmp_path / "app.py"
    app.write_text(APP.format(path=str(lab_root / "run.ddpviz")))  # conftest.real_trace
    server = MarimoServer(app, tmp_path / "marimo.log")
    try:
        server.wait(f"http://127.0.0.1:{server.port}/health")
        yield server, real_trace
    finally:
        server.close()


def test_marimo_draws_the_view_of_a_real_run(browser: Any, console: ConsoleLog,
                                              marimo_app: tuple[MarimoServer, Trace]) -> None:
    server, trace = marimo_app
    with logged_page(browser, console) as page:
        page.goto(server.url)
        widget = page.locator(".ddpviz-widget")
        widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
        summary = widget.locator(".ddpviz-summary")
        assert summary.get_attribute("data-ranks") == str(len(trace.ranks)) == "2"
        assert summary.get_attribute("data-events") == str(len(trace))
        assert widget.locator(".ddpviz-summary h2").inner_text() == "marimo_run.ddpviz"
        kinds = [el.get_attribute("data-section")
                 for el in widget.locator("[data-section]").all()]
        assert {"verdict", "summary", "buckets", "timeline"} <= set(kinds), kinds
        verdict = widget.locator(".ddpviz-verdict")  # diagnose()'s, computed in the kernel
        assert verdict.get_attribute("data-scope") == "diagnose"
        assert verdict.get_attribute("data-verdict") == "healthy"
        # the picker redraws in the browser
        select = widget.locator(".ddpviz-step-select")
        steps = [o.get_attribute("value") for o in select.locator("option").all()]
        holder = widget.locator(".ddpviz-timeline-holder")
        before = holder.inner_html()
        select.select_option(steps[0])
        page.wait_for_function("([el, before]) => el.innerHTML !== before",
                               arg=[holder.element_handle(), before], timeout=10_000)
        screenshot(page, "trace_view_marimo", widget)
        assert console.errors == []
