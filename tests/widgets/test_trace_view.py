"""TraceView (ddpviz/widgets/trace_view.py): what the kernel sends the browser is the run as one
`.ddpviz` file (a file's own bytes; anything else merged and written as Trace.save writes it),
bounded; the front end is the viewer's code bundled alone (no JupyterLab or Lumino import),
with every JupyterLab theme variable given a fallback for other hosts. Drawing it is tested
in Chromium (tests/browser/test_lab_trace_view.py)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.traces.source import SourceError
from ddpviz.traces.trace import Trace
from ddpviz.widgets import trace_view
from ddpviz.widgets.trace_view import TraceView, TraceViewError
from tests.widgets.streams import Plant, synthetic_run


def events_of(trace: Trace) -> dict[int, list[ev.Event]]:
    return {r: list(trace.events(r)) for r in trace.ranks}


def test_a_file_is_sent_as_its_own_bytes(tmp_path: Path) -> None:
    path = Trace(synthetic_run(2, steps=3)).save(tmp_path / "run.ddpviz")
    view = TraceView(path)
    assert view.trace == path.read_bytes()
    assert view.name == "run.ddpviz"


def test_a_trace_or_events_are_sent_as_one_file_that_loads_back_equal(tmp_path: Path) -> None:
    events = synthetic_run(3, steps=2, plant=Plant(missing={1: 2}))
    trace = Trace(events)
    for source in (trace, events):
        view = TraceView(source)
        sent = tmp_path / "sent.ddpviz"
        sent.write_bytes(view.trace)
        assert events_of(Trace.load(sent)) == events_of(trace)
    assert trace.view().trace == TraceView(trace).trace  # Trace.view() is the same widget


def test_a_folder_of_rank_files_is_merged(tmp_path: Path) -> None:
    trace = Trace(synthetic_run(2, steps=2))
    for rank in trace.ranks:
        Trace(list(trace.events(rank))).save(tmp_path / f"rank{rank}.ddpviz")
    sent = tmp_path / "sent.ddpviz"
    sent.write_bytes(TraceView(tmp_path).trace)
    assert events_of(Trace.load(sent)) == events_of(trace)


def test_a_run_over_the_bound_is_refused_with_where_to_look_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Trace(synthetic_run(2, steps=3)).save(tmp_path / "run.ddpviz")
    monkeypatch.setattr(trace_view, "MAX_BYTES", path.stat().st_size - 1)
    for source in (path, Trace.load(path)):
        with pytest.raises(TraceViewError, match="file browser") as info:
            TraceView(source)
        assert "MiB" in str(info.value)


@pytest.mark.parametrize("kwargs,match", [
    ({"scheme": "rainbow"}, "scheme"), ({"max_events": 0}, "max_events"),
    ({"max_events": True}, "max_events")])
def test_bad_options_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TraceView(synthetic_run(2, steps=1), **kwargs)  # type: ignore[arg-type]


def test_no_kind_of_run_is_refused_as_every_verb_refuses_it() -> None:
    with pytest.raises(SourceError, match="TraceView cannot show"):
        TraceView(42)


def test_the_front_end_is_the_viewers_code_alone_with_a_fallback_for_each_theme_variable(
) -> None:
    js, css = TraceView._esm, TraceView._css
    assert js and css, "the front end is not built (cd extension && jlpm build)"
    assert "@jupyterlab" not in js and "@lumino" not in js
    assert not re.search(r"\bimport\s*[\w{*]", js)  # one module: nothing left to import
    assert re.search(r"export\s*\{[^}]*\bas default\b", js)
    # the viewer's panels (view.ts) are what it draws
    for section in ("verdict", "summary", "findings", "timeline"):
        assert f'"{section}"' in js
    themed = re.findall(r"var\(--jp-[a-z0-9-]+([^)]*)\)", css)
    assert themed and all(rest.startswith(", ") for rest in themed), themed


def test_the_verdict_sent_is_diagnoses_own_findings_as_checked_events(tmp_path: Path) -> None:
    # a parameter missing on rank 1: diagnose() names it (a verification the ranks did not
    # report live in this synthetic run); the healthy twin sends an empty list, not nothing
    sick = Trace(synthetic_run(2, steps=2, plant=Plant(missing={1: 2})))
    healthy = Trace(synthetic_run(2, steps=2))
    for trace in (sick, healthy):
        view = TraceView(trace)
        expected = list(ddpviz.diagnose(trace))
        assert view.findings == expected
        sent = msgspec.msgpack.decode(view.diagnosis, type=list[ev.FindingReported])
        assert [e.finding for e in sent] == expected
    assert TraceView(sick).findings and not TraceView(healthy).findings
    assert TraceView(healthy).diagnosis == msgspec.msgpack.encode([])


def test_refresh_sends_a_live_runs_new_events_and_their_diagnosis() -> None:
    events = synthetic_run(2, steps=3)
    half = len(events) // 2
    live = list(events[:half])
    view = TraceView(live)
    first = view.trace
    live.extend(events[half:])
    view.refresh()
    assert view.trace != first
    assert events_of(Trace.from_bytes(view.trace)) == events_of(Trace(events))
    assert view.findings == list(ddpviz.diagnose(events))


def test_the_schemes_it_accepts_are_the_front_ends_palettes() -> None:
    from tests.extension.mirror import run_typescript

    assert sorted(trace_view.SCHEMES) == sorted(run_typescript(
        "colors", "Object.keys(g.PALETTES)", None))
