"""Advice.show(): the advice drawn in the kernel (AdviceView). The dashboard's advice panel is
the TS front end's (extension/src/advice.ts): tests/advise/test_advice_wire.py and the browser
tests."""

from __future__ import annotations

import plotly.graph_objects as go

from ddpviz.advisor import CostModel, Line, advise
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
