"""Dashboard: one anywidget over the one front end (a TraceView with the debugger's panel where
the run can be paused): the run goes to the browser as `.ddpviz` bytes (never markup, no
plotly figure), a live session is followed with new events only and ends with what a replay of
the same events shows, and its findings are diagnose()'s, as every other surface says them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import plotly.graph_objects as go
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.traces.view_bytes import trace_bytes
from ddpviz.transport import Sender
from ddpviz.widgets import Dashboard, TraceView
from ddpviz.widgets.dashboard import dashboard
from tests.diagnose.test_live import LiveSession, mid_step
from tests.widgets.streams import Plant, synthetic_run
from tests.widgets.wire import WireCounter


def test_a_dashboard_is_one_anywidget_that_sends_the_run_as_bytes_not_markup() -> None:
    events = synthetic_run(8, 1000, 3, chunk_bytes=250 << 20, cap=25 << 20, width=256)
    with WireCounter() as wire:
        d = Dashboard(events)
    assert isinstance(d, TraceView) and isinstance(d, anywidget.AnyWidget)
    assert not isinstance(d, (w.Box, go.FigureWidget))  # no ipywidgets tree, no plotly
    assert len(ddpviz.Trace.from_bytes(d.trace)) == len(events) == d.events_sent
    # what went over the wire is the run's bytes and diagnose()'s findings, each once: the
    # front end (trace_view.js, shipped with the widget) aside, nothing grows with the run
    front_end = len(d._esm) + len(d._css)
    assert wire.total <= len(d.trace) + front_end + 200_000, (wire.total, len(d.trace))
    d.close()


def test_the_kernel_drawn_dashboards_arguments_and_no_run_are_refused_with_a_hint() -> None:
    events = synthetic_run(2, 4, 1)
    with pytest.raises(TypeError, match=r"no longer takes max_hz=.*twice a second"):
        Dashboard(events, max_hz=10)
    with pytest.raises(TypeError, match="no longer takes timeline_bytes_per_s="):
        ddpviz.Trace(events).dashboard(timeline_bytes_per_s=1000)
    with pytest.raises(ValueError, match=r"needs a run: .*stream them into a Session"):
        Dashboard()
    with pytest.raises(TypeError, match="ddpviz: TraceView cannot show a int"):
        Dashboard(3)
    with pytest.raises(ValueError, match=r"debugger=True\) needs a live Run or Session, not "
                                         "Trace; recorded runs cannot be paused"):
        Dashboard(ddpviz.Trace(events), debugger=True)


def test_a_trace_file_opens_as_a_replay_with_no_debugger(tmp_path: Path) -> None:
    events = synthetic_run(2, 6, 2)
    path = ddpviz.Trace(events).save(tmp_path / "run.ddpviz")
    d = ddpviz.Trace.load(path).dashboard()
    assert d.live == "" and not d.following  # a replay: sent once
    assert d.events_sent == len(events)
    assert d.debugger is None and d.debugger_state == ""  # no panel for a recorded run
    d.close()


def test_live_from_a_session_sends_new_events_and_ends_like_a_replay() -> None:
    events = synthetic_run(2, 30, 6, chunk_bytes=2048)
    per_rank = {r: [e for e in events if e.rank == r] for r in (0, 1)}
    with ddpviz.listen(show=False) as session:
        d = session.dashboard()
        assert d.live == "running" and d.following
        senders = {r: Sender(session.connect_string, r, batch=16) for r in (0, 1)}
        seen: list[int] = []
        for i in range(0, max(map(len, per_rank.values())), 40):
            for r, s in senders.items():
                for e in per_rank[r][i:i + 40]:
                    s(e)
                s.flush()
            # paced by the view's sends, not a clock: a loaded machine still sends live
            deadline = time.monotonic() + 10
            while d.events_sent == (seen or [0])[-1] and time.monotonic() < deadline:
                time.sleep(0.02)
            seen.append(d.events_sent)
        for s in senders.values():
            s.close()
        assert session.wait(ranks=2, timeout=10)
    deadline = time.monotonic() + 10
    while d.following and time.monotonic() < deadline:  # the session closed: the last send
        time.sleep(0.05)
    assert not d.following and d.live == "closed", d.live
    assert len(set(seen)) > 2 and d.sends >= 2  # it followed in steps, live, as frames
    assert d.events_sent == len(events)
    replay = Dashboard(events)
    assert d.findings == replay.findings == ddpviz.diagnose(events)
    d.close()


def test_its_findings_are_diagnoses_of_the_whole_run_not_only_what_ranks_reported() -> None:
    # rank 1 lacks a parameter: diagnose() names it from the events, no rank reported it live
    events = synthetic_run(2, steps=2, plant=Plant(missing={1: 2}))
    assert not [e for e in events if isinstance(e, ev.FindingReported)]
    found = ddpviz.diagnose(events)
    assert any(f.severity == "error" for f in found)
    d = dashboard(ddpviz.Trace(events))
    assert d.findings == found and d.diagnosis  # sent, the view draws these
    assert Dashboard(ddpviz.Trace(synthetic_run(2, steps=2))).findings == []  # healthy: none


class _LiveSession(LiveSession):
    """tests/diagnose/test_live.py's session, as a view subscribes to it."""

    def __init__(self, trace: ddpviz.Trace) -> None:
        super().__init__(trace)
        self.collector = type("Collector", (), {"ended": None, "address": "test"})()
        self.stats = None

    def subscribe(self, callback: Any, *, batch: bool = False, replay: bool = False,
                  history: Any = None) -> Any:
        if history is not None:
            history(self.trace)
        return lambda: None


