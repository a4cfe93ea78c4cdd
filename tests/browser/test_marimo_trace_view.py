"""The TraceView anywidget in marimo (`mo.ui.anywidget`), served by `marimo run` on 127.0.0.1
with a token, in Chromium: marimo renders anywidget but not ipywidgets (marimo#5099); this view
draws there, with the same panels and text as JupyterLab's file viewer draws for the same file
(tests/browser/test_lab_trace_view.py), and so does the notebook dashboard, the same anywidget,
whose replay moves in the page;
and a live Session's view follows it (new events from a kernel thread reach the page)."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
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
    return mo, trace


@app.cell
def _(mo, trace):
    board = mo.ui.anywidget(trace.dashboard(name="marimo_board.ddpviz"))
    board
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
        widget = _named(page, "marimo_run.ddpviz")
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


LIVE_APP = '''import marimo

app = marimo.App()


@app.cell
def _():
    import os
    import threading
    import time

    import marimo as mo

    import ddpviz
    from ddpviz.transport.sender import Sender
    from ddpviz.widgets.trace_view import TraceView
    from tests.widgets.streams import synthetic_run

    events = synthetic_run(2, steps=6)
    per = {{r: [e for e in events if e.rank == r] for r in (0, 1)}}
    session = ddpviz.listen(show=False)
    senders = {{r: Sender(session.connect_string, r, batch=64) for r in per}}

    def send(part):
        for r, es in per.items():
            half = len(es) // 2
            for e in (es[:half] if part == 0 else es[half:]):
                senders[r](e)
            senders[r].flush()

    send(0)
    while len(session.trace) < sum(len(es) // 2 for es in per.values()):
        time.sleep(0.05)

    def later():  # the second half, from a thread, once the test says go
        while not os.path.exists({go!r}):
            time.sleep(0.05)
        send(1)
        time.sleep(2)
        session.close()

    threading.Thread(target=later, daemon=True).start()
    view = mo.ui.anywidget(TraceView(session, name="live"))
    view
    return


if __name__ == "__main__":
    app.run()
'''


def test_marimo_follows_a_live_session(browser: Any, console: ConsoleLog, tmp_path: Path
                                       ) -> None:
    """A live Session's view in marimo gets the new events a kernel thread sends after the
    cell ran (marimo forwards a thread's anywidget messages), up to the session's end."""
    go = tmp_path / "go"
    app = tmp_path / "live_app.py"
    app.write_text(LIVE_APP.format(go=str(go)))
    server = MarimoServer(app, tmp_path / "marimo.log")
    try:
        server.wait(f"http://127.0.0.1:{server.port}/health")
        with logged_page(browser, console) as page:
            page.goto(server.url)
            widget = page.locator(".ddpviz-widget")
            widget.locator(".ddpviz-summary").wait_for(timeout=120_000)
            assert widget.locator(".ddpviz-live").get_attribute("data-live") == "running"
            before = int(widget.get_attribute("data-events") or 0)
            assert before > 0
            go.write_text("go")
            page.locator(".ddpviz-widget .ddpviz-live[data-live='closed']").wait_for(
                timeout=60_000)
            from tests.widgets.streams import synthetic_run

            total = len(synthetic_run(2, steps=6))
            assert before < total
            page.wait_for_function(f"el => el.getAttribute('data-events') === '{total}'",
                                   arg=widget.element_handle(), timeout=30_000)
            assert console.errors == []
    finally:
        server.close()


def _named(page: Any, name: str) -> Any:
    """The view whose title is `name` (the app draws a TraceView and a Dashboard)."""
    return page.locator(".ddpviz-widget").filter(
        has=page.locator(".ddpviz-summary h2", has_text=name))


def test_marimo_draws_the_dashboard_and_its_replay_answers_in_the_browser(
        browser: Any, console: ConsoleLog, marimo_app: tuple[MarimoServer, Trace]) -> None:
    """The notebook dashboard is the same anywidget (a TraceView): marimo draws it, with its
    replay bar and verification matrix, and moving the replay redraws it in the page."""
    server, trace = marimo_app
    with logged_page(browser, console) as page:
        page.goto(server.url)
        board = _named(page, "marimo_board.ddpviz")
        board.locator(".ddpviz-summary").wait_for(timeout=120_000)
        assert board.locator(".ddpviz-verdict").get_attribute("data-verdict") == "healthy"
        matrix = board.locator("table.ddpviz-vm")
        assert matrix.locator("th[data-count]").count() == len(trace.ranks) == 2
        assert matrix.locator("td[data-status=same]").count() == 2 * len(
            trace.of_type(ev.ParamsBuilt)[0].params)
        panels = board.locator(".ddpviz-panels")
        before = panels.get_attribute("data-as-of")
        board.locator("input.ddpviz-replay-time").fill("0")  # the run's first instant
        page.wait_for_function(
            "([el, before]) => el.dataset.asOf !== before",
            arg=[panels.element_handle(), before], timeout=10_000)
        assert board.locator("input.ddpviz-replay-step").input_value() == "-1"  # constructor
        assert console.errors == []
