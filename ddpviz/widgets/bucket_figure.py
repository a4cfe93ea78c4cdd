"""The BucketMap's one plotly FigureWidget: every parameter a horizontal bar segment.

Each FigureWidget ships plotly.js (~5 MB) in its state, so a map owns exactly one, with a fixed
set of traces: one bar trace per colour of the palette (bar width = bytes, `base` = byte offset,
row = bucket) and one scatter trace for all limit markers. A redraw is a single
`batch_update` of whole arrays, however many parameters the model has.
See [Note: bar colours] for why colours are traces rather than per-bar values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from ddpviz.widgets.bucket_segments import (
    LimitMarker,
    Segment,
    hover_text,
    limit_hover_text,
)

# [Note: bar colours]
# Neighbouring parameters alternate between two shades of their dtype's colour, so boundaries
# show without outlines. Per-bar colours (a list of colours, or numbers into a colorscale) make
# plotly.js style every bar on its own: with 10,000 bars, headless Chromium took ~2.3 s per
# update that way against ~0.7 s with a uniform colour per trace. So each palette colour is
# its own bar trace; a segment goes to the trace of its colour.
_DTYPE_SHADES = ("float32", "bfloat16", "float16", "float64")  # anything else: the last pair
PALETTE = ("#4c78a8", "#9ecae9", "#f58518", "#ffbf79", "#54a24b", "#88d27a",
           "#b279a2", "#d6a5c9", "#79706e", "#bab0ac")
_LIMIT_COLOR = "#d62728"
_OUTLINE_MAX_SEGMENTS = 400  # above this, white outlines would hide the bars themselves
_ROW_PX, _BASE_PX, _MAX_PX = 30, 150, 900
# A 900 px figure cannot show more rows or bars than this: past it, the first buckets (in
# reduction order) are drawn and the title says how many are left out.
MAX_DRAWN_BUCKETS, MAX_DRAWN_SEGMENTS = 1_000, 20_000


def bar_traces(fig: go.FigureWidget) -> list[Any]:
    """The figure's bar traces (one per palette colour, possibly empty)."""
    return list(fig.data[: len(PALETTE)])


def limit_trace(fig: go.FigureWidget) -> Any:
    """The figure's scatter trace of limit markers."""
    return fig.data[len(PALETTE)]


