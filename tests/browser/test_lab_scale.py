"""The trace viewer at 256 ranks in real JupyterLab in Chromium: a synthetic 256-rank trace
(one rank much slower per hook, one with its hooks swapped) opens from the file browser with
ranks grouped (verification, broadcast, event counts) and the hook timeline as a distribution
whose slowest ranks are the ones Python computes from the same file; picking a rank draws its
lane. Prints how long the open took and the longest main-thread task (no timing is asserted;
docs/scale.md's numbers come from this test)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import double_click_file, open_lab, wait_for_viewer
from tests.widgets.streams import Plant, synthetic_run

pytestmark = pytest.mark.browser

RANKS, PARAMS, STEPS = 256, 100, 5
SLOW = 77  # its gradient hooks take 30 us longer each

# Every main-thread task over 50 ms that Chromium reports (the Long Tasks API), from page load.
LONG_TASKS = """
window.__ddpvizLongTasks = [];
new PerformanceObserver(list => {
  for (const e of list.getEntries()) { window.__ddpvizLongTasks.push(e.duration); }
}).observe({ type: 'longtask', buffered: true });
"""


@pytest.fixture(scope="module")
def big_trace(lab_root: Path) -> Trace:
    events = synthetic_run(RANKS, PARAMS, STEPS, plant=Plant(slow={SLOW: 30}))
    Trace(events).save(lab_root / "scale256.ddpviz")
    return Trace.load(lab_root / "scale256.ddpviz")


def attr(locator: Any, name: str) -> str:
    value: str = locator.get_attribute(name)
    return value


def test_a_256_rank_trace_opens_grouped_with_the_slowest_ranks_named(
        page: Any, lab: LabServer, console: ConsoleLog, big_trace: Trace) -> None:
    trace = big_trace
    page.set_viewport_size({"width": 1280, "height": 1500})
    page.add_init_script(LONG_TASKS)
    open_lab(page, lab)
    page.evaluate("window.__ddpvizLongTasks.length = 0")  # only what the open costs
    t = time.perf_counter()
    double_click_file(page, "scale256.ddpviz")
    viewer = wait_for_viewer(page, "scale256.ddpviz")
    viewer.locator("svg.ddpviz-timeline").wait_for()
    opened = time.perf_counter() - t
    # The page answers right after: a round trip through its event loop.
    t = time.perf_counter()
    page.evaluate("new Promise(r => setTimeout(r, 0))")
    answered = time.perf_counter() - t
    long_tasks = page.evaluate("window.__ddpvizLongTasks")
    print(f"\n256-rank trace ({len(trace):,} events, "
          f"{(Path(lab.root) / 'scale256.ddpviz').stat().st_size / 1e6:.1f} MB): opened in "
          f"{opened:.2f} s; longest main-thread task {max(long_tasks, default=0):.0f} ms "
          f"({len(long_tasks)} over 50 ms); event loop answered in {answered * 1e3:.0f} ms")

    summary = viewer.locator(".ddpviz-summary")
    assert attr(summary, "data-ranks") == "256" and attr(summary, "data-events") == str(
        len(trace))
    # verification: every rank passed with the same digest -> one grouped row
    rows = viewer.locator(".ddpviz-verification table.ddpviz-table tbody tr")
    assert attr(viewer.locator(".ddpviz-verification table.ddpviz-table"),
                "data-grouped") == "true"
    assert rows.count() == 1
    assert attr(rows.nth(0), "data-ranks") == "0-255 (256)"
    assert attr(rows.nth(0), "data-status") == "passed"
    # and the parameter x rank matrix: the 256 ranks that agree are one column
    matrix = viewer.locator(".ddpviz-verification table.ddpviz-vm")
    assert attr(matrix, "data-grouped") == "true"
    columns = matrix.locator("th[data-count]")
    assert columns.count() == 1 and attr(columns.nth(0), "data-count") == "256"
    # broadcast: the sender and the receivers, every rank counted once
    bars = viewer.locator(".ddpviz-broadcast .ddpviz-progress-row")
    counts = [int(attr(bars.nth(i), "data-count")) for i in range(bars.count())]
    assert sum(counts) == 256 and sorted(counts) == [1, 255]
    assert "Done across 256 ranks: min 100%" in viewer.locator(
        ".ddpviz-broadcast-summary").inner_text()
    # the timeline of the last iteration: the slowest ranks, as Python computes them
    last_step = STEPS - 1
    ends: dict[int, int] = {}
    for e in trace.of_type(ev.GradReady):
        if e.step == last_step:
            ends[e.rank] = max(ends.get(e.rank, 0), e.t_ns)
    expected = sorted(ends, key=lambda r: (-ends[r], r))[:5]
    assert expected[0] == SLOW
    slowest = viewer.locator(".ddpviz-slowest")
    assert attr(slowest, "data-ranks") == ",".join(map(str, expected))
    assert f"Slowest: rank {SLOW} (+" in slowest.inner_text()
    svg = viewer.locator("svg.ddpviz-timeline")
    assert viewer.locator(".ddpviz-lane-label").all_text_contents() == ["256 ranks",
                                                                      f"rank {SLOW}"]
    n_buckets = len({e.bucket for e in trace.of_type(ev.AllReduceLaunched)  # type: ignore[attr-defined]
                     if e.step == last_step})
    assert svg.locator(".ddpviz-spread-allreduce").count() == n_buckets
    screenshot(page, "trace_viewer_256_ranks", viewer)
    # pick another rank: its lane replaces the slowest one's
    t = time.perf_counter()
    viewer.locator(".ddpviz-rank-select").select_option("128")
    page.wait_for_function("() => [...document.querySelectorAll('.ddpviz-lane-label')]"
                           ".some(e => e.textContent === 'rank 128')")
    picked = time.perf_counter() - t
    print(f"picking a rank redrew in {picked * 1e3:.0f} ms")
    assert viewer.locator(".ddpviz-lane-label").all_text_contents() == ["256 ranks", "rank 128"]
    # event counts: ranks with the same counts share a column
    heads = viewer.locator(".ddpviz-counts thead th").all_inner_texts()
    assert heads[0] == "event" and len(heads) < 10
    assert console.errors == []
