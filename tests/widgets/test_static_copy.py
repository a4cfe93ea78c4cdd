"""Where no widget host draws them (`jupyter nbconvert --to html` without widget state, nbviewer),
the dashboard and TraceView leave the run's HTML report in a sandboxed iframe beside the widget
(ddpviz/widgets/static_copy.py): end to end through nbclient and nbconvert; strings from the
trace stay text; a live run gets a line saying how to get a report, never a report judged
before the run ended; a run over the bound gets a line too."""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import nbformat
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from ddpviz.widgets import static_copy
from ddpviz.widgets.dashboard import Dashboard
from ddpviz.widgets.trace_view import TraceView
from tests.widgets.streams import synthetic_run

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "</iframe><script>alert(1)</script>"


class _Frames(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "iframe":
            self.frames.append(dict(attrs))


def frames(page: str) -> list[str]:
    """The pages of the sandboxed iframes in `page` (their srcdoc, as the browser reads it)."""
    parser = _Frames()
    parser.feed(page)
    assert all("sandbox" in f for f in parser.frames)  # no scripts, no same origin
    return [str(f["srcdoc"]) for f in parser.frames]


def copy_of(widget: object) -> str:
    bundle = widget._repr_mimebundle_()  # type: ignore[attr-defined]
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data  # the widget stays first
    return str(data.get("text/html", ""))


def hostile_run() -> list[ev.Event]:
    out = []
    for e in synthetic_run(2, steps=2):
        if isinstance(e, ev.ParamsBuilt):
            first = msgspec.structs.replace(e.params[0], name=HOSTILE)
            e = msgspec.structs.replace(e, params=(first, *e.params[1:]))
        out.append(e)
    return out


@pytest.mark.notebook
def test_nbconvert_shows_the_runs_report_where_no_widget_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    Trace(synthetic_run(2, steps=3)).save(tmp_path / "run.ddpviz")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import ddpviz\nddpviz.Trace.load('run.ddpviz').view()"),
        nbformat.v4.new_code_cell("ddpviz.Trace.load('run.ddpviz').dashboard()")])
    NotebookClient(nb, timeout=120, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    page, _ = HTMLExporter().from_notebook_node(nb)
    reports = frames(page)
    assert len(reports) == 2, "a static copy of each view"
    verdict = ddpviz.diagnose(tmp_path / "run.ddpviz")
    for report in reports:
        assert report.startswith("<!DOCTYPE html>") and "<script" not in report
        assert ("healthy" if not verdict else verdict[0].title) in report


def test_strings_from_the_trace_stay_text() -> None:
    trace = Trace(hostile_run())
    for widget in (TraceView(trace), Dashboard(trace)):
        text = copy_of(widget)
        assert "<script" not in text.lower() and text.count("</iframe>") == 1
        (report,) = frames(text)  # what the iframe's page is
        assert "<script" not in report.lower() and "&lt;/iframe&gt;&lt;script&gt;" in report


def test_a_live_run_gets_a_line_not_a_report(tmp_path: Path) -> None:
    Trace(synthetic_run(2, steps=2)).save(tmp_path / "rank.ddpviz")
    session = ddpviz.listen(follow=tmp_path, show=False)  # a live session: more may come
    try:
        for widget in (TraceView(session), Dashboard(session)):
            text = copy_of(widget)
            assert "<iframe" not in text and "ddpviz report" in text
    finally:
        session.close()


def test_a_run_over_the_bound_gets_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(synthetic_run(2, steps=2))
    monkeypatch.setattr(static_copy, "MAX_EVENTS", 10)
    text = copy_of(TraceView(trace))
    assert "<iframe" not in text and f"a run of {len(trace):,} events" in text


@pytest.mark.parametrize("make", [TraceView, Dashboard])
def test_a_folder_is_read_once_for_the_view_its_findings_and_its_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: type) -> None:
    # one opened run (traces/source.py `open_run`) serves the widget, diagnose() and the
    # static copy's report: each rank's file is parsed once, where it was parsed 3-4 times
    run = synthetic_run(2, steps=2)
    for rank in (0, 1):
        Trace([e for e in run if e.rank == rank]).save(tmp_path / f"rank{rank}.ddpviz")
    loads: list[str] = []
    real = Trace.load.__func__  # type: ignore[attr-defined]

    def counted(cls: type, path: object, *args: object, **kwargs: object) -> Trace:
        loads.append(Path(str(path)).name)
        return real(cls, path, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Trace, "load", classmethod(counted))
    widget = make(tmp_path)
    text = copy_of(widget)
    assert "<iframe" in text and frames(text)
    assert sorted(loads) == ["rank0.ddpviz", "rank1.ddpviz"], loads
    # and its findings are diagnose()'s of the folder, as `ddpviz diagnose` says them (the
    # Dashboard is a TraceView: the same `findings`)
    assert [f.title for f in widget.findings] == [f.title for f in ddpviz.diagnose(tmp_path)]
