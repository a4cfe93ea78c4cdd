"""A static, self-contained HTML report of a trace (`ddpviz report TRACE -o report.html`).

One file, no scripts, no CDN: inline CSS, HTML tables and inline SVG. Sections: the findings of
`ddpviz.diagnose` (severity first, each linked to the bucket, step or verification section it
names), a summary of the run, per-rank summary, verification result, bucket maps, all-reduce
timeline. Everything shown comes from the trace's events, so a report can be made long after
the run. It reads the columnar store (ddpviz/traces/columns.py): per-rank counts from the columns,
spans built from the span events' rows only, the rare events (maps, verification) as objects.
What is wrong (differing models, unused parameters, hangs, ...) is diagnose()'s to say: the
report shows its findings and derives none of its own.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ddpviz import events as ev
from ddpviz import markup
from ddpviz._diagnose.diagnosis import diagnose
from ddpviz._diagnose.verdict import (
    SEVERITIES,
    ended_sentence,
    trace_facts,
    verdict,
    verdict_line,
    where,
)
from ddpviz.atomic import write_text
from ddpviz.findings import Finding, recording_advice, sort_findings, value_lines
from ddpviz.model.spans import Span, table_spans
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from ddpviz.traces.fileformat import End
from ddpviz.traces.source import open_run
from ddpviz.traces.trace import Trace, gc_paused
from ddpviz.units import human_bytes, human_duration

_TIMELINE_STEPS = 3  # the timeline shows the last few steps that have a backward pass
_MAX_ROWS = 64

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ddd;padding:2px 8px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}.bad{color:#b00020}
.verdict.errors{color:#b00020}.verdict.warnings{color:#8a5300}.verdict.healthy,.ok{color:#1b7f3b}
.muted{color:#777}svg{display:block;margin:.5em 0}
.finding{border-left:4px solid #ccc;padding:.2em .8em;margin:.6em 0}
.finding.error{border-color:#b00020}.finding.warning{border-color:#c77c02}
.finding h4{margin:.2em 0}.sev{font-size:.8em;text-transform:uppercase;margin-right:.5em}
.finding pre{margin:.2em 0;white-space:pre-wrap}.fix{margin:.2em 0}
"""
_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")


def render(trace: object, *, title: str = "ddpviz report",
           ended: Mapping[int, End] | None = None) -> str:
    """The report as one HTML document (a string).

    Args:
        trace: the run: a Trace, or anything else that counts as one (a `.ddpviz` path or
            folder, a Session, a Run, events: ddpviz/traces/source.py).
        title: the page's title.
        ended: the end records of the ranks' files, by rank: diagnosed the same way (a rank
            that ended cleanly is never named as hung) and said in the summary (which ranks
            ended cleanly, which exited on an uncaught exception, which have no record). None:
            what the run tells (a path's or folder's files read them, as `ddpviz diagnose`).

    Returns:
        The HTML page.
    """
    run = open_run(trace, refusal="the report cannot read")
    with gc_paused():
        return _render(run.as_trace(), title, run.ended if ended is None else ended)


def _render(trace: Trace, title: str, ended: Mapping[int, End] | None = None) -> str:
    tables = trace.columns()
    spans = {r: table_spans(t, trace.clock.get(r, (0, 0))[0]) for r, t in tables.items()}
    all_spans = [s for sp in spans.values() for s in sp]
    findings = sort_findings(diagnose(trace, ended=ended))
    maps = _bucket_maps(trace)
    steps = _timeline_steps(all_spans)
    parts = [markup.fmt("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                        "<title>{}</title><style>{}</style></head><body>", title,
                        markup.Markup(_CSS)),
             markup.fmt("<h1>{}</h1>", title),
             _findings(findings, lambda f: _link(f, maps, steps)), _summary(trace, ended),
             _ranks(trace, tables, spans), _verification(trace, findings), _buckets(trace, maps),
             _timeline(all_spans, steps), "</body></html>"]
    return "\n".join(parts)


def write_report(trace: object, path: str | os.PathLike[str], *, title: str = "ddpviz report",
                 ended: Mapping[int, End] | None = None) -> Path:
    """Write `render(trace, title=..., ended=...)` to `path`. Returns the path."""
    out = Path(path)
    # atomic: a failed save keeps the old file
    write_text(out, render(trace, title=title, ended=ended))
    return out