def _shown(segs: Sequence[Segment], markers: Sequence[LimitMarker], rows: Sequence[str],
           title: str, message: str | None
           ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(bar traces, limit trace, layout) properties for one picture."""
    segs, markers, rows, title = _drawable(segs, markers, rows, title)
    finite = [m.limit for m in markers]
    right = max([s.byte_offset + s.nbytes for s in segs] + finite + [1]) * 1.06
    annotations: list[dict[str, Any]] = []
    if message:
        annotations.append({"text": message, "xref": "paper", "yref": "paper", "x": 0.5,
                            "y": 0.5, "showarrow": False, "font": {"size": 14}})
    by_colour: list[list[Segment]] = [[] for _ in PALETTE]
    for s, colour in zip(segs, _colours(segs, right / 400), strict=True):
        by_colour[colour].append(s)
    outline = 0.5 if len(segs) <= _OUTLINE_MAX_SEGMENTS else 0
    # numpy arrays: plotly validates and diffs them in bulk, lists element by element. The
    # texts are plain str: plotly deep-copies object arrays item by item (twice when the
    # figure is made), and a str subclass (markup.Markup) is copied through pickle's protocol,
    # ~10x slower (0.2 s for 10,000 parameters)
    bars = [{
        "x": np.fromiter((s.nbytes for s in group), np.int64, len(group)),
        "base": np.fromiter((s.byte_offset for s in group), np.int64, len(group)),
        "y": np.array([str(s.label) for s in group], dtype=object),
        "hovertext": np.array([str(hover_text(s)) for s in group], dtype=object),
        "marker": {"line": {"width": outline}},
    } for group in by_colour]
    limits = {"x": finite, "y": [m.label for m in markers],
              "hovertext": [str(limit_hover_text(m)) for m in markers]}
    layout = {
        "title": {"text": title},
        "height": min(_MAX_PX, _BASE_PX + _ROW_PX * max(len(rows), 1)),
        "xaxis": {"range": [0, right], **_byte_ticks(right), "visible": bool(rows)},
        "yaxis": {"categoryorder": "array", "categoryarray": list(rows), "visible": bool(rows)},
        "annotations": annotations,
    }
    return bars, limits, layout


def _drawable(segs: Sequence[Segment], markers: Sequence[LimitMarker], rows: Sequence[str],
              title: str) -> tuple[Sequence[Segment], Sequence[LimitMarker], Sequence[str], str]:
    """The first rows that fit MAX_DRAWN_BUCKETS and MAX_DRAWN_SEGMENTS (at least one), their
    segments and markers, and the title saying what was left out. Linear in the segments."""
    if len(rows) <= MAX_DRAWN_BUCKETS and len(segs) <= MAX_DRAWN_SEGMENTS:
        return segs, markers, rows, title
    per_row: dict[str, int] = {}
    for s in segs:
        per_row[s.label] = per_row.get(s.label, 0) + 1
    kept, total = 0, 0
    for label in rows[:MAX_DRAWN_BUCKETS]:
        total += per_row.get(label, 0)
        if kept and total > MAX_DRAWN_SEGMENTS:
            break
        kept += 1
    keep = set(rows[:kept])
    title = (f"{title} (first {kept:,} of {len(rows):,} buckets drawn: the figure cannot "
             "show more; print(plan) lists all)")
    return ([s for s in segs if s.label in keep], [m for m in markers if m.label in keep],
            rows[:kept], title)


def new_figure(segs: Sequence[Segment], markers: Sequence[LimitMarker], rows: Sequence[str],
               title: str, message: str | None = None) -> go.FigureWidget:
    """The map's figure, created with its first picture (so saved widget state shows it)."""
    bars, limits, layout = _shown(segs, markers, rows, title, message)
    for props, colour in zip(bars, PALETTE, strict=True):
        props.update(type="bar", orientation="h", width=0.7, showlegend=False,
                     hovertemplate="%{hovertext}<extra></extra>")
        props["marker"].update(color=colour)
        props["marker"]["line"].update(color="white")
    limits.update(type="scatter", mode="markers", name="size limit",
                  hovertemplate="%{hovertext}<extra></extra>",
                  marker={"symbol": "line-ns-open", "size": 26, "color": _LIMIT_COLOR,
                          "line": {"width": 3, "color": _LIMIT_COLOR}})
    fig = go.FigureWidget(data=[*bars, limits], layout={
        "showlegend": False, "barmode": "overlay", "bargap": 0.25, "hovermode": "closest",
        "margin": {"l": 10, "r": 20, "t": 50, "b": 40}, "plot_bgcolor": "#fafafa",
        "xaxis": {"title": {"text": "bytes in the bucket's flat buffer"},
                  "rangemode": "tozero", "zeroline": True},
        "yaxis": {"title": {"text": "bucket"}, "type": "category", "autorange": "reversed",
                  "automargin": True},
    })
    fig.update_layout(layout)
    return fig


def _colours(segs: Sequence[Segment], visible_bytes: float) -> list[int]:
    """Palette positions: the dtype's pair, alternating dark/light within a bucket. Only
    segments wide enough to see advance the alternation: weights and biases interleave, and a
    plain alternation would paint every weight the same shade."""
    pairs = {d: 2 * i for i, d in enumerate(_DTYPE_SHADES)}
    other = len(PALETTE) - 2
    colours, previous_bucket, k = [], -1, 0
    for s in segs:
        if s.bucket != previous_bucket:
            k, previous_bucket = 0, s.bucket
        colours.append(pairs.get(s.dtype, other) + k % 2)
        k += s.nbytes >= visible_bytes
    return colours


def _byte_ticks(right: float) -> dict[str, Any]:
    """About 4-8 x-axis ticks at round binary sizes (1 MiB, 512 KiB, ...), labelled like the
    tables."""
    step = 1
    while right / step > 8:
        step *= 2
    ticks = list(range(0, int(right) + 1, step))
    return {"tickvals": ticks, "ticktext": [_tick_text(t) for t in ticks]}


def _tick_text(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def row_highlight(row: int, note: str) -> dict[str, Any]:
    """A shape over row `row` (a bucket, in reduction order, 0 on top) with `note` on it."""
    return {"type": "rect", "name": "ddpviz-stop", "xref": "paper", "x0": 0, "x1": 1,
            "yref": "y", "y0": row - 0.5, "y1": row + 0.5, "layer": "below",
            "fillcolor": "rgba(255, 211, 61, 0.45)", "line": {"color": "#e36209", "width": 2},
            "label": {"text": note, "textposition": "top right",
                      "font": {"color": "#e36209", "size": 12}}}


def draw(fig: go.FigureWidget, segs: Sequence[Segment], markers: Sequence[LimitMarker],
         rows: Sequence[str], title: str, message: str | None = None) -> None:
    """Replace everything the figure shows, in one batch.

    Args:
        segs: the bars; rows: the bucket labels, top to bottom (reduction order).
        message: shown across the plot instead of bars (e.g. "no rebuilt map").
    """
    bars, limits, layout = _shown(segs, markers, rows, title, message)
    with fig.batch_update():
        for trace, props in zip(bar_traces(fig), bars, strict=True):
            trace.update(props)
        limit_trace(fig).update(limits)
        # update() merges lists element-wise (an empty list changes nothing): assign instead
        fig.layout.annotations = layout.pop("annotations")
        fig.layout.update(layout)
