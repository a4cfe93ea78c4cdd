"""The dashboard's debugger panel drives the same Debugger functions as Python does: buttons
pause and resume simulated ranks, the status line follows their parks, the inspect row shows
the per-rank table (hostile names escaped), a click on a bucket's bar sets a break there, and
errors show in the panel in words."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from plotly.callbacks import Points

from ddpviz.debugger import protocol as p
from ddpviz.debugger.client import Debugger
from ddpviz.widgets.bucket_figure import bar_traces
from ddpviz.widgets.dashboard import Dashboard
from ddpviz.widgets.debugger_panel import DebuggerPanel
from tests.debugger.fake_ranks import FakeRank, FakeSession, bucket_assigned, params_built
from tests.polling import eventually
from tests.widgets.streams import synthetic_run

HOSTILE = "<script>alert(1)</script>"


def fake(n: int = 2) -> tuple[FakeSession, Debugger]:
    names = [HOSTILE, "fc.bias"]
    ranks = {r: FakeRank(r, {(HOSTILE, "grad"): np.full((3, 2), float(r), np.float32),
                             ("fc.bias", "grad"): np.ones(2, np.float32)}) for r in range(n)}
    history = [e for r in range(n) for e in (params_built(r, names, [(3, 2), (2,)]),
                                             bucket_assigned(r, -1, ((1, 0),)))]
    session = FakeSession(ranks, history)
    return session, Debugger(session, timeout=2.0)  # type: ignore[arg-type]


def test_buttons_pause_inspect_and_resume() -> None:
    session, dbg = fake()
    panel = DebuggerPanel(dbg)
    assert "running" in panel.status_html.value
    assert HOSTILE in panel.inspect_name.options
    panel.pause_button.click()
    assert isinstance(session.collector.sent[-1][1][0], p.Pause)
    assert eventually(lambda: "paused at step 3" in panel.status_html.value, 5)
    panel.inspect_name.value = HOSTILE
    panel.inspect_what.value = "grad"
    panel.inspect_button.click()
    table = panel.result_html.value
    assert panel.result is not None and panel.result.comparison.groups
    assert [g.ranks for g in panel.result.comparison.groups] == [(1,), (0,)]
    assert "<script>" not in table and "&lt;script&gt;" in table
    assert panel.message_html.value == ""
    panel.resume_button.click()
    assert "running" in panel.status_html.value
    session.close()


def test_errors_show_in_the_panel_escaped() -> None:
    session, dbg = fake()
    panel = DebuggerPanel(dbg)
    panel.inspect_name.value = "<b>nope</b>"
    panel.inspect_button.click()  # a bad name is refused before anything is sent
    assert "did you mean" in panel.message_html.value or "no parameter" in \
        panel.message_html.value
    assert "<b>nope</b>" not in panel.message_html.value
    panel.inspect_name.value = HOSTILE
    panel.inspect_button.click()  # not paused: says how
    assert "dbg.pause() then dbg.wait()" in panel.message_html.value
    panel.break_where.value = "forward"
    panel.break_step.value = 7
    panel.break_button.click()
    assert dbg.breaks == (p.BreakAt(step=7, where="forward", bucket=-1),)
    assert "step 7 forward" in panel.breaks_html.value
    panel.clear_button.click()
    assert dbg.breaks == () and "none" in panel.breaks_html.value
    session.close()


@pytest.mark.parametrize("row", [0, -1])
def test_a_click_on_a_bucket_sets_a_break_before_it(row: int) -> None:
    events = synthetic_run(2, 8, 2, cap=1100)
    session = FakeSession({r: FakeRank(r, {}) for r in range(2)}, events)
    dbg = Debugger(session, timeout=2.0)  # type: ignore[arg-type]
    d = Dashboard(events, debugger=dbg)
    assert d.debugger_panel is not None and d.buckets.bucket_map is not None
    d.debugger_panel.break_step.value = 5
    trace = next(t for t in bar_traces(d.buckets.bucket_map.figure) if len(t.y))
    label = str(trace.y[row])
    trace._dispatch_on_click(Points([0], [trace.x[row]], [label]), None)
    bucket = int(label.split(" · ")[0])
    last = session.collector.sent[-1][1][0]
    assert isinstance(last, p.SetBreaks)
    assert last.breaks == (p.BreakAt(step=5, where="bucket", bucket=bucket),)
    said = html.unescape(d.debugger_panel.message_html.value)
    assert f"before bucket {bucket}'s all-reduce at step 5" in said
    session.close()


def _dashboard(steps: int = 6, seen: int | None = None
               ) -> tuple[FakeSession, Debugger, Dashboard]:
    """A dashboard of `steps` steps with a Debugger over fake ranks that said steps up to
    `seen` only (default: all), so a break at a step the dashboard drew is still allowed."""
    events = synthetic_run(2, 8, steps, cap=1100)
    said = [e for e in events if seen is None or e.step <= seen]
    session = FakeSession({r: FakeRank(r, {}) for r in range(2)}, said)
    dbg = Debugger(session, timeout=2.0)  # type: ignore[arg-type]
    return session, dbg, Dashboard(events, debugger=dbg)


def test_a_click_on_a_bucket_in_the_timeline_sets_a_break_before_it() -> None:
    session, _dbg, d = _dashboard()
    assert d.debugger_panel is not None and d.timeline.view is not None
    svg = d.timeline.svg_html.value
    buckets = {b.bucket for b in d.timeline.view.buckets}
    assert len(buckets) > 1
    # every bucket of every lane is a click target: its hooks and its all-reduce
    for b in buckets:
        assert svg.count(f"class='ddpviz-bucket-hit' data-bucket='{b}'") == 2
        spans = re.findall(rf"<rect data-bucket='{b}' x='\d+' y='\d+' width='\d+' height='8' "
                           r"fill='#9ecae9'", svg)
        assert len(spans) == 2
    assert d.timeline.svg_html.clickable
    d.debugger_panel.break_step.value = 5
    bucket = max(buckets)
    sent = len(session.collector.sent)
    for bad in ({"bucket": True}, {"bucket": -1}, {"bucket": 1 << 40}, {"bucket": "1"},
                {"bucket": 1.5}, {}, "bucket", None):
        d.timeline.svg_html._message(None, bad, [])  # what a browser could send
    assert len(session.collector.sent) == sent  # none of it is a bucket: nothing sent
    d.timeline.svg_html._message(None, {"bucket": bucket}, [])  # the ESM's message
    last = session.collector.sent[-1][1][0]
    assert isinstance(last, p.SetBreaks)
    assert last.breaks == (p.BreakAt(step=5, where="bucket", bucket=bucket),)
    said = html.unescape(d.debugger_panel.message_html.value)
    assert f"before bucket {bucket}'s all-reduce at step 5" in said
    assert f"step 5 bucket {bucket}" in d.debugger_panel.breaks_html.value
    d.close()
    session.close()


def test_without_a_debugger_a_click_on_the_timeline_does_nothing() -> None:
    d = Dashboard(synthetic_run(2, 8, 2, cap=1100))
    assert d.debugger_panel is None
    assert not d.timeline.svg_html.clickable  # the browser shows no pointer either
    d.timeline.svg_html.click(0)
    assert list(d.timeline.svg_html.clicks) == [0]  # heard, and nothing listens
    d.close()


def _stop_marks(svg: str) -> list[str]:
    return re.findall(r"<g class='ddpviz-stop' [^>]*>", svg)


def test_the_paused_step_is_marked_and_the_mark_cleared_on_resume() -> None:
    session, dbg, d = _dashboard(seen=3)
    panel = d.debugger_panel
    assert panel is not None and d.buckets.bucket_map is not None and d.controls is not None
    d.controls.follow.value = True  # following the run's end, as a live dashboard does
    panel.break_step.value = 4
    buckets = sorted({b.bucket for b in d.timeline.view.buckets})  # type: ignore[union-attr]
    bucket = buckets[1]
    d.timeline.svg_html.click(bucket)  # the fake ranks park there at once
    assert eventually(lambda: dbg.stop is not None and len(dbg.stop.ranks) == 2, 5)
    d.refresh()
    # the timeline shows step 4 (not the run's last, 5), an orange mark on each lane, the
    # bucket's hooks highlighted, and the header says where
    assert d.timeline.step == 4
    svg = d.timeline.svg_html.value
    marks = _stop_marks(svg)
    assert len(marks) == 2
    for r, mark in enumerate(marks):
        assert (f"data-rank='{r}' data-step='4' data-point='bucket' "
                f"data-stop-bucket='{bucket}'") in mark
    assert svg.count("class='ddpviz-stop-bucket'") == 2
    header = html.unescape(d.timeline.header_html.value)
    assert f"⏸ paused at step 4, before bucket {bucket}'s all-reduce" in header
    # the bucket map highlights the bucket's row (rows in reduction order, bucket 0 on top)
    shapes = d.buckets.bucket_map.figure.layout.shapes
    assert d.buckets.bucket_map.marked == bucket and len(shapes) == 1
    rows = [b.index for b in d.buckets.bucket_map.shown_buckets()]
    assert shapes[0].y0 == rows.index(bucket) - 0.5 and shapes[0].y1 == rows.index(bucket) + 0.5
    assert "paused at step 4" in panel.status_html.value
    d.controls.show_step(2)  # another step picked by hand: shown, and not marked
    d.refresh()
    assert d.timeline.step == 2 and _stop_marks(d.timeline.svg_html.value) == []
    d.controls.follow.value = True  # (drawn once the live bytes budget allows)
    assert eventually(lambda: d.refresh() or d.timeline.step == 4, 10)
    assert len(_stop_marks(d.timeline.svg_html.value)) == 2
    panel.resume_button.click()
    assert eventually(lambda: dbg.stop is None, 5)
    d.refresh()
    assert d.timeline.step == 5  # following the run again
    assert _stop_marks(d.timeline.svg_html.value) == []
    assert "ddpviz-stop-bucket" not in d.timeline.svg_html.value
    assert "paused" not in d.timeline.header_html.value
    assert d.buckets.bucket_map.marked is None and d.buckets.bucket_map.figure.layout.shapes == ()
    d.close()
    session.close()


def test_a_pause_before_a_forward_marks_the_end_of_the_step_before() -> None:
    session, dbg, d = _dashboard(steps=3)  # steps 0-2 ran; the fake ranks pause at step 3
    assert d.debugger_panel is not None and d.controls is not None
    d.controls.follow.value = True
    d.debugger_panel.pause_button.click()
    assert eventually(lambda: dbg.stop is not None and len(dbg.stop.ranks) == 2, 5)
    d.refresh()
    assert d.timeline.step == 2
    marks = _stop_marks(d.timeline.svg_html.value)
    assert len(marks) == 2 and all("data-step='3' data-point='forward'" in m for m in marks)
    assert "ddpviz-stop-bucket" not in d.timeline.svg_html.value
    header = html.unescape(d.timeline.header_html.value)
    assert "⏸ paused at step 3, before DDP's forward (drawn: step 2, the last one run)" in header
    assert d.buckets.bucket_map is not None and d.buckets.bucket_map.marked is None
    d.close()
    session.close()
