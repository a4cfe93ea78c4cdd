"""The trace viewer's "who made the all-reduce wait" in real JupyterLab in Chromium: a
simulated 64-rank trace with one rank slowed 20% in its backward opens with the rank x bucket
table Python computes from the same file (the 8 ranks that caused most wait, then one row for
the others), the slow rank's row blamed the most."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_straggler import simulate
from ddpviz._diagnose.straggler import wait_rows, who_waited
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog, screenshot
from tests.browser.lab import LabServer
from tests.browser.ui import double_click_file, open_lab, wait_for_viewer

pytestmark = pytest.mark.browser

SLOW = 41


@pytest.fixture(scope="module")
def slow_trace(lab_root: Path) -> Trace:
    sim = simulate(64, 15, slow_rank=SLOW, slow=1.2, every=1, jitter=0.05, buckets=6, seed=8)
    Trace([e for t in sim.tables.values() for e in t.events()]).save(lab_root / "slow64.ddpviz")
    return Trace.load(lab_root / "slow64.ddpviz")


def test_the_viewer_shows_who_made_each_bucket_wait(page: Any, lab: LabServer,
                                                    console: ConsoleLog,
                                                    slow_trace: Trace) -> None:
    expected = wait_rows(who_waited(slow_trace.columns(), slow_trace.clock))
    assert expected[-1].label.startswith("other ranks")
    page.set_viewport_size({"width": 1280, "height": 1500})
    open_lab(page, lab)
    double_click_file(page, "slow64.ddpviz")
    viewer = wait_for_viewer(page, "slow64.ddpviz")
    table = viewer.locator(".ddpviz-waits-table")
    table.wait_for()
    rows = table.locator("tbody tr")
    assert rows.count() == len(expected)
    for i, row in enumerate(expected):
        got = rows.nth(i)
        assert got.get_attribute("data-ranks") == ",".join(map(str, row.ranks))
        cells = got.locator("td")
        assert [int(cells.nth(j).get_attribute("data-last") or -1)
                for j in range(cells.count())] == list(row.n_last)
    slow_row = [i for i, r in enumerate(expected) if r.ranks == (SLOW,)]
    assert slow_row and rows.nth(slow_row[0]).locator("th").inner_text() == f"rank {SLOW}"
    assert "attributed to nobody" in viewer.locator("section.ddpviz-waits").inner_text()
    screenshot(page, "trace_viewer_waits_64_ranks", viewer.locator("section.ddpviz-waits"))
    assert console.errors == []