def test_a_running_session_is_judged_on_the_steps_every_rank_finished() -> None:
    # a healthy run read mid-step (rank 0 inside step 3, rank 1's step 3 not in yet): so far
    # nothing, never "rank 1 stopped at step 2"; the same events once the session is closed
    # are judged as a run that is over (See [Note: a run still going])
    session = _LiveSession(ddpviz.Trace(mid_step()))
    d = Dashboard(session)
    assert d.live == "running" and d.findings == []
    session.closed = True
    deadline = time.monotonic() + 10
    while d.following and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.live == "closed"
    assert {f.kind for f in d.findings} & {"uneven_iterations", "rank_hang"}, d.findings
    d.close()


def test_closing_it_stops_following() -> None:
    session = _LiveSession(ddpviz.Trace(mid_step()))
    d = Dashboard(session)
    thread = threading.Thread(target=d.close)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and not d.following


def test_a_run_over_what_a_view_sends_is_drawn_with_its_hooks_summarized_and_says_so(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ddpviz.widgets import trace_view

    # rank 1's hooks fire in another order at step 2: diagnose() names it from every event
    # (the summary drawn has no per-parameter order left to show it)
    # (big buckets: summarized per bucket, the hooks take fewer bytes than in COLUMNS frames)
    events = synthetic_run(2, 200, 4, cap=60_000, plant=Plant(swap={1: (2, 0, 1)}))
    path = ddpviz.Trace(events).save(tmp_path / "run.ddpviz")
    # the run whole as a view writes it (as Trace.save does: COPY and COLUMNS frames)
    whole = len(trace_bytes(ddpviz.Trace.load(path), limit=1 << 30)[0])
    assert whole == path.stat().st_size
    monkeypatch.setattr(trace_view, "MAX_BYTES", whole - 1)  # just over the bound
    for source in (path, ddpviz.Trace.load(path)):
        d = Dashboard(source)
        sent = ddpviz.Trace.from_bytes(d.trace)
        assert len(d.trace) < whole and d.events_sent == len(sent) < len(events)
        assert not sent.of_type(ev.GradReady) and sent.of_type(ev.GradsSummarized)
        assert "drawn summarized per bucket" in d.notice and "file browser" in d.notice
        assert d.findings == ddpviz.diagnose(events)
        assert [f.kind for f in d.findings] == ["grad_order"]
        d.close()
    monkeypatch.setattr(trace_view, "MAX_BYTES", 1000)  # over even summarized: refused
    with pytest.raises(trace_view.TraceViewError, match="gradient hooks summarized per bucket"):
        Dashboard(path)


def test_a_run_of_small_buckets_is_sent_whole_where_its_summary_would_be_bigger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpviz.traces.tablebytes import min_bytes
    from ddpviz.widgets import trace_view

    # ~4 parameters a bucket: a summary per bucket takes more bytes than the hooks' columns
    trace = ddpviz.Trace(synthetic_run(2, 200, 20))
    whole = len(trace_bytes(trace, limit=1 << 30)[0])
    monkeypatch.setattr(trace_view, "MAX_BYTES", whole)
    assert sum(min_bytes(t) for t in trace.columns().values()) > whole  # (as event maps: over)
    d = Dashboard(trace)
    try:
        assert len(d.trace) == whole and d.events_sent == len(trace) and not d.notice
        assert ddpviz.Trace.from_bytes(d.trace) == trace
    finally:
        d.close()
