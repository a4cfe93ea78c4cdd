"""The static report as it was before the columnar store (events as objects), kept only as
the oracle test_columnar_exports.py compares ddpviz.report.html with: the sections the report
derives from events itself (per-rank summary, bucket maps, timeline; the findings and the summary
are diagnose()'s and verdict.py's, tested on their own)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.atomic import write_text
from ddpviz.model.spans import Span
from ddpviz.report.html import _PHASE_FILL
from ddpviz.traces.trace import Trace, gc_paused
from ddpviz.units import human_bytes, human_duration
from tests.report.object_exports import object_spans

_TIMELINE_STEPS = 3  # the timeline shows the last few steps that have a backward pass
_MAX_ROWS = 64

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ddd;padding:2px 8px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}.bad{color:#b00020}
.ok{color:#1b7f3b}.muted{color:#777}svg{display:block;margin:.5em 0}
"""
_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")


def render(trace: Trace, *, title: str = "ddpviz report") -> str:
    """The report as one HTML document (a string)."""
    with gc_paused():
        return _render(trace, title)


def _render(trace: Trace, title: str) -> str:
    parts = [markup.fmt("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                        "<title>{}</title><style>{}</style></head><body>", title,
                        markup.Markup(_CSS)),
             markup.fmt("<h1>{}</h1>", title), _ranks(trace), _buckets(trace), _timeline(trace),
             "</body></html>"]
    return "\n".join(parts)


def write_report(trace: Trace, path: str | os.PathLike[str], *, title: str = "ddpviz report"
                 ) -> Path:
    """Write `render(trace)` to `path`. Returns the path."""
    out = Path(path)
    write_text(out, render(trace, title=title))  # atomic: a failed save keeps the old file
    return out


def _e(value: object) -> str:
    return markup.escape(value)


def _table(head: list[str], rows: list[list[object]], text: tuple[int, ...] = (),
           ids: list[str] | None = None) -> str:
    """An HTML table; columns in `text` are left-aligned, the others (numbers) right."""
    cls = [markup.Markup(" class='l'" if i in text else "") for i in range(len(head))]
    heads = markup.join(markup.fmt("<th{}>{}</th>", c, h) for c, h in zip(cls, head, strict=True))
    out: list[str] = [markup.fmt("<table><tr>{}</tr>", heads)]
    for n, row in enumerate(rows):
        cells = markup.join(markup.fmt("<td{}>{}</td>", c, v)
                            for c, v in zip(cls, row, strict=True))
        row_id = markup.fmt(" id='{}'", ids[n]) if ids is not None else ""
        out.append(markup.fmt("<tr{}>{}</tr>", row_id, cells))
    out.append("</table>")
    return markup.Markup("".join(out))  # trusted pieces only: fmt results and literals


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


# --- sections ---------------------------------------------------------------------------------


def _ranks(trace: Trace) -> str:
    spans_by_rank: dict[int, list[Span]] = defaultdict(list)
    for s in object_spans(trace):
        spans_by_rank[s.rank].append(s)
    rows: list[list[object]] = []
    for rank in trace.ranks:
        evs = trace.events(rank)
        seqs = {e.seq for e in evs if type(e) is not ev.EventsDropped}
        holes = (max(seqs) + 1 - len(seqs)) if seqs else 0
        dropped = sum(e.count for e in evs if isinstance(e, ev.EventsDropped))
        steps = max((e.step for e in evs), default=-1) + 1
        duration = evs[-1].t_ns - evs[0].t_ns if evs else 0
        sp = spans_by_rank[rank]
        back = [s.end_ns - s.start_ns for s in sp if s.name == "backward" and s.finished]
        ars = [s.end_ns - s.start_ns for s in sp if s.cat == "allreduce" and s.finished]
        unfinished = sum(1 for s in sp if not s.finished)
        offset, error = trace.clock.get(rank, (0, 0))
        clock = (f"{human_duration(offset)} ± {human_duration(error)}" if error >= 0
                 else f"{human_duration(offset)} (wall clock)")
        rows.append([rank, len(evs), steps, human_duration(duration),
                     human_duration(sum(back) / len(back)) if back else "-", len(ars),
                     human_duration(sum(ars) / len(ars)) if ars else "-", unfinished, dropped,
                     holes, clock])
    table = _table(["rank", "events", "steps", "span", "backward mean", "all-reduces",
                    "all-reduce mean", "unfinished spans", "dropped", "seq holes",
                    "clock offset"], rows)
    return markup.fmt("<section id='ranks'><h2>Per-rank summary</h2>{}</section>", table)


