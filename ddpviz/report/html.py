"""A self-contained HTML report of a trace (`ddpviz report TRACE -o report.html`).

One file, no CDN, nothing fetched: inline CSS, HTML tables and inline SVG. Sections: the
findings of `ddpviz.diagnose` (severity first, each linked to the bucket, step or verification
section it names), a summary of the run, per-rank summary, verification result, bucket maps,
all-reduce timeline, all readable without scripts; then the interactive view, the trace
viewer's own panels drawn by the one script the page holds (report/interactive.py).
Everything shown comes from the trace's events, so a report can be made long after the run. It
reads the columnar store (ddpviz/traces/columns.py): per-rank counts from the columns, spans
built from the span events' rows only, the rare events (maps, verification) as objects.
What is wrong (differing models, unused parameters, hangs, ...) is diagnose()'s to say: the
report shows its findings and derives none of its own.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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
from ddpviz.findings import Finding, format_ranks, sort_findings, value_lines
from ddpviz.model.spans import table_spans
from ddpviz.report.interactive import interactive_section
from ddpviz.report.ranks import ranks_section
from ddpviz.report.timeline import (
    COLORS,
    computed_marks,
    last_activity,
    timeline_section,
    timeline_steps,
)
from ddpviz.traces.fileformat import End
from ddpviz.traces.source import RunSource, open_run
from ddpviz.traces.trace import Trace, gc_paused
from ddpviz.units import UNLIMITED, human_bytes

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
.wide{overflow-x:auto}td{white-space:nowrap}ol.notes{font-size:.9em;color:#555;margin-top:0}
ul.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.3em 1.2em;font-size:.9em}
ul.legend li{display:flex;align-items:center;gap:.4em}ul.legend svg{display:inline;margin:0}
figure.step{margin:.8em 0}figure.step figcaption{font-weight:600}svg{max-width:100%}
"""

def render(trace: object, *, title: str = "ddpviz report",
           ended: Mapping[int, End] | None = None, interactive: bool = True) -> str:
    """The report as one HTML document (a string).

    Args:
        trace: the run: a Trace, or anything else that counts as one (a `.ddpviz` path or
            folder, a Session, a Run, events: ddpviz/traces/source.py).
        title: the page's title.
        ended: the end records of the ranks' files, by rank: diagnosed the same way (a rank
            that ended cleanly is never named as hung) and said in the summary (which ranks
            ended cleanly, which exited on an uncaught exception, which have no record). None:
            what the run tells (a path's or folder's files read them, as `ddpviz diagnose`).
        interactive: add the interactive view (the viewer's panels over the embedded run:
            report/interactive.py); False: the page holds no script.

    Returns:
        The HTML page.
    """
    run = open_run(trace, refusal="the report cannot read")
    with gc_paused():
        return _render(trace if interactive else None, run, title,
                       run.ended if ended is None else ended)


def _render(source: object, run: RunSource, title: str,
            ended: Mapping[int, End] | None = None) -> str:
    """The page; `source` None: without the interactive view."""
    trace = run.as_trace()
    tables = trace.columns()
    spans = {r: table_spans(t, trace.clock.get(r, (0, 0))[0]) for r, t in tables.items()}
    all_spans = [s for sp in spans.values() for s in sp]
    # diagnose()'s of the run itself (a folder's rings included), as `ddpviz diagnose` says it
    findings = sort_findings(diagnose(run, ended=ended))
    maps = _bucket_maps(trace)
    offsets = {r: trace.clock.get(r, (0, 0))[0] for r in tables}
    marks = computed_marks(tables, offsets)
    steps, left_out = timeline_steps(all_spans, marks, findings)
    ends = {r: int(t.t[-1]) + offsets[r] for r, t in tables.items() if len(t)}
    parts = [markup.fmt("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                        "<title>{}</title><style>{}</style></head><body>", title,
                        markup.Markup(_CSS)),
             markup.fmt("<h1>{}</h1>", title),
             _findings(findings, lambda f: _link(f, maps, steps)), _summary(trace, ended),
             ranks_section(tables, spans, trace.clock), _verification(trace, findings),
             _buckets(trace, maps),
             timeline_section(all_spans, marks, findings, steps, left_out,
                              last_activity(all_spans, marks), ends, _not_built(trace)),
             "" if source is None else interactive_section(source, run, findings),
             "</body></html>"]
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


