""""Open in Perfetto" and "Save Chrome trace" in Chromium: in the JupyterLab file viewer, with no
kernel, and in the notebook dashboard (the same view, sent the run by its kernel). The button opens
ui.perfetto.dev in a new tab, waits for Perfetto's PONG and posts the run's Chrome trace JSON
to that origin only, and that JSON is Python's `to_chrome_trace()` of the same file; the saved
file is the same document; a tab closed before it loads gets nothing and the viewer says so.
ui.perfetto.dev is not reachable here: the tests serve its address with a page that speaks
Perfetto's documented handshake (PING -> PONG, then `{perfetto: {buffer, title, fileName}}`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog
from tests.browser.lab import LabServer
from tests.browser.ui import (
    double_click_file,
    error_outputs,
    open_lab,
    run_all_cells,
    wait_for_viewer,
    write_notebook,
)
from tests.extension.test_chrome_trace_mirror import as_json_reads

pytestmark = pytest.mark.browser

# Perfetto's side of the handshake: PONG to a PING from its opener, then keep what it posts
PERFETTO_PAGE = """<!doctype html><title>Perfetto UI (test)</title><script>
window.got = null;
window.pings = 0;
window.addEventListener('message', e => {
  if (e.source !== window.opener) return;
  if (e.data === 'PING') { window.pings++; e.source.postMessage('PONG', '*'); return; }
  if (e.data && e.data.perfetto) {
    const p = e.data.perfetto;
    window.got = {origin: e.origin, title: p.title, fileName: p.fileName,
                  text: new TextDecoder().decode(p.buffer)};
  }
});
</script>"""
_CLOSES = "<!doctype html><script>window.close()</script>"


def serve_perfetto(page: Any, body: str) -> None:
    page.context.route("https://ui.perfetto.dev/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body=body))


def test_open_in_perfetto_hands_over_pythons_chrome_trace(
        page: Any, lab: LabServer, console: ConsoleLog, real_trace: Trace,
        tmp_path: Path) -> None:
    serve_perfetto(page, PERFETTO_PAGE)
    open_lab(page, lab)
    double_click_file(page, "run.ddpviz")
    viewer = wait_for_viewer(page, "run.ddpviz")
    expected = as_json_reads(json.loads(json.dumps(real_trace.to_chrome_trace())))

    with page.expect_popup() as popup_info:
        viewer.locator("button.ddpviz-perfetto").click()
    perfetto = popup_info.value
    perfetto.wait_for_function("window.got !== null", timeout=30_000)
    got = perfetto.evaluate("window.got")
    assert got["title"] == "run.ddpviz" and got["fileName"] == "run.json"
    assert got["origin"] == page.evaluate("location.origin")  # the lab's page sent it
    assert as_json_reads(json.loads(got["text"])) == expected
    status = viewer.locator(".ddpviz-action-status")
    assert status.inner_text().startswith("Sent ") and "to Perfetto" in status.inner_text()

    with page.expect_download() as download_info:
        viewer.locator("button.ddpviz-save-chrome").click()
    download = download_info.value
    assert download.suggested_filename == "run.json"
    saved = tmp_path / "run.json"
    download.save_as(saved)
    assert as_json_reads(json.loads(saved.read_text())) == expected
    assert console.errors == []


def test_a_perfetto_tab_closed_before_it_loads_gets_nothing_and_the_viewer_says_so(
        page: Any, lab: LabServer, console: ConsoleLog, real_trace: Trace) -> None:
    serve_perfetto(page, _CLOSES)
    open_lab(page, lab)
    double_click_file(page, "run.ddpviz")
    viewer = wait_for_viewer(page, "run.ddpviz")
    with page.expect_popup():
        viewer.locator("button.ddpviz-perfetto").click()
    status = viewer.locator(".ddpviz-action-status.ddpviz-warning")
    status.wait_for(timeout=30_000)
    assert "closed before it loaded; nothing was sent" in status.inner_text()
    assert console.errors == []


def test_the_dashboards_button_hands_over_the_same_trace(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog,
        real_trace: Trace) -> None:
    serve_perfetto(page, PERFETTO_PAGE)
    write_notebook(lab_root / "perfetto.ipynb", [
        "import ddpviz\nboard = ddpviz.Trace.load('run.ddpviz').dashboard()\nboard"])
    open_lab(page, lab, "perfetto.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []
    button = page.locator(".jp-OutputArea-output button.ddpviz-perfetto")
    with page.expect_popup() as popup_info:
        button.click()
    perfetto = popup_info.value
    perfetto.wait_for_function("window.got !== null", timeout=60_000)
    got = perfetto.evaluate("window.got")
    # (a Trace has no file name: the view is named after its kind)
    assert got["title"] == "Trace" and got["fileName"] == "Trace.json"
    assert as_json_reads(json.loads(got["text"])) == as_json_reads(
        json.loads(json.dumps(real_trace.to_chrome_trace())))
    assert console.errors == []