def _e(value: object) -> str:
    return markup.escape(value)


def _table(head: list[str], rows: list[list[object]], text: tuple[int, ...] = (),
           ids: list[str] | None = None) -> str:
    """An HTML table; columns in `text` are left-aligned, the others (numbers) right; `ids`
    names each row (in-page link targets)."""
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


# meta keys the summary says in words (or that only align clocks)
_META_SAID = {"rank", "started_wall_ns", "wall_ns", "mono_ns", "boot"}


def _summary(trace: Trace, ended: Mapping[int, End] | None = None) -> str:
    facts = trace_facts(trace)
    extra = ", ".join(f"{k}: {v}" for k, v in sorted(trace.meta.items()) if k not in _META_SAID)
    truncated = ("<p class='bad'>The trace file ended in a torn frame: events after the "
                 "writer's last flush are missing.</p>" if trace.truncated else "")
    # which ranks' files say they ended, as `ddpviz diagnose` prints it (when any file does)
    end = markup.fmt("<p id='ended' class='{}'>{}</p>",
                     "bad" if any(e.error for e in ended.values()) else "muted",
                     ended_sentence(facts.ranks, ended)) if ended else ""
    return markup.fmt("<section id='summary'><h2>Summary</h2><p>{}</p>{}{}{}</section>",
                      facts.sentence(), end,
                      markup.fmt("<p class='muted'>{}</p>", extra) if extra else "",
                      markup.Markup(truncated))


def _ranks(trace: Trace, tables: dict[int, Table], spans_by_rank: dict[int, list[Span]]
           ) -> str:
    rows: list[list[object]] = []
    dropped_code = col.CODE[ev.EventsDropped]
    for rank, table in tables.items():
        n = len(table)
        seqs = np.unique(table.seq[table.kind != dropped_code])
        holes = int(seqs[-1]) + 1 - len(seqs) if len(seqs) else 0
        dropped = sum(e.count for e in table.rare(ev.EventsDropped))
        steps = (int(table.step.max()) if n else -1) + 1
        duration = int(table.t[-1] - table.t[0]) if n else 0
        sp = spans_by_rank[rank]
        back = [s.end_ns - s.start_ns for s in sp if s.name == "backward" and s.finished]
        ars = [s.end_ns - s.start_ns for s in sp if s.cat == "allreduce" and s.finished]
        unfinished = sum(1 for s in sp if not s.finished)
        offset, error = trace.clock.get(rank, (0, 0))
        clock = (f"{human_duration(offset)} ± {human_duration(error)}" if error >= 0
                 else f"{human_duration(offset)} (wall clock)")
        rows.append([rank, n, steps, human_duration(duration),
                     human_duration(sum(back) / len(back)) if back else "-", len(ars),
                     human_duration(sum(ars) / len(ars)) if ars else "-", unfinished, dropped,
                     holes, clock])
    html = _table(["rank", "events", "steps", "span", "backward mean", "all-reduces",
                   "all-reduce mean", "unfinished spans", "dropped", "seq holes",
                   "clock offset"], rows)
    return markup.fmt("<section id='ranks'><h2>Per-rank summary</h2>{}</section>", html)


def _verification(trace: Trace, findings: list[Finding]) -> str:
    out = ["<section id='verification'><h2>Model verification across ranks</h2>"]
    passed = trace.of_type(ev.VerificationPassed)
    failed = trace.of_type(ev.VerificationFailed)
    if not passed and not failed:
        out.append("<p class='muted'>No verification events in this trace.</p>")
    if passed:
        digests = sorted({e.digest for e in passed})
        ranks = sorted({e.rank for e in passed})
        out.append(markup.fmt("<p class='ok'>Passed on ranks {} (world size {}; digest {}).</p>",
                              ranks, passed[0].world_size, ", ".join(digests)))
    if failed:
        ranks = sorted({e.rank for e in failed})
        differ = [(i, f) for i, f in enumerate(findings) if f.kind in _MODEL_KINDS]
        out.append(markup.fmt("<p class='bad'>Failed (reported by ranks {}): {} difference{}, "
                              "in the findings above:</p>", ranks, len(differ),
                              "s" if len(differ) != 1 else ""))
        out.append(markup.fmt("<ul>{}</ul>", markup.join(
            markup.fmt("<li><a href='#finding-{}'>{}</a></li>", i, f.title) for i, f in differ)))
    out.append("</section>")
    return "".join(out)


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


