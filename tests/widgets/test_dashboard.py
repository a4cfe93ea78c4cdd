"""Dashboard: one FigureWidget in all, <= 6 MB shipped, live updates from a background thread
(a real Session fed by Senders) throttled to <= 10 redraws/s ending in the same state as a
replay of the same events, and sliders that move every part to the chosen instant."""

from __future__ import annotations

import html
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz._diagnose.verdict import verdict, verdict_line
from ddpviz.transport import Sender
from ddpviz.widgets import Dashboard
from ddpviz.widgets.dashboard import dashboard
from tests.diagnose.test_live import LiveSession, mid_step
from tests.widgets.streams import Plant, synthetic_run
from tests.widgets.wire import WireCounter


def widgets_in(root: w.Widget) -> list[w.Widget]:
    out = [root]
    for child in getattr(root, "children", ()):
        out += widgets_in(child)
    return out


def test_a_dashboard_holds_one_figure_and_ships_at_most_6_mb() -> None:
    events = synthetic_run(8, 1000, 3, chunk_bytes=250 << 20, cap=25 << 20, width=256)
    with WireCounter() as wire:
        d = Dashboard(events)
    figures = [x for x in widgets_in(d) if isinstance(x, go.FigureWidget)]
    assert figures == [d.buckets.bucket_map.figure]  # type: ignore[union-attr]
    assert wire.total <= 6_000_000
    assert sum(size > 1_000_000 for size in wire.largest(5)) == 1  # plotly.js, once


def test_the_sliders_move_every_part_to_the_chosen_instant() -> None:
    events = synthetic_run(2, 8, 3, chunk_bytes=1024, plant=Plant(swap={1: (2, 0, 1)}))
    d = Dashboard(events)
    assert d.controls is not None and not d.controls.follow.value
    assert d.timeline.step == 2 and d.buckets.which == "rebuilt"  # a replay opens at the end
    assert d.timeline.view is not None and d.timeline.view.order.differs
    d.controls.iteration.value = 0  # as a browser would: the slider's value changes
    assert d.timeline.step == 0 and d.buckets.which == "initial"
    assert d.timeline.view is not None and not d.timeline.view.order.differs
    first_chunk_done = next(e for e in events if isinstance(e, ev.BroadcastChunkDone))
    d.controls.seek(first_chunk_done.t_ns)
    assert d.controls.iteration.value == -1  # the constructor
    assert d.broadcast.progress[0].chunks_done == 1
    assert d.timeline.view is None and "pick iteration 0 or later" in d.timeline.header_html.value
    assert "constructor" in d.controls.readout.value
    d.controls.time.value = 1000  # the end of the run
    assert d.controls.iteration.value == 2 and d.timeline.step == 2
    assert d.broadcast.progress[0].state == "done"
    assert "ranks 0,1 after backward" in d.status_html.value


def test_live_from_a_session_redraws_at_most_10_times_a_second_and_ends_like_a_replay(
) -> None:
    events = synthetic_run(2, 30, 6, chunk_bytes=2048)
    per_rank = {r: [e for e in events if e.rank == r] for r in (0, 1)}
    with ddpviz.listen(show=False) as session:
        d = session.dashboard(max_hz=10)
        assert d.controls is not None and d.controls.follow.value
        done = threading.Event()
        sizes_seen: list[int] = []

        def ranks() -> None:  # two "ranks" streaming from a background thread
            senders = {r: Sender(session.connect_string, r, batch=16) for r in (0, 1)}
            for i in range(0, max(map(len, per_rank.values())), 8):
                seen = d.throttle.redraws  # type: ignore[union-attr]
                for r, s in senders.items():
                    for e in per_rank[r][i:i + 8]:
                        s(e)
                    s.flush()
                # paced by the redraws, not a clock: a loaded machine still redraws live
                deadline = time.monotonic() + 5
                while d.throttle.redraws == seen and time.monotonic() < deadline:  # type: ignore[union-attr]
                    time.sleep(0.01)
            for s in senders.values():
                s.close()
            done.set()

        thread = threading.Thread(target=ranks)
        thread.start()
        while not done.is_set():  # what the kernel sees while the ranks run
            sizes_seen.append(len(d.model))
            time.sleep(0.05)
        thread.join()
        assert session.wait(ranks=2, timeout=10)
        time.sleep(0.3)  # the last throttled redraw
        throttle = d.throttle
        assert throttle is not None
        # the redraws of the throttle's own thread (the flush below redraws at once, by
        # design: its time is not one of the rate-limited ones)
        background = list(throttle.times)
        d.throttle.flush()  # type: ignore[union-attr]
        # the hook timeline keeps to its live bytes budget: a redraw it deferred is drawn by
        # the throttle's thread once the budget allows (it once was compared before that)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with throttle._run_lock:  # no redraw half-done
                if not throttle.pending:
                    break
            time.sleep(0.05)
        assert not throttle.pending
        assert throttle.errors == 0
        assert len(background) >= 3  # it redrew while the events were still arriving
        gaps = [b - a for a, b in pairwise(background)]
        assert min(gaps) >= 0.1 * 0.99  # <= 10 Hz
        assert len(set(sizes_seen)) > 2  # the model grew in steps, live
        assert len(d.model) == len(events)
        replay = Dashboard(events)
        assert d.verification.matrix == replay.verification.matrix
        assert d.broadcast.progress == replay.broadcast.progress
        assert d.timeline.step == replay.timeline.step == 5
        assert d.timeline.view == replay.timeline.view
        assert d.buckets.observed == replay.buckets.observed
        assert "2 of 2 ranks connected, 2 finished" in d.status_html.value
        assert "0 dropped · 0 rejected" in d.status_html.value
        d.close()


