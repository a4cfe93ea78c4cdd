"""The report's interactive view (report/interactive.py): the run embedded as the TraceView
sends it (the `.ddpviz` bytes, diagnose()'s findings and the bucket advisor's answer, zlib-
compressed and base64 in data elements the browser never runs), the viewer's bundle inlined
once; a run over the bound, or a front end that is not built, gets a line instead; a report
for the notebook's static copy holds no script. That the panels draw from it, offline, with
the payloads of a hostile trace as text:
tests/browser/test_report_pages.py and test_hostile_trace.py."""

from __future__ import annotations

import base64
import re
import zlib
from pathlib import Path

import msgspec
import pytest

from ddpviz import diagnose, markup
from ddpviz import events as ev
from ddpviz.report import interactive
from ddpviz.report.html import render
from ddpviz.traces import view_bytes
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.trace import Trace
from tests.security.hostile import hostile_trace, raw_markup, without_own_scripts
from tests.widgets.streams import synthetic_run

pytestmark = pytest.mark.skipif(not (interactive.STATIC / "report_view.js").is_file(),
                                reason="the front end is not built (cd extension && jlpm build)")


def _data(page: str, element_id: str) -> bytes:
    found = re.search(rf"<script type='application/octet-stream' id='{element_id}'>"
                      r"([A-Za-z0-9+/=]*)</script>", page)
    assert found is not None, element_id
    # zlib-compressed, as the view element says (reportView.ts inflates them)
    assert f"data-encoding='{interactive.ENCODING}'" in page
    return zlib.decompress(base64.b64decode(found.group(1)))


def test_the_run_and_diagnose_s_findings_are_embedded_as_data(tmp_path: Path) -> None:
    trace = hostile_trace()  # (markup in every string: it must stay data)
    page = render(trace)
    sent = tmp_path / "sent.ddpviz"
    sent.write_bytes(_data(page, interactive.TRACE_ID))
    loaded = Trace.load(sent)
    assert {r: list(loaded.events(r)) for r in loaded.ranks} == {
        r: list(trace.events(r)) for r in trace.ranks}
    findings = msgspec.msgpack.decode(_data(page, interactive.DIAGNOSIS_ID),
                                      type=list[ev.FindingReported])
    assert [f.finding for f in findings] == list(diagnose(trace))
    # the page's scripts: the three data elements and the bundle, once; nothing else runs
    assert re.findall(r"<script[^>]*>", page) == [
        f"<script type='application/octet-stream' id='{interactive.TRACE_ID}'>",
        f"<script type='application/octet-stream' id='{interactive.DIAGNOSIS_ID}'>",
        f"<script type='application/octet-stream' id='{interactive.ADVICE_ID}'>",
        "<script type='module'>"]
    assert page.count((interactive.STATIC / "report_view.js").read_text()) == 1
    # outside ddpviz's own raw-text elements (the bundle, its stylesheet, the data) no payload
    # is markup
    section = page[page.index("<section id='interactive'>"):]
    assert "<script" in section and raw_markup(without_own_scripts(section)) is None
    assert raw_markup(without_own_scripts(section + "<script>alert(1)</script>")) is not None


def test_a_file_keeps_its_name_and_bytes(tmp_path: Path) -> None:
    path = Trace(synthetic_run(2, steps=3)).save(tmp_path / "my <run>.ddpviz")
    page = render(path)
    assert _data(page, interactive.TRACE_ID) == path.read_bytes()
    assert "data-name='my &lt;run&gt;.ddpviz'" in page  # (escaped like every attribute)


def test_a_run_over_the_bound_gets_a_line_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(synthetic_run(2, steps=3))
    page = render(trace)
    size = len(_data(page, interactive.TRACE_ID))
    monkeypatch.setattr(interactive, "EMBED_MAX", size - 1)  # written out, then over
    page = render(trace)
    assert interactive.TRACE_ID not in page and "<script" not in page
    assert "MiB a report embeds" in page and "file browser" in page
    monkeypatch.setattr(interactive, "EMBED_MAX", len(trace) * interactive.MIN_EVENT_BYTES - 1)
    page = render(trace)  # surely over, from its event count: not written out
    assert markup.escape(f"the run's {len(trace):,} events are over") in page
    assert "<script" not in page


def test_without_the_front_end_built_the_report_says_so(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(view_bytes, "STATIC", tmp_path)
    page = render(Trace(synthetic_run(2, steps=3)))
    assert "<script" not in page and "front end is not built" in page
    assert "id='timeline'" in page  # the rest of the report as without it


def test_the_notebook_s_static_copy_holds_no_script() -> None:
    page = render(Trace(synthetic_run(2, steps=3)), interactive=False)
    assert "<script" not in page and "id='interactive'" not in page


def test_raw_text_refuses_what_would_end_its_element() -> None:
    assert markup.raw_text("script", "let a = 1 < 2;", type="module") == \
        "<script type='module'>let a = 1 < 2;</script>"
    for bad in ("x = '</SCRIPT>'", "<!-- y"):
        with pytest.raises(ValueError, match="end it early"):
            markup.raw_text("script", bad)
    with pytest.raises(ValueError, match="end it early"):
        markup.raw_text("style", "a{} </style><script>")
    with pytest.raises(ValueError, match="script or style"):
        markup.raw_text("div", "x")


def test_a_run_that_cannot_be_written_out_gets_a_line_and_the_report_is_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: TraceWriter, *args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    # (the run is written out as Trace.save writes it, through a TraceWriter)
    monkeypatch.setattr(TraceWriter, "__init__", full)
    page = render(Trace(synthetic_run(2, steps=3)))  # (a Trace: written out to be embedded)
    assert "<script" not in page and "could not be written out" in page
    assert "No space left" in page and "id='timeline'" in page