def _bucket_maps(trace: Trace) -> dict[tuple[Any, ...], list[tuple[int, int]]]:
    """(rebuilt, buckets, limits) -> the (rank, step) pairs that assigned that map, in order
    of first appearance (the order the report draws them: map m's rows have ids bucket-m-b)."""
    maps: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for e in trace.of_type(ev.BucketAssigned):
        maps[(e.rebuilt, e.buckets, e.limits)].append((e.rank, e.step))
    return maps


def _buckets(trace: Trace, maps: dict[tuple[Any, ...], list[tuple[int, int]]]) -> str:
    out = ["<section id='buckets'><h2>Bucket maps</h2>"]
    if not maps:
        out.append("<p class='muted'>No bucket assignment in this trace.</p></section>")
        return "".join(out)
    params = _param_bytes(trace)
    by_kind: dict[bool, set[tuple[Any, ...]]] = defaultdict(set)
    for key in maps:
        by_kind[key[0]].add(key[1])
    for rebuilt, distinct in sorted(by_kind.items()):
        if len(distinct) > 1:
            out.append(markup.fmt("<p class='bad'>Ranks disagree on the {} "
                                  "bucket map: each rank would all-reduce different tensors "
                                  "together.</p>", "rebuilt" if rebuilt else ""))
    for m, ((rebuilt, buckets, limits), assigned) in enumerate(maps.items()):
        ranks = sorted({r for r, _ in assigned})
        step = min(s for _, s in assigned)
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


# the phases the timeline draws in each rank's top row, and their fill
_PHASE_FILL = {"forward": "#eceff3", "backward": "#d0d7e1", "optimizer step": "#e8dcc2"}


def _timeline_steps(all_spans: list[Span]) -> list[int]:
    """The steps the timeline draws: the last few with a backward pass."""
    return sorted({s.step for s in all_spans if s.name == "backward"})[-_TIMELINE_STEPS:]


def _timeline(all_spans: list[Span], steps: list[int]) -> str:
    out = ["<section id='timeline'><h2>All-reduce timeline</h2>"]
    spans = [s for s in all_spans if s.cat in ("allreduce", "phase", "gradients")]
    shown = [s for s in spans if s.step in steps
             and (s.name in _PHASE_FILL or s.cat in ("allreduce", "gradients"))]
    if not shown:
        out.append("<p class='muted'>No backward passes or all-reduces in this trace.</p>"
                   "</section>")
        return "".join(out)
    named = markup.join((markup.fmt("<span id='step-{}'>{}</span>", s, s) for s in steps), ", ")
    out.append(markup.fmt("<p>Steps {} on the aligned clock; one band per "
                          "rank: forward, backward and (on sampled steps) the optimizer step on "
                          "top, one row per bucket's all-reduce below. Hatched: never finished."
                          "</p>", named))
    summarized = sorted({s.step for s in shown if s.cat == "gradients"})
    if summarized:
        out.append(markup.fmt(
            "<p>Steps {}: per-bucket summaries: a 'gradients ready' row per rank draws each "
            "bucket from its first to its last gradient ready; per-parameter hooks were not "
            "recorded on these steps ({} records them on every step).</p>",
            ", ".join(map(str, summarized)), recording_advice("every=1")))
    t0 = min(s.start_ns for s in shown)
    t1 = max(s.end_ns for s in shown)
    scale = 900.0 / max(t1 - t0, 1)
    ranks = sorted({s.rank for s in shown})
    buckets = sorted({int(s.lane.rsplit(" ", 1)[1]) for s in shown if s.cat == "allreduce"})
    rank_row = {r: i for i, r in enumerate(ranks)}  # dict lookups: linear in the spans
    bucket_row = {b: i for i, b in enumerate(buckets)}
    row_h, label_w = 12, 90
    grads_row = 1 if summarized else 0  # a row of per-bucket gradient summaries
    band = (1 + grads_row + len(buckets)) * row_h + 10
    height = band * len(ranks) + 24
    items = ["<defs><pattern id='hatch' width='6' height='6' patternUnits='userSpaceOnUse'>"
             "<path d='M0,6 l6,-6' stroke='#b00020' stroke-width='1'/></pattern></defs>"]
    for ri, rank in enumerate(ranks):
        y0 = ri * band
        items.append(markup.fmt("<text x='0' y='{}' font-size='11'>rank {}</text>", y0 + 10, rank))
        if grads_row:
            items.append(markup.fmt("<text x='40' y='{}' font-size='9' fill='#777'>grads"
                                    "</text>", y0 + 2 * row_h - 2))
        for bi, b in enumerate(buckets):
            items.append(markup.fmt("<text x='40' y='{}' font-size='9' fill='#777'>b{}</text>",
                                    y0 + (bi + 2 + grads_row) * row_h - 2, b))
    for s in shown:
        y0 = rank_row[s.rank] * band
        if s.cat == "allreduce":
            b = int(s.lane.rsplit(" ", 1)[1])
            y = y0 + (bucket_row[b] + 1 + grads_row) * row_h
            color = _COLORS[b % len(_COLORS)]
        elif s.cat == "gradients":
            b = s.args["bucket"]
            y = y0 + row_h
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