def test_the_header_counts_dropped_events() -> None:
    events = synthetic_run(2, 4, 1)
    events.append(ev.EventsDropped(0, 0, events[-1].t_ns + 1, 10_000, 17))
    d = dashboard(events)
    assert d.status is not None and d.status.dropped == 17
    assert "17 dropped · 0 rejected" in d.status_html.value


def test_findings_reported_by_ranks_show_in_the_header() -> None:
    from ddpviz.findings import Finding

    events = synthetic_run(2, 4, 1)
    finding = Finding(kind="grad_order", severity="error",
                      title="gradients became ready in a different order on rank 1")
    events.append(ev.FindingReported(0, 0, events[-1].t_ns + 1, 10_000, finding))
    d = Dashboard(events)
    assert d.model.findings() == [finding]
    header = d.status_html.value
    assert "errors: 1 error · gradients became ready in a different order on rank 1" in header
    assert header.index("errors: 1 error") < header.index("ranks 0,1 after backward")  # first
    assert "ranks 0,1 after backward" in d.status_html.value


def test_a_trace_file_opens_as_a_replay(tmp_path: Path) -> None:
    events = synthetic_run(2, 6, 2)
    path = ddpviz.Trace(events).save(tmp_path / "run.ddpviz")
    d = ddpviz.Trace.load(path).dashboard()
    assert d.source.kind == "trace" and not d.source.is_live()
    assert d.timeline.step == 1 and d.verification.matrix.state == "passed"
    assert f"trace: {len(events)} events from 2 ranks" in d.status_html.value


def test_feeding_by_hand_from_a_thread_updates_the_widgets() -> None:
    d = Dashboard(max_hz=20)
    events = synthetic_run(2, 6, 2)
    thread = threading.Thread(target=d.feed, args=(events,))
    thread.start()
    thread.join()
    deadline = time.monotonic() + 5
    while d.timeline.step != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert d.timeline.step == 1 and d.verification.matrix.state == "passed"
    d.close()


def test_an_unknown_source_is_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match="ddpviz: cannot show events from a int"):
        Dashboard(3)


def test_opening_a_trace_folds_it_once_for_every_section(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from ddpviz.model.event_model import EventModel
    from ddpviz.traces.trace import Trace

    trace = Trace(synthetic_run(3, 6, 3))
    tables: list[int] = []
    objects: list[int] = []
    feed_table, feed = EventModel.feed_table, EventModel.feed
    monkeypatch.setattr(EventModel, "feed_table",
                        lambda self, table: tables.append(table.rank) or feed_table(self, table))
    monkeypatch.setattr(EventModel, "feed",
                        lambda self, events: objects.append(1) or feed(self, events))
    d = Dashboard(trace)
    assert sorted(tables) == [0, 1, 2] and objects == []  # one model, each rank folded once
    assert {part.model for part in (d.verification, d.broadcast, d.buckets, d.timeline,
                                    d.replicas)} == {d.model}


def test_a_finished_run_leads_with_diagnoses_verdict_of_the_whole_run() -> None:
    # rank 1 lacks a parameter: diagnose() names it from the events, no rank reported it live;
    # the header says diagnose()'s verdict, as `ddpviz diagnose`, the report and trace.view()
    events = synthetic_run(2, steps=2, plant=Plant(missing={1: 2}))
    assert not [e for e in events if isinstance(e, ev.FindingReported)]
    found = ddpviz.diagnose(events)
    assert any(f.severity == "error" for f in found)
    header = Dashboard(ddpviz.Trace(events)).status_html.value
    assert html.escape(verdict_line(found).rstrip("."), quote=True) in header
    assert html.escape(found[0].title, quote=True) in header
    assert "ddpviz.diagnose() of the whole run" in header
    healthy = synthetic_run(2, steps=2)
    assert verdict(ddpviz.diagnose(healthy)) == "healthy"
    assert "healthy: no problems found" in Dashboard(ddpviz.Trace(healthy)).status_html.value


def test_a_running_run_leads_with_what_its_ranks_reported_so_far_only() -> None:
    d = Dashboard(max_hz=50)  # fed by hand: live, never diagnosed
    d.feed(synthetic_run(2, steps=2, plant=Plant(missing={1: 2})))
    d.refresh()
    header = d.status_html.value
    assert "healthy" not in header and "error" not in header
    assert "ddpviz.diagnose()" not in header


class _LiveSession(LiveSession):
    """tests/diagnose/test_live.py's session, as the dashboard subscribes to it."""

    def __init__(self, trace: ddpviz.Trace) -> None:
        super().__init__(trace)
        self.collector = type("Collector", (), {"ended": None, "address": "test"})()
        self.stats = None

    def subscribe(self, callback: Any, *, batch: bool = False, replay: bool = False,
                  history: Any = None) -> Any:
        if history is not None:
            history(self.trace)
        return lambda: None


def test_a_running_session_leads_with_diagnose_of_the_steps_every_rank_finished() -> None:
    # a healthy run read mid-step (rank 0 inside step 3, rank 1's step 3 not in yet): so far
    # healthy, never "rank 1 stopped at step 2"; the same events once the session is closed
    # are judged as a run that is over (See [Note: a run still going])
    session = _LiveSession(ddpviz.Trace(mid_step()))
    d = Dashboard(session, max_hz=50)
    header = d.status_html.value
    assert "so far: healthy: no problems found" in header, header
    assert "ddpviz.diagnose() of the run so far" in header
    session.closed = True
    d.refresh()
    header = d.status_html.value
    assert "ddpviz.diagnose() of the whole run" in header and "so far:" not in header
    assert "stopped at step 2" in header or "uneven" in header or "waiting" in header, header
    d.close()