def _param_bytes(trace: Trace) -> dict[int, tuple[str, int]]:
    """Parameter index -> (name, gradient bytes), from the first ParamsBuilt event."""
    built = trace.of_type(ev.ParamsBuilt)
    if not built:
        return {}
    out: dict[int, tuple[str, int]] = {}
    for p in built[0].params:
        numel = 1
        for d in p.shape:
            numel *= d
        size = ev.element_size_of(p)
        out[p.index] = (p.name, numel * size)
    return out


def _buckets(trace: Trace) -> str:
    out = ["<section id='buckets'><h2>Bucket maps</h2>"]
    assigned = trace.of_type(ev.BucketAssigned)
    if not assigned:
        out.append("<p class='muted'>No bucket assignment in this trace.</p></section>")
        return "".join(out)
    params = _param_bytes(trace)
    maps: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for e in assigned:
        maps[(e.rebuilt, e.buckets, e.limits)].append((e.rank, e.step))
    by_kind: dict[bool, set[tuple[Any, ...]]] = defaultdict(set)
    for key in maps:
        by_kind[key[0]].add(key[1])
    for rebuilt, distinct in sorted(by_kind.items()):
        if len(distinct) > 1:
            out.append(markup.fmt("<p class='bad'>Ranks disagree on the {} "
                                  "bucket map: each rank would all-reduce different tensors "
                                  "together.</p>", "rebuilt" if rebuilt else ""))
    for m, ((rebuilt, buckets, limits), where) in enumerate(maps.items()):
        ranks = sorted({r for r, _ in where})
        step = min(s for _, s in where)
        label = f"rebuilt in step {step}" if rebuilt else "at construction"
        out.append(markup.fmt("<h3>Bucket map {} (ranks {}), {} buckets, "
                              "bucket 0 reduced first</h3>", label, ranks, len(buckets)))
        sizes = [sum(params.get(i, ("", 0))[1] for i in b) for b in buckets]
        out.append(_bucket_svg(sizes))
        rows: list[list[object]] = []
        for i, b in enumerate(buckets):
            names = [params.get(p, (str(p), 0))[0] for p in b]
            shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)"
                                            if len(names) > 6 else "")
            limit = human_bytes(limits[i]) if i < len(limits) else "-"
            rows.append([i, len(b), human_bytes(sizes[i]) if params else "?", limit, shown])
        out.append(_table(["bucket", "params", "bytes", "limit", "parameters"], rows[:_MAX_ROWS],
                          text=(4,), ids=[f"bucket-{m}-{i}" for i in range(len(rows))]))
        if len(rows) > _MAX_ROWS:
            out.append(markup.fmt("<p class='muted'>{} more buckets not shown.</p>",
                                  len(rows) - _MAX_ROWS))
    out.append("</section>")
    return "".join(out)


def _bucket_svg(sizes: list[int]) -> str:
    summed = sum(sizes)
    total = summed or len(sizes) or 1
    width, height, x = 1000.0, 28, 0.0
    rects = []
    for i, size in enumerate(sizes):
        w = width * (size if summed else 1) / total
        rects.append(markup.fmt("<rect x='{:.1f}' y='0' width='{:.1f}' height='{}' "
                                "fill='{}' stroke='#fff'><title>bucket {}: "
                                "{}</title></rect>", x, max(w, 1), height,
                                _COLORS[i % len(_COLORS)], i, human_bytes(size)))
        if w > 30:
            rects.append(markup.fmt("<text x='{:.1f}' y='18' font-size='12' fill='#fff'>b{}</text>",
                                    x + 4, i))
        x += w
    return markup.fmt("<svg width='{:.0f}' height='{}' "
                      "role='img' aria-label='bucket sizes'>{}</svg>", width, height,
                      markup.join(rects))