# --- findings ----------------------------------------------------------------------------------

# Finding kinds about the model's description, which the verification section lists
_MODEL_KINDS = ("param_mismatch", "buffer_mismatch", "gpu_shared")
_HEADINGS = {"error": "Errors", "warning": "Warnings",
             "info": "Notes: what was not checked, or needs no fix"}


def _link(f: Finding, maps: dict[tuple[Any, ...], list[tuple[int, int]]],
          steps: list[int]) -> str:
    """The in-page anchor of the section a finding names ('' when the report has none): its
    bucket in the map in force at its step, else its step on the timeline, else verification."""
    if f.bucket >= 0:
        best = None  # the latest map assigned at or before the finding's step, by its ranks
        for m, ((_, buckets, _), assigned) in enumerate(maps.items()):
            at = min(s for _, s in assigned)
            ranks = {r for r, _ in assigned}
            if f.bucket < min(len(buckets), _MAX_ROWS) and (f.step < 0 or at <= f.step) and (
                    not f.ranks or ranks & set(f.ranks)) and (best is None or at >= best[0]):
                best = (at, m)
        if best is not None:
            return f"bucket-{best[1]}-{f.bucket}"
    if f.step in steps:
        return f"step-{f.step}"
    if f.kind in _MODEL_KINDS:
        return "verification"
    return ""


def _finding(i: int, f: Finding, anchor: str) -> str:
    at = where(f)
    place = (markup.fmt(" <a href='#{}'>({})</a>", anchor, at or "see below") if anchor
             else markup.fmt(" <span class='muted'>({})</span>", at) if at else "")
    body = [*value_lines(f.values), *(f"  {d}" for d in f.detail)]
    return markup.fmt("<div class='finding {}' id='finding-{}'><h4><span class='sev'>{}</span>"
                      "{}{}</h4>{}{}</div>", f.severity, i, f.severity, f.title, place,
                      markup.fmt("<pre>{}</pre>", "\n".join(body)) if body else "",
                      markup.fmt("<p class='fix'><b>Fix:</b> {}</p>", f.fix) if f.fix else "")


def _findings(findings: list[Finding], link: Callable[[Finding], str]) -> str:
    """What diagnose() found, errors first, one block per finding; one line when healthy."""
    if not findings:
        return ("<section id='findings'><h2>Findings</h2><p class='verdict healthy ok'><b>"
                "Healthy: no problems found.</b></p></section>")
    out: list[str] = [markup.fmt("<section id='findings'><h2>Findings</h2>"
                                 "<p class='verdict {}'><b>{}</b></p>", verdict(findings),
                                 verdict_line(findings).capitalize())]
    for severity in SEVERITIES:
        group = [(i, f) for i, f in enumerate(findings) if f.severity == severity]
        if group:
            out.append(markup.fmt("<h3>{}</h3>", _HEADINGS[severity]))
            out += [_finding(i, f, link(f)) for i, f in group]
    out.append("</section>")
    return "".join(out)
