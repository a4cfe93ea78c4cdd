"""The ddpviz trace viewer in real JupyterLab in Chromium, no kernel involved: a trace recorded
from 2 real ranks opens from the file browser and every number it shows equals what Python's
`ddpviz.Trace` reads from the same file; a trace with a failed verification, a finding, an
unfinished broadcast and a torn last frame opens through the 'Open ddpviz trace' command and
says so; 'New DDP debugging notebook' from the launcher runs and its saved trace opens. The
viewer honours the settings (colour scheme, event limit); the console stays clean."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from ddpviz import events as ev
from ddpviz.findings import Finding
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import SETTINGS, LabServer
from tests.browser.ui import (
    double_click_file,
    error_outputs,
    open_lab,
    run_all_cells,
    stream_text,
    wait_for_viewer,
)

pytestmark = pytest.mark.browser

OKABE_ITO_0 = "rgb(0, 114, 178)"  # first colour of the scheme the test settings choose
MAX_EVENTS = SETTINGS["ddpviz:plugin"]["maxEvents"]


def param_bytes(info: ev.ParamInfo) -> int:
    numel = 1
    for n in info.shape:
        numel *= n
    return numel * getattr(torch, info.dtype).itemsize


def attr(locator: Any, name: str) -> str:
    value: str = locator.get_attribute(name)
    return value


def test_real_trace_opens_from_the_file_browser_and_matches_python(
        page: Any, lab: LabServer, console: ConsoleLog, real_trace: Trace) -> None:
    trace = real_trace
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab)
    double_click_file(page, "run.ddpviz")
    viewer = wait_for_viewer(page, "run.ddpviz")

    verdict = viewer.locator(".ddpviz-verdict")  # first, before the summary
    assert attr(verdict, "data-verdict") == "healthy"
    assert verdict.inner_text().startswith("no problems reported by the ranks.")
    assert "ddpviz diagnose" in verdict.inner_text()
    summary = viewer.locator(".ddpviz-summary")
    assert attr(summary, "data-ranks") == str(len(trace.ranks)) == "2"
    assert attr(summary, "data-events") == str(len(trace))

    # bucket maps: one group per distinct map, ranks that share it, bucket sizes in bytes
    params = trace.of_type(ev.ParamsBuilt, rank=0)[0].params  # type: ignore[attr-defined]
    nbytes = {p.index: param_bytes(p) for p in params}
    expected_maps: dict[tuple[bool, tuple[tuple[int, ...], ...]], list[int]] = {}
    for e in trace.of_type(ev.BucketAssigned):
        expected_maps.setdefault((e.rebuilt, e.buckets), []).append(e.rank)  # type: ignore[attr-defined]
    shown = viewer.locator(".ddpviz-bucketmap")
    assert shown.count() == len(expected_maps) == 2  # the constructor's map and the rebuild
    for i, ((rebuilt, buckets), ranks) in enumerate(expected_maps.items()):
        group = shown.nth(i)
        assert attr(group, "data-rebuilt") == str(rebuilt).lower()
        assert attr(group, "data-ranks") == ",".join(map(str, sorted(ranks)))
        cells = group.locator(".ddpviz-bucket")
        assert cells.count() == len(buckets)
        for b, indices in enumerate(buckets):
            assert attr(cells.nth(b), "data-params") == str(len(indices))
            assert attr(cells.nth(b), "data-bytes") == str(sum(nbytes[i] for i in indices))
            segments = cells.nth(b).locator(".ddpviz-param")
            assert [int(attr(segments.nth(k), "data-param")) for k in range(len(indices))] \
                == list(indices)
    first_segment = viewer.locator(".ddpviz-param").first
    assert first_segment.evaluate("e => e.style.background") == OKABE_ITO_0

    # verification: every rank passed with the same digest
    for rank in trace.ranks:
        passed = trace.of_type(ev.VerificationPassed, rank=rank)
        assert len(passed) == 1
        row = viewer.locator(f".ddpviz-verification tr[data-rank='{rank}']")
        assert attr(row, "data-status") == "passed"
        assert passed[0].digest[:16] in row.inner_text()  # type: ignore[attr-defined]

    # broadcast: every byte of rank 0's state arrived on every rank
    for rank in trace.ranks:
        started = trace.of_type(ev.BroadcastStarted, rank=rank)[0]
        row = viewer.locator(f".ddpviz-progress-row[data-rank='{rank}']")
        assert attr(row, "data-total") == str(started.total_bytes)  # type: ignore[attr-defined]
        assert attr(row, "data-done") == str(started.total_bytes)  # type: ignore[attr-defined]
        assert row.locator("progress").evaluate("p => p.value === p.max")

    # hook timeline: the last iteration first, then iteration 0 on request
    steps = sorted({e.step for e in trace.of_type(ev.GradReady)})
    assert steps == [0, 1, 2]
    select = viewer.locator(".ddpviz-step-select")
    for step in (steps[-1], 0):
        select.select_option(str(step))
        svg = viewer.locator("svg.ddpviz-timeline")
        assert attr(svg, "data-step") == str(step)
        grads = [e for e in trace.of_type(ev.GradReady) if e.step == step]
        done = [e for e in trace.of_type(ev.AllReduceDone) if e.step == step]
        assert attr(svg, "data-grads") == str(len(grads)) == str(2 * len(params))
        assert attr(svg, "data-allreduces") == str(len(done))
        assert svg.locator("line.ddpviz-grad").count() == len(grads)
        assert svg.locator("rect.ddpviz-allreduce").count() == len(done)
    select.select_option(str(steps[-1]))

    # event counts per rank and type
    for rank in trace.ranks:
        counts = Counter(type(e).__name__ for e in trace.events(rank))
        column = trace.ranks.index(rank) + 2  # after the event-name header cell
        for name, n in counts.items():
            cell = viewer.locator(f".ddpviz-counts tr[data-type='{name}'] > :nth-child({column})")
            assert cell.inner_text() == str(n)

    screenshot(page, "trace_viewer", page.locator("#jp-main-dock-panel"))
    assert console.errors == []


def write_failed_trace(path: Path) -> Trace:
    """Two ranks that disagree on a parameter's shape: verification fails on both, a finding
    says so, rank 0's broadcast never finishes, one backward with many hooks, then the file
    ends in a torn frame (a writer killed mid-write)."""
    infos = {r: (ev.ParamInfo(0, "fc.bias", (4,), "float32", "cpu", False),
                 ev.ParamInfo(1, "fc.weight", (4, 8) if r == 0 else (8, 4), "float32", "cpu",
                              False)) for r in (0, 1)}
    values = (("(4, 8)", (0,)), ("(8, 4)", (1,)))
    mismatch = ev.Mismatch("param", 1, "fc.weight", "shape", values)
    finding = Finding(kind="param_mismatch", severity="error",
                      title="parameter 1 'fc.weight' differs across ranks", ranks=(1,), param=1,
                      name="fc.weight", field="shape", values=values,
                      fix="All ranks must build the same model.", world_size=2)
    with TraceWriter(path, meta={"source": "test"}) as w:
        for r in (0, 1):
            seq = iter(range(10_000))
            t = 1_000_000 * (r + 1)
            w.write_many([
                ev.ParamsBuilt(r, -1, t, next(seq), infos[r], (), ()),
                ev.VerificationStarted(r, -1, t + 10, next(seq), 2, 2, 0),
                ev.VerificationFailed(r, -1, t + 20, next(seq), 2, (mismatch,)),
                ev.FindingReported(r, -1, t + 30, next(seq), finding),
                ev.BucketAssigned(r, -1, t + 40, next(seq), ((1, 0),), (26214400,), False),
                ev.BackwardStarted(r, 0, t + 100, next(seq)),
                *[ev.GradReady(r, 0, t + 200 + 10 * k, next(seq), k % 2, 0) for k in range(300)],
                ev.AllReduceLaunched(r, 0, t + 3300, next(seq), 0, 160, "float32"),
            ])
            if r == 0:
                w.write(ev.BroadcastStarted(0, -1, t + 50, next(seq), 0, 2, 160, 1))
    with open(path, "ab") as f:  # a frame header promising 100 bytes, then only 10
        f.write(struct.pack("<BII", 2, 100, 0) + b"\x91" * 10)
    with pytest.warns(UserWarning, match="torn frame"):
        return Trace.load(path)


def test_failed_verification_finding_and_torn_file_via_the_open_command(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    trace = write_failed_trace(lab_root / "mismatch.ddpviz")
    assert trace.truncated and len(trace) == 2 * 307 + 1

    open_lab(page, lab)
    page.keyboard.press("Control+Shift+c")  # the command palette
    page.locator(".lm-CommandPalette-input").fill("Open ddpviz trace")
    page.locator(".lm-CommandPalette-item[data-command='ddpviz:open-trace']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator(".jp-DirListing-item", has=page.locator(
        ".jp-DirListing-itemText span:text-is('mismatch.ddpviz')")).click()
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    viewer = wait_for_viewer(page, "mismatch.ddpviz")

    assert attr(viewer.locator(".ddpviz-summary"), "data-events") == str(len(trace))
    assert "torn frame" in viewer.locator(".ddpviz-summary .ddpviz-warning").inner_text()
    for rank in (0, 1):
        row = viewer.locator(f".ddpviz-verification tr[data-rank='{rank}']")
        assert attr(row, "data-status") == "failed"
        assert row.locator("td").nth(5).inner_text() == "1 mismatch"
    assert viewer.locator(".ddpviz-mismatch").all_inner_texts() == [
        "param 1 'fc.weight' differs in shape:\n  rank 0: (4, 8)\n  rank 1: (8, 4)"]
    # the verdict leads, as diagnose's and the report's do
    verdict = viewer.locator(".ddpviz-verdict")
    assert attr(verdict, "data-verdict") == "errors"
    assert verdict.inner_text().startswith("errors: 1 error.")
    finding = viewer.locator(".ddpviz-finding")
    assert finding.count() == 1  # both ranks reported it: shown once
    assert attr(finding, "data-severity") == "error"
    assert "parameter 1 'fc.weight' differs across ranks (rank 1)" in finding.inner_text()
    assert "All ranks must build the same model." in finding.inner_text()
    broadcast = viewer.locator(".ddpviz-progress-row[data-rank='0']")
    assert attr(broadcast, "data-done") == "0" and "unfinished" in broadcast.inner_text()

    # 2 x (1 backward + 300 hooks + 1 all-reduce never completed) marks > maxEvents
    svg = viewer.locator("svg.ddpviz-timeline")
    caption = viewer.locator(".ddpviz-timeline-holder .ddpviz-note").inner_text()
    assert f"Showing {MAX_EVENTS} of 604 marks" in caption
    drawn = (svg.locator("line.ddpviz-grad").count() + svg.locator("rect.ddpviz-allreduce").count()
             + svg.locator("rect.ddpviz-phase").count())
    assert drawn == MAX_EVENTS
    assert svg.locator(".ddpviz-unfinished").count() > 0  # backward and all-reduce never ended
    screenshot(page, "trace_viewer_mismatch", page.locator("#jp-main-dock-panel"))

    # not a trace at all: the viewer says what is wrong and what to do, as Trace.load does
    (lab_root / "notes.ddpviz").write_bytes(b"just some notes\n")
    page.locator(".jp-BreadCrumbs-home").click()  # refreshes the listing
    double_click_file(page, "notes.ddpviz")
    error = page.locator(".ddpviz-viewer:visible .ddpviz-error")
    error.wait_for()
    assert error.inner_text() == (
        "ddpviz: 'notes.ddpviz' is not a ddpviz trace (no DDPVIZ magic at its start).\n"
        "Open a file written by Trace.save, TraceWriter or ddpviz.connect().")
    assert console.errors == []


def test_new_ddp_debugging_notebook_from_the_launcher_runs_and_its_trace_opens(
        page: Any, lab: LabServer, lab_root: Path, console: ConsoleLog) -> None:
    open_lab(page, lab)
    page.locator(".jp-LauncherCard[data-category='ddpviz']",
                 has_text="DDP debugging notebook").click()
    page.locator(".jp-NotebookPanel:visible").wait_for()
    assert page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").inner_text() \
        .startswith("ddp-debugging")
    assert (lab_root / "ddp-debugging.ipynb").exists()

    run_all_cells(page)
    assert error_outputs(page) == []
    text = stream_text(page)
    assert "final loss per rank" in text
    assert "saved ddp_run.ddpviz" in text
    plot = page.locator(".jp-NotebookPanel:visible .js-plotly-plot")
    # plotly draws the figure's traces after its div is attached (an anywidget render, later
    # under load): wait for the first point; a trace's points are drawn together
    plot.locator("g.point").first.wait_for()
    assert plot.locator("g.point").count() == 6  # the template's MLP: 6 parameters
    plot.scroll_into_view_if_needed()
    screenshot(page, "ddp_debugging_notebook", page.locator("#jp-main-dock-panel"))

    saved = Trace.load(lab_root / "ddp_run.ddpviz")
    page.locator(".jp-DirListing-item", has=page.locator(
        ".jp-DirListing-itemText span:text-is('ddp_run.ddpviz')")).wait_for()
    double_click_file(page, "ddp_run.ddpviz")
    viewer = wait_for_viewer(page, "ddp_run.ddpviz")
    assert attr(viewer.locator(".ddpviz-summary"), "data-events") == str(len(saved))
    assert viewer.locator(".ddpviz-verification tr[data-status='passed']").count() == 2
    assert console.errors == []
