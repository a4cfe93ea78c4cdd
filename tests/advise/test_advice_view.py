"""Advice.show() and the dashboard's advice tab."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from ddpviz.advisor import CostModel, Line, advise, timeline
from ddpviz.widgets import Dashboard
from ddpviz.widgets.advice_view import AdviceView
from ddpviz.widgets.bucket_map import BucketMap
from tests.advise.synthetic import linear_stack, run_trace

MEASURED = CostModel({"float32": Line(2e-4, 5e-9)}, "measured")


def _trace(steps: int) -> object:
    return run_trace(linear_stack(8, 512), bucket_cap_mb=256, latency_s=2e-4,
                     seconds_per_byte=5e-9, steps=steps)


def test_show_draws_step_time_against_the_cap_and_the_recommended_map() -> None:
    advice = advise(_trace(6), cost_model=MEASURED)
    view = advice.show()
    assert isinstance(view, AdviceView)
    assert isinstance(view.figure, go.FigureWidget) and isinstance(view.bucket_map, BucketMap)
    by_name = {t.name: t for t in view.figure.data}
    assert {"bucket_cap_mb = cap", "current", "recommended"} <= set(by_name)
    caps = by_name["bucket_cap_mb = cap"]
    assert list(caps.x) == sorted(caps.x) and min(caps.x) == 0.25 and max(caps.x) == 256
    rec = advice.recommended
    assert by_name["recommended"].y[0] == rec.prediction.step_s * 1e3
    assert by_name["current"].y[0] == advice.current.prediction.step_s * 1e3
    assert view.bucket_map.plan is rec.plan
    assert "exposed for" in view.text.value


def test_the_dashboard_offers_advice_from_the_third_step_on() -> None:
    short = Dashboard(_trace(2))
    assert short.advice.layout.display == "none"
    d = Dashboard(_trace(6))
    assert d.advice.layout.display == ""
    assert d.advice.get_title(0) == "advice"
    advice = d.advice.compute()
    assert advice is not None and isinstance(d.advice.view, AdviceView)
    assert d.advice.view in d.advice.body.children
    # the tab asked the advisor about the dashboard's own source
    assert advice.measured_step_s == advise(_trace(6)).measured_step_s


def test_the_tab_shows_why_it_cannot_advise() -> None:
    d = Dashboard(list(_trace(3)))  # 3 steps, but the last has no next forward: 1 usable
    d.refresh()
    assert d.advice.layout.display == ""
    assert d.advice.compute() is not None
    events = [e for e in _trace(3) if e.step < 1]  # constructor and step 0 only
    bad = Dashboard(events)
    assert bad.advice.compute() is None
    assert "ddpviz:" in bad.advice.message.value


def test_the_tab_advises_from_the_dashboard_s_model_without_folding_the_trace_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _trace(6)
    d = Dashboard(trace)
    expected = advise(trace)

    def fold_again(_trace: object) -> None:
        raise AssertionError("the advice tab folded the trace a second time")

    monkeypatch.setattr(timeline, "model_of", fold_again)
    advice = d.advice.compute()
    assert advice is not None
    assert [r.prediction for r in advice.rows] == [r.prediction for r in expected.rows]
