"""The HTML report of each product bomb (tests/security/bombs.py: fields within the limits whose
product once sized a drawing) opened from disk in Chromium: its interactive view draws, with a
bounded number of elements, and leads with diagnose()'s own verdict, the one the report's static
part and `ddpviz diagnose` give. A view whose embedded findings do not read gives no verdict,
never one of the ranks' own findings in their place.

The verification bomb found both: its findings name the 131,071 ranks that sent nothing, over
the 4,096 entries the front end decoded any list to, so the whole diagnosis was dropped and the
view said "healthy: no problems found" over a run with 301 errors. (And a status line of
1,500,000,000,000 events/s, over steps of a few microseconds.)"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz import diagnose
from ddpviz._diagnose.verdict import verdict
from ddpviz.events import Event
from ddpviz.report.html import write_report
from ddpviz.report.interactive import DIAGNOSIS_ID
from ddpviz.traces.trace import Trace
from tests.browser.conftest import ConsoleLog
from tests.browser.served import logged_page
from tests.security.bombs import (
    broadcast_chunks,
    long_reference_order,
    unused_params,
    verification_world,
    write,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

MAX_ELEMENTS = 50_000  # elements of the view, whatever the file claims
BOMBS: dict[str, Callable[[], list[Event]]] = {
    "chunks": broadcast_chunks, "verification": verification_world, "unused": unused_params,
    "order": long_reference_order}


@pytest.fixture
def tab(browser: Any, console: ConsoleLog) -> Iterator[Any]:
    with logged_page(browser, console, height=900, timeout_ms=90_000) as page:
        yield page


def _report(tmp_path: Path, make: Callable[[], list[Event]]) -> tuple[Path, str]:
    trace = Trace.load(write(tmp_path / "bomb.ddpviz", make()))
    return write_report(trace, tmp_path / "report.html"), verdict(diagnose(trace))


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_bombs_report_draws_bounded_with_diagnoses_verdict(
        tab: Any, console: ConsoleLog, tmp_path: Path, name: str) -> None:
    page, expected = _report(tmp_path, BOMBS[name])
    tab.goto(page.as_uri())
    said = tab.locator("#ddpviz-view [data-section=verdict]")
    said.wait_for()
    assert said.get_attribute("data-scope") == "diagnose"
    assert said.get_attribute("data-verdict") == expected
    if name == "verification":
        assert expected == "errors"
        assert said.inner_text().startswith("errors: 301 errors.")
    assert tab.locator("#ddpviz-view *").count() < MAX_ELEMENTS
    # their events span microseconds: no rate of events a second is made of that
    status = tab.locator("#ddpviz-view .ddpviz-status").inner_text()
    assert " events" in status and "events/s" not in status
    assert console.errors == []


def test_findings_that_do_not_read_give_no_verdict(tab: Any, console: ConsoleLog,
                                                   tmp_path: Path) -> None:
    page, expected = _report(tmp_path, verification_world)
    assert expected == "errors"
    text = page.read_text(encoding="utf-8")
    # the embedded findings replaced by msgpack that is no list of findings (a bare integer)
    junk = base64.b64encode(b"\x2a").decode("ascii")
    text, n = re.subn(rf"(<script type='application/octet-stream' id='{DIAGNOSIS_ID}'>)[^<]*",
                      lambda m: m.group(1) + junk, text)
    assert n == 1
    page.write_text(text, encoding="utf-8")
    tab.goto(page.as_uri())
    said = tab.locator("#ddpviz-view [data-section=verdict]")
    said.wait_for()
    assert said.get_attribute("data-verdict") == "unknown"
    assert said.get_attribute("data-scope") == "unreadable"
    assert said.inner_text().startswith("verdict unknown: diagnose()'s findings came with this "
                                        "view but did not read here (not a list).")
    assert "healthy" not in said.inner_text()
    assert console.errors == []
