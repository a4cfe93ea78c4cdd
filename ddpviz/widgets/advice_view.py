"""AdviceView: the bucket advisor's answer drawn: predicted step time against the bucket cap
(the recorded setting marked), the recommendation in words, the recommended bucket map below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w
import plotly.graph_objects as go

from ddpviz import markup
from ddpviz.widgets.bucket_map import BucketMap

if TYPE_CHECKING:
    from ddpviz.advisor import Advice

_LINES = {"cap": "bucket_cap_mb = cap", "first+cap": "1 MiB first bucket + cap",
          "default": "torch's default", "layers": "one bucket per layer group",
          "user": "your candidates"}


def advice_figure(advice: Advice) -> go.FigureWidget:
    """Predicted step time (ms) against the largest bucket cap (MiB, log scale)."""
    traces: list[Any] = []
    by_family: dict[str, list[Any]] = {}
    for r in advice.rows[1:]:
        by_family.setdefault(r.candidate.family, []).append(r)
    for family, rows in by_family.items():
        rows = sorted(rows, key=lambda r: r.candidate.cap_mb)
        lines = family in ("cap", "first+cap")
        traces.append(go.Scatter(
            x=[r.candidate.cap_mb for r in rows], y=[r.prediction.step_s * 1e3 for r in rows],
            mode="lines+markers" if lines else "markers", name=_LINES.get(family, family),
            text=[markup.fmt("{}<br>{} buckets, exposed comm {:.2f} ms", r.label,
                             len(r.buckets), r.prediction.exposed_s * 1e3) for r in rows],
            hovertemplate="%{text}<br>predicted step %{y:.2f} ms<extra></extra>"))
    cur, rec = advice.current, advice.recommended
    traces.append(go.Scatter(
        x=[cur.candidate.cap_mb], y=[cur.prediction.step_s * 1e3], mode="markers+text",
        marker={"symbol": "star", "size": 14, "color": "black"}, name="current",
        text=["current"], textposition="top center",
        hovertext=[markup.fmt("current ({} buckets)", len(cur.buckets))],
        hovertemplate="%{hovertext}: %{y:.2f} ms<extra></extra>"))
    traces.append(go.Scatter(
        x=[rec.candidate.cap_mb], y=[rec.prediction.step_s * 1e3], mode="markers",
        marker={"symbol": "circle-open", "size": 18, "color": "#d62728", "line": {"width": 2}},
        name="recommended", hovertext=[markup.fmt("recommended: {}", rec.label)],
        hovertemplate="%{hovertext}<br>%{y:.2f} ms<extra></extra>"))
    return go.FigureWidget(data=traces, layout={
        "height": 340, "margin": {"l": 60, "r": 20, "t": 30, "b": 45},
        "xaxis": {"type": "log", "title": {"text": "bucket cap (MiB, largest entry of a list)"}},
        "yaxis": {"title": {"text": "predicted step time (ms)"}},
        "title": {"text": f"{advice.world_size} ranks: predicted step time per bucket setting",
                  "font": {"size": 13}},
        "legend": {"orientation": "h", "y": -0.25}})


class AdviceView(w.VBox):
    """The advice as a widget: `figure` (plotly), `text` (the recommendation), `bucket_map`
    (the recommended setting's BucketMap, after the rebuild where DDP rebuilds)."""

    def __init__(self, advice: Advice, **kwargs: Any) -> None:
        self.advice = advice
        self.text = w.HTML(markup.fmt("<div style='margin:4px 0'><b>{}</b></div>",
                                      advice.reason))
        self.figure = advice_figure(advice)
        plan = advice.recommended.plan
        self.bucket_map = BucketMap(plan, "rebuilt" if plan.rebuilt is not None else "initial")
        heading = w.HTML(markup.fmt(
            "<div style='font-weight:bold;margin-top:6px'>recommended buckets: {}</div>",
            advice.recommended.candidate.setting()))
        super().__init__(children=[self.text, self.figure, heading, self.bucket_map], **kwargs)