def _verification(trace: Trace, findings: list[Finding]) -> str:
    out = ["<section id='verification'><h2>Model verification across ranks</h2>"]
    passed = trace.of_type(ev.VerificationPassed)
    failed = trace.of_type(ev.VerificationFailed)
    if not passed and not failed:
        out.append(_unverified(trace))
    if passed:
        digests = sorted({e.digest for e in passed})
        ranks = sorted({e.rank for e in passed})
        out.append(markup.fmt(
            "<p class='ok'>Compared across ranks before DDP was built (parameter names, order, "
            "shapes, strides, dtypes, devices, requires_grad, sparse gradients; buffer names, "
            "order, shapes, dtypes, devices): the same on {} (world size {}; model digest {}).</p>",
            format_ranks(ranks), passed[0].world_size, ", ".join(digests)))
    if failed:
        ranks = sorted({e.rank for e in failed})
        differ = [(i, f) for i, f in enumerate(findings) if f.kind in _MODEL_KINDS]
        out.append(markup.fmt("<p class='bad'>Failed (reported by {}): {} difference{}, "
                              "in the findings above:</p>", format_ranks(ranks), len(differ),
                              "s" if len(differ) != 1 else ""))
        out.append(markup.fmt("<ul>{}</ul>", markup.join(
            markup.fmt("<li><a href='#finding-{}'>{}</a></li>", i, f.title) for i, f in differ)))
    out.append("</section>")
    return "".join(out)


def _unverified(trace: Trace) -> str:
    """What was and was not checked when no comparison was recorded."""
    built = sorted({e.rank for e in trace.of_type(ev.ParamsBuilt)})
    started = sorted({e.rank for e in trace.of_type(ev.VerificationStarted)})
    if started:
        return markup.fmt("<p class='bad'>The comparison of the models across ranks started on "
                          "{} and no result was recorded: a rank stopped inside it.</p>",
                          format_ranks(started))
    if not built:
        return ("<p class='muted'>No model comparison and no DDP construction were recorded in "
                "this trace.</p>")
    return markup.fmt(
        "<p>No comparison of the models across ranks was recorded (ddpviz compares them "
        "before DDP is built under <code>ddpviz record</code> and in "
        "<code>ddpviz.DistributedDataParallel</code>; <code>watch(ddp)</code> attaches to a DDP "
        "torch had already built). torch's constructor checked, against rank 0, the number of "
        "parameters and each one's size and stride, and returned on {}. Not compared: "
        "parameter names and dtypes, requires_grad, buffers.</p>",
        format_ranks(built))


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
        out.append(markup.fmt("<p class='muted'>No bucket assignment in this trace.{}</p>"
                              "</section>", _not_built(trace)))
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
        out.append(markup.fmt("<h3>Bucket map {} ({}), {} bucket{}{}</h3>", label,
                              format_ranks(ranks), len(buckets), "s" if len(buckets) != 1 else "",
                              ", bucket 0 reduced first" if len(buckets) > 1 else ""))
        sizes = [sum(params.get(i, ("", 0))[1] for i in b) for b in buckets]
        out.append(_bucket_svg(sizes))
        rows: list[list[object]] = []
        for i, b in enumerate(buckets):
            names = [params.get(p, (str(p), 0))[0] for p in b]
            shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)"
                                            if len(names) > 6 else "")
            rows.append([i, len(b), human_bytes(sizes[i]) if params else "?",
                         _cap(limits[i]) if i < len(limits) else "not recorded", shown])
        out.append(_table(["bucket", "params", "size (its gradients)", "cap", "parameters"],
                          rows[:_MAX_ROWS],
                          text=(4,), ids=[f"bucket-{m}-{i}" for i in range(len(rows))]))
        if len(rows) > _MAX_ROWS:
            out.append(markup.fmt("<p class='muted'>{} more buckets not shown.</p>",
                                  len(rows) - _MAX_ROWS))
    out.append(markup.fmt(
        "<p class='muted'>cap: the byte limit DDP filled a bucket up to before starting the "
        "next: bucket_cap_mb (25 MiB by default); with the default, the first bucket of the "
        "rebuilt map has DDP's first-bucket cap, 1 MiB, so the first all-reduce starts early. "
        "A parameter larger than the cap gets a bucket of its own. size: the bytes of the "
        "bucket's gradients.</p></section>"))
    return "".join(out)


def _not_built(trace: Trace) -> str:
    """' DDP was not built: ...' where the model comparison failed and no rank built DDP's
    parameters (the ranks stopped there), else ''."""
    failed = sorted({e.rank for e in trace.of_type(ev.VerificationFailed)})
    if not failed or trace.of_type(ev.ParamsBuilt):
        return ""
    return (f" DDP was not built: the comparison of the models failed on {format_ranks(failed)}"
            " (see the findings) and no rank went on to build it.")


def _cap(limit: int) -> str:
    if limit >= UNLIMITED:
        return "none (one bucket per dtype and device)"
    return human_bytes(limit)


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
                                COLORS[i % len(COLORS)], i, human_bytes(size)))
        if w > 30:
            rects.append(markup.fmt("<text x='{:.1f}' y='18' font-size='12' fill='#fff'>b{}</text>",
                                    x + 4, i))
        x += w
    return markup.fmt("<svg width='{:.0f}' height='{}' "
                      "role='img' aria-label='bucket sizes'>{}</svg>", width, height,
                      markup.join(rects))


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
