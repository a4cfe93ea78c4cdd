"""A shared trace must never run script: one whose every string field carries script and
markup payloads (tests/security/hostile.py) opens in the replay dashboard of a notebook (each
iteration of its replay bar drawn), in the
HTML report (its static sections and its interactive view) and in the JupyterLab trace
viewer, and in none of them does the payload run (`window.__ddpviz_pwned` stays undefined, no
alert dialog opens); the payload shows as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpviz.report import html as report
from tests.browser.conftest import ConsoleLog
from tests.browser.lab import LabServer
from tests.browser.ui import (
    error_outputs,
    open_lab,
    run_all_cells,
    wait_for_viewer,
    write_notebook,
)
from tests.security.hostile import PAYLOAD, hostile_trace

pytestmark = pytest.mark.browser

NAME = "hostile.ddpviz"


@pytest.fixture(scope="module")
def hostile(lab_root: Path) -> Path:
    from ddpviz import events as ev
    from ddpviz.findings import Finding

    trace = hostile_trace()
    # a replica divergence whose tensor names and norms are payloads: the replica panel's
    # rows, cells and hover texts
    trace.extend([ev.FindingReported(0, 2, 10**9, 10**6, Finding(
        kind="replicas_diverged", severity="error", title=PAYLOAD, step=2, world_size=3,
        tensors=((PAYLOAD + "w", ((PAYLOAD + "norm 1", ((0, 1),)),
                                  (PAYLOAD + "norm 2", ((2, 2),)))),)))])
    return trace.save(lab_root / NAME)


def _dialogs(page: Any) -> list[str]:
    seen: list[str] = []

    def on_dialog(dialog: Any) -> None:
        seen.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return seen


def _pwned(page: Any) -> object:
    return page.evaluate("() => window.__ddpviz_pwned")


def test_the_report_shows_the_payloads_as_text(page: Any, hostile: Path,
                                               tmp_path: Path) -> None:
    dialogs = _dialogs(page)
    from ddpviz.traces.trace import Trace

    out = report.write_report(Trace.load(hostile), tmp_path / "report.html")
    page.goto(out.as_uri())
    page.wait_for_selector("#timeline")
    page.wait_for_selector("#ddpviz-view .ddpviz-trace")  # the interactive view drew too
    page.wait_for_timeout(500)  # an img onerror fires once the image fails to load
    assert _pwned(page) is None and dialogs == []
    # the page's only scripts: the run as data (never run) and ddpviz's own bundle
    assert page.eval_on_selector_all("script", "s => s.map(e => e.type)") == [
        "application/octet-stream", "application/octet-stream", "application/octet-stream",
        "module"]
    assert page.locator("img").count() == 0
    assert "<script>window.__ddpviz_pwned" in page.locator("body").inner_text()
    # ... and as text in the interactive view's findings, as diagnose() gave them
    assert "<script>window.__ddpviz_pwned" in page.locator(
        "#ddpviz-view [data-section=findings]").inner_text()
    # ... and in the replica panel (the tensor's name, as diagnose() gave it)
    assert "<script>window.__ddpviz_pwned" in page.locator(
        "#ddpviz-view [data-section=replicas] tbody").inner_text()


def test_the_trace_viewer_shows_the_payloads_as_text(
        page: Any, lab: LabServer, hostile: Path, console: ConsoleLog) -> None:
    dialogs = _dialogs(page)
    open_lab(page, lab, NAME)
    viewer = wait_for_viewer(page, NAME)
    page.wait_for_timeout(500)
    assert _pwned(page) is None and dialogs == []
    assert viewer.locator("script, img").count() == 0
    assert "<script>window.__ddpviz_pwned" in viewer.inner_text()
    for kind in ("buckets", "verification", "broadcast", "findings", "replicas", "advice"):
        assert viewer.locator(f"[data-section='{kind}']").count() == 1, kind
    replicas = viewer.locator("[data-section='replicas'] tbody")
    assert "<script>window.__ddpviz_pwned" in replicas.inner_text()
    assert replicas.locator("td[title^='<script>window.__ddpviz_pwned']").count() == 3


def test_the_dashboard_in_a_notebook_shows_the_payloads_as_text(
        page: Any, lab: LabServer, lab_root: Path, hostile: Path) -> None:
    write_notebook(lab_root / "hostile.ipynb", [
        "from ddpviz.traces.trace import Trace\n"
        f"dash = Trace.load({NAME!r}).dashboard()\n"
        "dash"])
    dialogs = _dialogs(page)
    open_lab(page, lab, "hostile.ipynb")
    run_all_cells(page)
    assert error_outputs(page) == []
    output = page.locator(".jp-OutputArea-output").last
    output.locator(".ddpviz-widget .ddpviz-summary").first.wait_for(timeout=120_000)
    # every iteration the replay bar offers, drawn in turn (the panels drawn again from it)
    step = output.locator("input.ddpviz-replay-step")
    low, high = int(step.get_attribute("min")), int(step.get_attribute("max"))
    assert high > low
    for value in range(low, high + 1):
        step.fill(str(value))
        page.wait_for_timeout(200)
    page.wait_for_timeout(1000)
    assert _pwned(page) is None and dialogs == []
    assert output.locator("script, img").count() == 0
    assert "<script>window.__ddpviz_pwned" in output.inner_text()


def test_the_viewer_draws_100000_ranks_and_skips_a_malformed_event(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    """No spread of huge arrays into calls (stack overflow) and no panel left blank by an event
    of the wrong shape: it is counted and named in a warning, the rest is drawn."""
    from ddpviz import events as ev
    from ddpviz.traces.fileformat import TraceWriter

    n = 100_000
    name = "many_ranks.ddpviz"
    with TraceWriter(lab_root / name) as w:
        w.write_many([ev.VerificationPassed(r, -1, 1_000 + r, 0, n, "d") for r in range(n)])
        w.write_many([ev.BroadcastStarted(r, -1, 2_000 + r, 1, 0, 1, 8, 1)
                      for r in range(0, n, 997)])
        # a bucket map whose parameter indices are strings: Python's loader refuses the file,
        # the viewer must skip just this event
        w.write(ev.BucketAssigned(0, -1, 3_000, 2, (("not an index",),), (1,), False))
    open_lab(page, lab, name)
    # 100,000 rows: wait on one selector, then read the page with one script (locator
    # filters over a DOM this large take minutes on a loaded machine)
    page.wait_for_selector(f".ddpviz-summary[data-ranks='{n}']", timeout=300_000)
    got = page.evaluate("""() => {
        const v = document.querySelector('.ddpviz-summary').closest('.ddpviz-trace');
        const q = s => v.querySelectorAll(s).length;
        // rows of ranks grouped by outcome carry how many ranks they stand for
        const ranks = s => [...v.querySelectorAll(s)].reduce(
            (n, e) => n + Number(e.getAttribute('data-count')), 0);
        return {summary: v.querySelector('.ddpviz-summary').innerText,
                verification: ranks("[data-section='verification'] tbody tr"),
                warnings: q('.ddpviz-warning'),
                broadcast: ranks("[data-section='broadcast'] .ddpviz-progress-row"),
                pwned: window.__ddpviz_pwned === undefined ? null : 1};
    }""")
    assert "1 events did not match" in got["summary"]
    assert "BucketAssigned.buckets" in got["summary"]
    assert got["verification"] == n  # every rank in a row (grouped): the panel is not blank
    assert got["broadcast"] == len(range(0, n, 997))
    assert got["pwned"] is None
    assert console.errors == []
