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
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpviz import diagnose
from ddpviz._diagnose.verdict import verdict
from ddpviz.events import Event
from ddpviz.report.html import write_report
from ddpviz.report.interactive import DIAGNOSIS_ID, TRACE_ID
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
    # the embedded findings replaced by msgpack that is no list of findings (a bare integer),
    # compressed as the report compresses them
    junk = base64.b64encode(zlib.compress(b"\x2a")).decode("ascii")
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


def _replace_data(page: Path, element_id: str, raw: bytes) -> None:
    """The report at `page` with one embedded element's bytes replaced by `raw` (base64)."""
    text = page.read_text(encoding="utf-8")
    data = base64.b64encode(raw).decode("ascii")
    text, n = re.subn(rf"(<script type='application/octet-stream' id='{element_id}'>)[^<]*",
                      lambda m: m.group(1) + data, text)
    assert n == 1
    page.write_text(text, encoding="utf-8")


def _deflate_bomb(size: int) -> bytes:
    """A zlib stream of `size` zero bytes (about a thousandth of that, compressed)."""
    z = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    return b"".join([*(z.compress(chunk) for _ in range(size >> 20)), z.flush()])


@pytest.mark.parametrize("element_id", [TRACE_ID, DIAGNOSIS_ID])
def test_a_zip_bomb_in_a_report_fails_fast_and_says_so(
        tab: Any, console: ConsoleLog, tmp_path: Path, element_id: str) -> None:
    """An embedded element that inflates past the 64 MiB a view reads (here to 256 MiB, from
    a third of a MiB of page) is refused once its output passes the limit: the view says so
    in a second or so, instead of sizing it all; the report's static sections are untouched."""
    page, _ = _report(tmp_path, verification_world)
    _replace_data(page, element_id, _deflate_bomb(256 << 20))
    start = time.monotonic()
    tab.goto(page.as_uri())
    error = tab.locator("#ddpviz-view .ddpviz-error")
    error.wait_for(timeout=30_000)
    assert time.monotonic() - start < 20
    what = element_id.removeprefix("ddpviz-view-")
    assert error.inner_text().startswith(
        f"ddpviz: 'Trace' could not be read from this report: the report's embedded "
        f"{what} inflates to over the 64 MiB a view reads; it was not read past that")
    assert tab.locator("#ddpviz-view .ddpviz-trace [data-section=verdict]").count() == 0
    assert tab.locator("#summary").count() == 1  # (the static part, drawn without scripts)
    assert console.errors == []


def test_an_embedded_element_that_does_not_inflate_says_so(
        tab: Any, console: ConsoleLog, tmp_path: Path) -> None:
    """A stream cut short (a damaged report) or no zlib at all: a line saying which part of
    the report does not read, never a half-drawn view."""
    page, _ = _report(tmp_path, verification_world)
    text = page.read_text(encoding="utf-8")
    whole = re.search(rf"id='{TRACE_ID}'>([^<]*)", text)
    assert whole is not None
    _replace_data(page, TRACE_ID, base64.b64decode(whole.group(1))[:-100])
    tab.goto(page.as_uri())
    error = tab.locator("#ddpviz-view .ddpviz-error")
    error.wait_for()
    assert "the report's embedded trace is not a zlib stream that reads whole" in \
        error.inner_text()
    _replace_data(page, TRACE_ID, b"DDPVIZ\x00\x1a not compressed")
    tab.goto(page.as_uri())
    error.wait_for()
    assert "the report's embedded trace is not a zlib stream that reads whole" in \
        error.inner_text()
    assert console.errors == []
