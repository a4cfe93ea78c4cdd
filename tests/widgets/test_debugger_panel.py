"""The dashboard's debugger panel drives the same Debugger functions as Python does: buttons
pause and resume simulated ranks, the status line follows their parks, the inspect row shows
the per-rank table (hostile names escaped), a click on a bucket's bar sets a break there, and
errors show in the panel in words."""

from __future__ import annotations

import html

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
