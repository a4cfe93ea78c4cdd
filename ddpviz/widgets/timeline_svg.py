"""The hook timeline drawn as one small SVG string: one lane per rank, one iteration.

Why SVG in an HTML widget rather than plotly: every plotly FigureWidget ships ~5 MB of
plotly.js, and the dashboard's one figure is the BucketMap's. An SVG costs only its own bytes,
and those are bounded by decimation: gradient-hook instants are merged per pixel column (1,000
parameters x 8 ranks draw as at most width x 8 runs), so a redraw stays a few tens of KB at
any scale. Per rank: forward and backward spans, hook ticks (alternate shades per bucket, red
where the firing order departs from the reference), bucket-ready marks, all-reduce spans with
their exposed part in red, unused parameters, and the end of backward compute. On a step
recorded at an aggregated detail level (no per-parameter hooks, one GradsSummarized per
bucket) each bucket is one hatched span from its first to its last gradient ready instead of
ticks. Many ranks
(`render_spread`): the distribution across ranks in a band on top (see hook_spread.py), then
the lanes of the chosen ranks only.

Buckets are clickable where the view listens (svg_view.py): each all-reduce span, each bucket's
band of hooks (a transparent rect from its first gradient to its ready mark) and each bucket of
the distribution band carry `data-bucket`. Where the debugger's ranks are parked (`StopMark`),
each lane gets an orange line at its park and the bucket it stopped before is highlighted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from ddpviz import markup
from ddpviz.model.event_model import StepRecord
from ddpviz.model.hook_analysis import IterationView, Lane
from ddpviz.model.hook_spread import IterationSpread

WIDTH = 860
LABEL = 64
LANE = 52
AXIS = 24
_TICK_COLOURS = ("#4c78a8", "#72b7b2")
_OUT_OF_ORDER = "#d62728"
_AR = "#9ecae9"
_EXPOSED = "#e45756"
MAX_SPANS = 48  # all-reduce spans per lane drawn one by one (with tooltips); more are merged
STOP_COLOUR = "#e36209"  # the debugger's park
_STOP_BUCKET = "#ffd33d"
_MIN_HIT = 8  # pixels: the narrowest click target of a bucket


class StopMark(NamedTuple):
    """Where the debugger's ranks are parked, to mark on the timeline."""

    step: int  # the step they parked in
    point: str  # "forward" | "bucket" | "optimizer_step"
    bucket: int  # the bucket they stopped before (-1 unless point == "bucket")
    times: tuple[tuple[int, int], ...]  # (rank, aligned ns of its park); () when unknown
    label: str  # the point in words: "step 5, before bucket 1's all-reduce"