def _timeline(trace: Trace) -> str:
    out = ["<section id='timeline'><h2>All-reduce timeline</h2>"]
    spans = [s for s in object_spans(trace) if s.cat in ("allreduce", "phase")]
    steps = sorted({s.step for s in spans if s.name == "backward"})[-_TIMELINE_STEPS:]
    shown = [s for s in spans if s.step in steps
             and (s.name in _PHASE_FILL or s.cat == "allreduce")]
    if not shown:
        out.append("<p class='muted'>No backward passes or all-reduces in this trace.</p>"
                   "</section>")
        return "".join(out)
    named = markup.join((markup.fmt("<span id='step-{}'>{}</span>", s, s) for s in steps), ", ")
    out.append(markup.fmt("<p>Steps {} on the aligned clock; one band per "
                          "rank: forward, backward and (on sampled steps) the optimizer step on "
                          "top, one row per bucket's all-reduce below. Hatched: never finished."
                          "</p>", named))
    t0 = min(s.start_ns for s in shown)
    t1 = max(s.end_ns for s in shown)
    scale = 900.0 / max(t1 - t0, 1)
    ranks = sorted({s.rank for s in shown})
    buckets = sorted({int(s.lane.rsplit(" ", 1)[1]) for s in shown if s.cat == "allreduce"})
    rank_row = {r: i for i, r in enumerate(ranks)}  # dict lookups: linear in the spans
    bucket_row = {b: i for i, b in enumerate(buckets)}
    row_h, label_w = 12, 90
    band = (1 + len(buckets)) * row_h + 10
    height = band * len(ranks) + 24
    items = ["<defs><pattern id='hatch' width='6' height='6' patternUnits='userSpaceOnUse'>"
             "<path d='M0,6 l6,-6' stroke='#b00020' stroke-width='1'/></pattern></defs>"]
    for ri, rank in enumerate(ranks):
        y0 = ri * band
        items.append(markup.fmt("<text x='0' y='{}' font-size='11'>rank {}</text>", y0 + 10, rank))
        for bi, b in enumerate(buckets):
            items.append(markup.fmt("<text x='40' y='{}' font-size='9' fill='#777'>b{}</text>",
                                    y0 + (bi + 2) * row_h - 2, b))
    for s in shown:
        y0 = rank_row[s.rank] * band
        if s.cat == "allreduce":
            b = int(s.lane.rsplit(" ", 1)[1])
            y = y0 + (bucket_row[b] + 1) * row_h
            color = _COLORS[b % len(_COLORS)]
        else:
            y = y0
            color = _PHASE_FILL[s.name]
        x = label_w + (s.start_ns - t0) * scale
        w = max((s.end_ns - s.start_ns) * scale, 1.0)
        fill = color if s.finished else "url(#hatch)"
        items.append(markup.fmt("<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' "
                                "fill='{}'><title>rank {} step {} {}: {} ms</title></rect>",
                                x, y, w, row_h - 2, fill, s.rank, s.step, s.name,
                                _ms(s.end_ns - s.start_ns)))
    axis_y = band * len(ranks) + 14
    for k in range(5):
        x = label_w + 900 * k / 4
        items.append(markup.fmt("<text x='{:.0f}' y='{}' font-size='10' fill='#555'>{} ms</text>",
                                x, axis_y, _ms((t1 - t0) * k / 4)))
    out.append(markup.fmt("<svg width='{}' height='{}' role='img' "
                          "aria-label='all-reduce timeline'>{}</svg></section>",
                          label_w + 960, height, markup.Markup("".join(items))))
    return "".join(out)