def _runs(columns: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted pixel columns -> (start, width) runs of adjacent columns."""
    out: list[tuple[int, int]] = []
    for x in sorted(set(columns)):
        if out and x == out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((x, 1))
    return out


def _path(runs: list[tuple[int, int]], y: int, h: int) -> str:
    return "".join(f"M{x} {y}h{w}v{h}h-{w}z" for x, w in runs)


def _ticks_ms(span_ns: int) -> list[float]:
    span_ms = max(span_ns / 1e6, 1e-6)
    step = 10 ** len(str(int(span_ms))) / 10 if span_ms >= 1 else 0.1
    while span_ms / step > 8:
        step *= 2
    while span_ms / step < 3:
        step /= 2
    return [i * step for i in range(int(span_ms / step) + 1)]


def render(view: IterationView, names: Mapping[int, str] | None = None,
           as_of: int | None = None, width: int = WIDTH, stop: StopMark | None = None) -> str:
    """The SVG (a string) for one iteration; empty string when there is nothing to draw.
    `stop`: the debugger's park, marked on every lane."""
    if not view.lanes:
        return ""
    names = names or {}
    axis = _Axis(view, width)
    x, t1 = axis.x, axis.t1
    height = LANE * len(view.lanes) + AXIS
    out: list[str] = [markup.fmt("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
                      "style='font:10px sans-serif'>", width, height)]
    for i, (rank, lane) in enumerate(view.lanes.items()):
        out.append(_lane_svg(lane, i * LANE, x, names, view.order.positions.get(rank, ()),
                             t1))
        if stop is not None:
            out.append(_stop_svg(lane, i * LANE, axis, stop))
    # time axis, ms since the window's start
    y = LANE * len(view.lanes)
    out += axis.svg(y, as_of)
    return "".join(out)


def _lane_svg(lane: Lane, y: int, x: Callable[[int], int], names: Mapping[int, str],
              departures: tuple[int, ...], t_end: int) -> str:
    rec = lane.record
    out: list[str] = [markup.fmt("<text x='2' y='{}' font-weight='bold'>rank {}</text>", y + 20,
                                 lane.rank)]
    if lane.unused:
        listed = ", ".join(names.get(p, f"p{p}") for p in lane.unused[:20])
        n = max(lane.n_unused, len(lane.unused))
        more = f" (+{n - 20})" if n > 20 else ""
        out.append(markup.fmt("<text x='2' y='{}' fill='{}'>✕ {} unused"
                              "<title>unused: {}</title></text>", y + 34, _EXPOSED,
                              n, listed + more))
    # phases: forward (grey), backward (light blue)
    if rec.forward is not None:
        f_end = rec.backward if rec.backward is not None else rec.last
        out.append(markup.fmt("<rect x='{}' y='{}' width='{}' height='8' fill='#ddd'>"
                              "<title>forward</title></rect>", x(rec.forward), y + 2,
                              max(1, x(f_end) - x(rec.forward))))
    if rec.backward is not None:
        b_end = rec.backward_end if rec.backward_end is not None else rec.last
        out.append(markup.fmt("<rect x='{}' y='{}' width='{}' height='8' fill='#c6dbef'>"
                              "<title>backward {:,.3f} ms</title></rect>", x(rec.backward),
                              y + 2, max(1, x(b_end) - x(rec.backward)),
                              (b_end - rec.backward) / 1e6))
    # a click target per bucket under its hooks: first gradient to ready
    if not rec.summarized:
        out.append(_bucket_hits(rec, y, x))
    # gradient hooks: merged per pixel column, one path per shade
    bad = set(departures)
    cols: tuple[list[int], list[int]] = ([], [])
    red: list[int] = []
    for pos, (t, _p, b) in enumerate(rec.grads):
        (red if pos in bad else cols[b & 1]).append(x(t))
    for shade, c in zip(_TICK_COLOURS, cols, strict=True):
        if c:
            # clicks go through to the bucket's target underneath
            out.append(markup.fmt("<path d='{}' fill='{}' pointer-events='none'/>",
                                  _path(_runs(c), y + 13, 10), shade))
    if rec.summarized:
        out.append(_summary_spans(rec, y, x))
    if red:
        out.append(markup.fmt("<path d='{}' fill='{}'>"
                              "<title>{} hook(s) out of the reference order</title></path>",
                              _path(_runs(red), y + 12, 12), _OUT_OF_ORDER, len(red)))
    # bucket ready: small triangles under the ticks (one per pixel column)
    marks = "".join(f"M{c - 3} {y + 24}h6l-3 4z"
                    for c in sorted({x(t) for t in rec.bucket_ready.values()}))
    if marks:
        out.append(markup.fmt("<path d='{}' fill='#333' pointer-events='none'/>", marks))
    if len(lane.allreduce) <= MAX_SPANS:
        out.append(_spans(lane, y, x, t_end))
    else:
        out.append(_merged_spans(lane, y, x, t_end))
    if lane.compute_end is not None and (rec.grads or rec.summaries):
        out.append(markup.fmt("<path d='M{} {}v36' stroke='#555' stroke-dasharray='1 2' "
                              "pointer-events='none'/>", x(lane.compute_end), y + 11))
    return "".join(out)


def _summary_spans(rec: StepRecord, y: int, x: Callable[[int], int]) -> str:
    """An aggregated step: per bucket one span from its first to its last gradient ready
    (alternate shades per bucket, hatched outline: a summary, not per-parameter ticks)."""
    items = sorted(rec.summaries.items())
    if len(items) > MAX_SPANS:
        cols: tuple[set[int], set[int]] = (set(), set())
        for b, s in items:
            cols[b & 1].update(range(x(s.first), max(x(s.first) + 1, x(s.last))))
        n = sum(s.n_grads for _, s in items)
        out: list[str] = [markup.fmt(
            "<g class='ddpviz-grad-summary'><title>{} buckets, {:,} gradients (per-bucket "
            "summaries; per-parameter hooks not recorded)</title>", len(items), n)]
        for shade, c in zip(_TICK_COLOURS, cols, strict=True):
            if c:
                out.append(markup.fmt("<path d='{}' fill='{}' fill-opacity='0.6'/>",
                                      _path(_runs(c), y + 13, 10), shade))
        out.append("</g>")
        return "".join(out)
    rects: list[str] = []
    for b, s in items:
        x0, x1 = x(s.first), x(s.last)
        rects.append(markup.fmt(
            "<rect class='ddpviz-grad-summary' data-bucket='{}' x='{}' y='{}' width='{}' "
            "height='10' fill='{}' fill-opacity='0.6' stroke='{}' stroke-dasharray='2 1'>"
            "<title>bucket {}: {:,} gradients ready over {:,.3f} ms, {:,} bytes (per-bucket "
            "summary; per-parameter hooks not recorded)</title></rect>", b, x0, y + 13,
            max(1, x1 - x0), _TICK_COLOURS[b & 1], _TICK_COLOURS[b & 1], b, s.n_grads,
            (s.last - s.first) / 1e6, s.nbytes))
    return "".join(rects)


def _spans(lane: Lane, y: int, x: Callable[[int], int], t_end: int) -> str:
    """Each all-reduce its own rect with a tooltip, alternating sub-rows; exposed part red."""
    out = []
    for s in lane.allreduce:
        sy = y + 30 + 9 * (s.bucket & 1)
        end = s.end if s.end is not None else t_end
        x0, x1 = x(s.start), x(end)
        took = (f"{(s.end - s.start) / 1e6:,.3f} ms" if s.end is not None else "not done")
        title = (f"bucket {s.bucket}: {s.nbytes:,} bytes {s.dtype}, all-reduce {took}, "
                 f"exposed {s.exposed_ns / 1e6:,.3f} ms")
        dash = markup.Markup("" if s.end is not None else " stroke='#333' stroke-dasharray='3 2'")
        out.append(markup.fmt("<rect data-bucket='{}' x='{}' y='{}' "
                              "width='{}' height='8' fill='{}'{}><title>{}</title></rect>",
                              s.bucket, x0, sy, max(1, x1 - x0), _AR, dash, title))
        if s.exposed_ns and s.end is not None:
            ex0 = x(s.end - s.exposed_ns)
            out.append(markup.fmt("<rect data-bucket='{}' x='{}' y='{}' width='{}' height='8' "
                                  "fill='{}'/>", s.bucket, ex0, sy, max(1, x1 - ex0), _EXPOSED))
    return "".join(out)


def _merged_spans(lane: Lane, y: int, x: Callable[[int], int], t_end: int) -> str:
    """Many buckets: the pixel columns covered by all-reduces (and by their exposed parts)
    per sub-row, as runs; one tooltip for the lane."""
    covered: tuple[set[int], set[int]] = (set(), set())
    exposed: tuple[set[int], set[int]] = (set(), set())
    for s in lane.allreduce:
        end = s.end if s.end is not None else t_end
        covered[s.bucket & 1].update(range(x(s.start), max(x(s.start) + 1, x(end))))
        if s.exposed_ns and s.end is not None:
            exposed[s.bucket & 1].update(range(x(s.end - s.exposed_ns),
                                               max(x(s.end - s.exposed_ns) + 1, x(s.end))))
    done = [s for s in lane.allreduce if s.end is not None]
    title = (f"{len(lane.allreduce)} all-reduces ({len(done)} done), exposed "
             f"{lane.exposed_ns / 1e6:,.3f} ms after the last hook")
    out: list[str] = [markup.fmt("<g><title>{}</title>", title)]
    for row in (0, 1):
        sy = y + 30 + 9 * row
        if covered[row]:
            out.append(markup.fmt("<path d='{}' fill='{}'/>", _path(_runs(covered[row]), sy, 8),
                                  _AR))
        if exposed[row]:
            out.append(markup.fmt("<path d='{}' fill='{}'/>", _path(_runs(exposed[row]), sy, 8),
                                  _EXPOSED))
    out.append("</g>")
    return "".join(out)


def _bucket_extents(rec: StepRecord) -> dict[int, tuple[int, int]]:
    """Per bucket, its first gradient ready to its ready mark (or last gradient), aligned ns."""
    out: dict[int, list[int]] = {}
    for t, _p, b in rec.grads:
        span = out.get(b)
        if span is None:
            out[b] = [t, t]
        elif t < span[0]:
            span[0] = t
        elif t > span[1]:
            span[1] = t
    for b, s in rec.summaries.items():
        out.setdefault(b, [s.first, s.last])
    for b, t in rec.bucket_ready.items():
        span = out.setdefault(b, [t, t])
        span[1] = max(span[1], t)
    return {b: (lo, hi) for b, (lo, hi) in out.items()}


def _bucket_hits(rec: StepRecord, y: int, x: Callable[[int], int]) -> str:
    """Transparent click targets, one per bucket over its hooks (few buckets only; bare:
    they are most of what clickable buckets add, ~90 bytes each)."""
    extents = _bucket_extents(rec)
    if not extents or len(extents) > MAX_SPANS:
        return ""
    out = []
    for b, (lo, hi) in sorted(extents.items()):
        x0, x1 = x(lo), x(hi)
        # a bucket whose hooks fired all at once is still a few pixels wide, to be hit
        grow = max(1, (_MIN_HIT - (x1 - x0)) // 2)
        out.append(markup.fmt(
            "<rect class='ddpviz-bucket-hit' data-bucket='{}' x='{}' y='{}' width='{}' "
            "height='14' fill-opacity='0'/>", b, x0 - grow, y + 11, x1 - x0 + 2 * grow))
    return "".join(out)


def _stop_svg(lane: Lane, y: int, axis: _Axis, stop: StopMark) -> str:
    """The park on one lane: the bucket stopped before highlighted, an orange line at the
    rank's park (at the window's edge when it parked after it). Clicks pass through."""
    rec = lane.record
    t = dict(stop.times).get(lane.rank, rec.last)
    px = min(max(axis.x(t), LABEL), LABEL + axis.plot)
    parts: list[str] = []
    span = _bucket_extents(rec).get(stop.bucket) if stop.point == "bucket" else None
    if span is not None:
        x0, x1 = axis.x(span[0]), axis.x(span[1])
        parts.append(markup.fmt("<rect class='ddpviz-stop-bucket' x='{}' y='{}' width='{}' "
                                "height='18' fill='{}' fill-opacity='0.5' stroke='{}'/>",
                                x0 - 3, y + 9, max(6, x1 - x0 + 6), _STOP_BUCKET, STOP_COLOUR))
    parts.append(markup.fmt("<path d='M{} {}v{}' stroke='{}' stroke-width='2'/>"
                            "<text x='{}' y='{}' fill='{}' font-weight='bold' "
                            "text-anchor='end'>⏸</text>", px, y + 2, LANE - 6, STOP_COLOUR, px - 2,
                            y + 10, STOP_COLOUR))
    return markup.fmt("<g class='ddpviz-stop' data-rank='{}' data-step='{}' data-point='{}' "
                      "data-stop-bucket='{}' pointer-events='none'><title>paused at {} (rank {})"
                      "</title>{}</g>", lane.rank, stop.step, stop.point, stop.bucket,
                      stop.label, lane.rank, markup.join(parts, ""))


SPREAD_ROWS = 72  # height of the distribution band drawn above the chosen ranks' lanes
_BAND = "#c6dbef"
_MEDIAN = "#08306b"


def render_spread(view: IterationView, spread: IterationSpread, shown: Iterable[int],
                  names: Mapping[int, str] | None = None, as_of: int | None = None,
                  width: int = WIDTH, stop: StopMark | None = None) -> str:
    """Many ranks: the distribution across ranks (last hook per rank as a box plot, then per
    bucket the p10-p90 band of ready times and the median all-reduce with its p10-p90 done
    whisker), then one lane per rank in `shown` on the same time axis."""
    if not view.lanes:
        return ""
    names = names or {}
    axis = _Axis(view, width)
    x, t1 = axis.x, axis.t1

    def xr(t: float) -> int:  # relative to t0
        return LABEL + int(t * axis.scale)

    lanes = [view.lanes[r] for r in shown if r in view.lanes]
    height = SPREAD_ROWS + LANE * len(lanes) + AXIS
    out: list[str] = [markup.fmt("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
                                 "style='font:10px sans-serif'>", width, height)]
    out.append(markup.fmt("<text x='2' y='12' font-weight='bold'>{} ranks</text>",
                          spread.n_ranks))
    # last hook per rank: whisker min-max, box p10-p90, median tick
    end = spread.compute_end
    out.append(markup.Markup("<text x='2' y='26'>last hook</text>"))
    if end is not None:
        out.append(markup.fmt(
            "<g><title>last gradient hook across {} ranks: min {:,.3f}, p10 {:,.3f}, median "
            "{:,.3f}, p90 {:,.3f}, max {:,.3f} ms</title><path d='M{} 22h{}' stroke='#555'/>"
            "<rect x='{}' y='17' width='{}' height='10' fill='{}'/>"
            "<path d='M{} 15v14' stroke='{}' stroke-width='2'/></g>", end.n, end.min / 1e6,
            end.p10 / 1e6, end.p50 / 1e6, end.p90 / 1e6, end.max / 1e6, xr(end.min),
            max(1, xr(end.max) - xr(end.min)), xr(end.p10), max(1, xr(end.p90) - xr(end.p10)),
            _BAND, xr(end.p50), _MEDIAN))
    out.append(markup.Markup("<text x='2' y='44'>bucket ready</text>"
                             "<text x='2' y='62'>all-reduce</text>"))
    few = len(spread.buckets) <= MAX_SPANS
    bands: tuple[list[int], list[int]] = ([], [])
    medians: list[int] = []
    ars: tuple[list[int], list[int]] = ([], [])
    for b in spread.buckets:
        row = b.bucket & 1
        if b.ready is not None:
            lo, hi = xr(b.ready.p10), xr(b.ready.p90)
            if few:
                out.append(markup.fmt(
                    "<rect data-bucket='{}' x='{}' y='{}' width='{}' height='7' fill='{}'><title>"
                    "bucket {} ready (ms): p10 {:,.3f}, median {:,.3f}, p90 {:,.3f}; last on rank "
                    "{}</title></rect>", b.bucket, lo, 34 + 8 * row, max(1, hi - lo),
                    _TICK_COLOURS[row], b.bucket,
                    b.ready.p10 / 1e6, b.ready.p50 / 1e6, b.ready.p90 / 1e6, b.latest_rank))
            else:
                bands[row].extend(range(lo, max(lo + 1, hi)))
            medians.append(xr(b.ready.p50))
        if b.launched is not None and b.done is not None:
            lo, hi = xr(b.launched.p50), xr(b.done.p50)
            sy = 52 + 8 * row
            if few:
                took = b.allreduce_ms
                out.append(markup.fmt(
                    "<rect data-bucket='{}' x='{}' y='{}' width='{}' height='7' fill='{}'><title>"
                    "bucket {} all-reduce, median launch to median done; took (ms) median "
                    "{:,.3f}, p90 {:,.3f}; done p10 {:,.3f} - p90 {:,.3f} ms</title></rect>"
                    "<path d='M{} {}h{}' stroke='#333'/>", b.bucket, lo, sy, max(1, hi - lo), _AR,
                    b.bucket, took.p50 if took else 0.0, took.p90 if took else 0.0,
                    b.done.p10 / 1e6, b.done.p90 / 1e6, xr(b.done.p10), sy + 3,
                    max(1, xr(b.done.p90) - xr(b.done.p10))))
            else:
                ars[row].extend(range(lo, max(lo + 1, hi)))
    if not few:
        for row in (0, 1):
            if bands[row]:
                out.append(markup.fmt("<path d='{}' fill='{}'/>",
                                      _path(_runs(bands[row]), 34 + 8 * row, 7),
                                      _TICK_COLOURS[row]))
            if ars[row]:
                out.append(markup.fmt("<path d='{}' fill='{}'/>",
                                      _path(_runs(ars[row]), 52 + 8 * row, 7), _AR))
    if medians:
        ticks = "".join(f"M{c} 32v19" for c in sorted(set(medians)))
        out.append(markup.fmt("<path d='{}' stroke='{}'/>", ticks, _MEDIAN))
    for i, lane in enumerate(lanes):
        out.append(_lane_svg(lane, SPREAD_ROWS + i * LANE, x, names,
                             view.order.positions.get(lane.rank, ()), t1))
        if stop is not None:
            out.append(_stop_svg(lane, SPREAD_ROWS + i * LANE, axis, stop))
    y = SPREAD_ROWS + LANE * len(lanes)
    out += axis.svg(y, as_of)
    return "".join(out)


class _Axis:
    """One window's time axis (both renderings): nanosecond times -> x pixels."""

    __slots__ = ("plot", "scale", "t0", "t1")

    def __init__(self, view: IterationView, width: int) -> None:
        self.t0, self.t1 = view.t0, max(view.t1, view.t0 + 1)
        self.plot = width - LABEL - 8
        self.scale = self.plot / (self.t1 - self.t0)

    def x(self, t: float) -> int:
        return LABEL + int((t - self.t0) * self.scale)

    def svg(self, y: int, as_of: int | None) -> list[str]:
        """The axis under the lanes at height `y` (ms since the window's start), the as-of
        marker when it falls in the window, and the closing tag."""
        t0, t1 = self.t0, self.t1
        out: list[str] = [markup.fmt("<path d='M{} {}h{}' stroke='#999'/>", LABEL, y + 2,
                                     self.plot)]
        for ms in _ticks_ms(t1 - t0):
            tx = self.x(t0 + int(ms * 1e6))
            out.append(markup.fmt("<path d='M{} {}v4' stroke='#999'/>"
                                  "<text x='{}' y='{}' text-anchor='middle'>{:g} ms</text>",
                                  tx, y + 2, tx, y + 16, ms))
        if as_of is not None and t0 <= as_of <= t1:
            out.append(markup.fmt("<path d='M{} 0v{}' stroke='#000' stroke-dasharray='2 2'/>",
                                  self.x(as_of), y))
        out.append("</svg>")
        return out
