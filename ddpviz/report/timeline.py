"""The report's timelines: one per step drawn, each on its own time axis, with a legend.

Which steps: those a finding names first (in a hang, the step where it hung), then the steps
recorded in full (per-bucket all-reduces), at most `MAX_STEPS`; how many were left out is said.
A step where a rank stopped (a hang, an exit) shows, for each rank, what it did in that step and,
hatched grey, that nothing followed until its trace ended. Everything drawn is an event of the
trace; nothing is inferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.findings import Finding, format_ranges, recording_advice
from ddpviz.model.spans import Span
from ddpviz.traces.columns import Table
from ddpviz.units import human_duration

MAX_STEPS = 6  # timelines drawn at most
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
          "#ff9da7", "#9c755f", "#bab0ac")
# the phases drawn in each rank's top row, and their fill
PHASE_FILL = {"forward": "#eceff3", "backward": "#c3cddb", "optimizer step": "#e8dcc2"}
# finding kinds that name the step where a rank stopped (what follows it is drawn as nothing)
STOPPED_KINDS = ("rank_hang", "rank_exited", "peer_failed", "collective_mismatch",
                 "unmatched_collective", "missing_rank")

_PLOT_W, _LABEL_W, _ROW_H = 840.0, 100, 13
_HATCH = ("<defs><pattern id='hatch' width='6' height='6' patternUnits='userSpaceOnUse'>"
          "<path d='M0,6 l6,-6' stroke='#b00020' stroke-width='1'/></pattern>"
          "<pattern id='nothing' width='6' height='6' patternUnits='userSpaceOnUse'>"
          "<path d='M0,6 l6,-6' stroke='#999' stroke-width='1'/></pattern></defs>")


class Computed(NamedTuple):
    """A rank's BackwardComputed on the aligned clock: its first gradient and the end of its
    autograd pass (every gradient computed, every bucket launched; the wait follows)."""

    rank: int
    step: int
    first_ns: int
    end_ns: int


def computed_marks(tables: Mapping[int, Table], offsets: Mapping[int, int]) -> list[Computed]:
    """Every BackwardComputed of the trace."""
    out: list[Computed] = []
    for rank, table in tables.items():
        for e in table.events(table.rows(ev.BackwardComputed)):
            assert isinstance(e, ev.BackwardComputed)
            off = offsets.get(rank, 0)
            out.append(Computed(rank, e.step, e.first_t_ns + off, e.t_ns + off))
    return out


def timeline_steps(spans: list[Span], marks: list[Computed], findings: list[Finding]
                   ) -> tuple[list[int], list[int]]:
    """(the steps drawn, the recorded steps left out): steps named by an error or warning
    that have anything to draw first, then the first and the latest steps recorded in full."""
    full = sorted({s.step for s in spans if s.cat == "allreduce" or s.name == "backward"})
    drawable = {s.step for s in spans if s.step >= 0} | {m.step for m in marks}
    named = sorted({f.step for f in findings if f.severity != "info" and f.step in drawable})
    picked = named[:MAX_STEPS]
    rest = [s for s in full if s not in picked]
    room = MAX_STEPS - len(picked)
    if room > 0:
        head = rest[:min(3, room)]
        tail = rest[len(head):][-(room - len(head)):] if room > len(head) else []
        picked += head + tail
    picked = sorted(set(picked))
    return picked, [s for s in full if s not in picked]


def stopped_steps(findings: list[Finding]) -> set[int]:
    """Steps where a finding says a rank stopped (hung, exited, or paired wrongly)."""
    return {f.step for f in findings if f.kind in STOPPED_KINDS and f.step >= 0}


def _legend(buckets: list[int], summarized: bool, stopped: bool) -> str:
    def swatch(fill: str, text: str) -> markup.Markup:
        return markup.fmt("<li><svg width='22' height='12' aria-hidden='true'><rect width='22' "
                          "height='12' fill='{}' stroke='#999' stroke-width='.5'/></svg>{}</li>",
                          fill, text)

    items = [swatch(PHASE_FILL["forward"], "forward"),
             swatch(PHASE_FILL["backward"], "backward (on fully recorded steps it includes "
                                            "the wait for the all-reduces)"),
             swatch(PHASE_FILL["optimizer step"], "optimizer step"),
             *(swatch(COLORS[b % len(COLORS)], f"all-reduce of bucket {b} (launch to done)")
               for b in buckets[:len(COLORS)]),
             *([markup.fmt("<li>{}</li>", f"… and {len(buckets) - len(COLORS):,} more buckets, "
                           "their colours in the same cycle (bucket b as bucket b mod "
                           f"{len(COLORS)})")] if len(buckets) > len(COLORS) else []),
             markup.fmt("<li><svg width='22' height='12' aria-hidden='true'><rect x='10' "
                        "width='2' height='12' fill='#222'/></svg>{}</li>",
                        "every gradient computed and handed to its all-reduce (what follows "
                        "in backward is the wait)"),
             swatch("url(#hatch)", "never finished: no end event in the trace")]
    if summarized:
        items.append(swatch(COLORS[0], "gradients ready (per-bucket summary, row 'grads')"))
    if stopped:
        items.append(swatch("url(#nothing)", "no further event from this rank until its "
                                             "trace ends"))
    return markup.fmt("<ul class='legend'><li><svg width='0' height='0'>{}</svg></li>{}</ul>",
                      markup.Markup(_HATCH), markup.join(items))


def _ticks(t0: int, t1: int, y: int) -> list[str]:
    out: list[str] = []
    for k in range(5):
        x = _LABEL_W + _PLOT_W * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        out.append(markup.fmt("<line x1='{:.1f}' x2='{:.1f}' y1='{}' y2='{}' stroke='#bbb'/>"
                              "<text x='{:.1f}' y='{}' font-size='10' fill='#555' "
                              "text-anchor='{}'>{}</text>", x, x, y - 12, y - 8, x, y, anchor,
                              human_duration((t1 - t0) * k / 4)))
    return out


def _step_svg(step: int, spans: list[Span], marks: list[Computed], ranks: list[int],
              last_ns: Mapping[int, int], end_ns: Mapping[int, int], stopped: bool,
              last_step: Mapping[int, int]) -> str:
    """One step's timeline: a band per rank, phases on top, then gradient summaries and one
    row per bucket's all-reduce; `last_ns`: the ranks that stopped in or before this step, at
    their last activity (drawn as nothing after it); `last_step`: each rank's last step drawn
    from."""
    buckets = sorted({int(s.lane.rsplit(" ", 1)[1]) for s in spans if s.cat == "allreduce"})
    summarized = any(s.cat == "gradients" for s in spans)
    times = [t for s in spans for t in (s.start_ns, s.end_ns)] + [
        t for m in marks for t in (m.first_ns, m.end_ns)]
    t0 = min(times)
    t1 = max(times + [t for t in last_ns.values() if t >= t0])
    length = t1 - t0
    if stopped:  # room on the right for what followed: nothing
        t1 += max((t1 - t0) // 3, 1)
    scale = _PLOT_W / max(t1 - t0, 1)
    grads = 1 if summarized else 0
    band = (1 + grads + len(buckets)) * _ROW_H + 12
    rank_row = {r: i for i, r in enumerate(ranks)}
    bucket_row = {b: i for i, b in enumerate(buckets)}
    items: list[str] = []

    def rect(x0: float, x1: float, y: int, fill: str, title: str) -> None:
        items.append(markup.fmt("<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}'>"
                                "<title>{}</title></rect>", x0, y, max(x1 - x0, 1.0),
                                _ROW_H - 2, fill, title))

    def x_of(t: int) -> float:
        return _LABEL_W + (t - t0) * scale

    for r in ranks:
        y0 = rank_row[r] * band
        items.append(markup.fmt("<text x='0' y='{}' font-size='11'>rank {}</text>",
                                y0 + 10, r))
        if grads:
            items.append(markup.fmt("<text x='44' y='{}' font-size='9' fill='#777'>grads"
                                    "</text>", y0 + 2 * _ROW_H - 3))
        for b in buckets:
            items.append(markup.fmt("<text x='44' y='{}' font-size='9' fill='#777'>"
                                    "all-reduce b{}</text>",
                                    y0 + (bucket_row[b] + 2 + grads) * _ROW_H - 3, b))
    for s in spans:
        y0 = rank_row[s.rank] * band
        if s.cat == "allreduce":
            b = int(s.lane.rsplit(" ", 1)[1])
            y, color = y0 + (bucket_row[b] + 1 + grads) * _ROW_H, COLORS[b % len(COLORS)]
        elif s.cat == "gradients":
            y, color = y0 + _ROW_H, COLORS[s.args["bucket"] % len(COLORS)]
        else:
            y, color = y0, PHASE_FILL[s.name]
        rect(x_of(s.start_ns), x_of(s.end_ns), y, color if s.finished else "url(#hatch)",
             f"rank {s.rank} step {s.step} {s.name}: {human_duration(s.end_ns - s.start_ns)}"
             + ("" if s.finished else " (never finished)"))
    backward_ranks = {s.rank for s in spans if s.name == "backward"}
    for m in marks:
        y0 = rank_row[m.rank] * band
        if m.rank not in backward_ranks:  # no backward span: the pass the mark measured
            rect(x_of(m.first_ns), x_of(m.end_ns), y0, PHASE_FILL["backward"],
                 f"rank {m.rank} step {m.step} backward, first gradient to every gradient "
                 f"computed: {human_duration(m.end_ns - m.first_ns)}")
        items.append(markup.fmt("<rect x='{:.1f}' y='{}' width='2' height='{}' fill='#222'>"
                                "<title>rank {} step {}: every gradient computed</title></rect>",
                                x_of(m.end_ns) - 1, y0 - 1, _ROW_H, m.rank, m.step))
    if stopped:  # each rank's nothing-after, from its last activity to the axis' end
        for r in ranks:
            last = last_ns.get(r)
            if last is None:
                continue
            x0 = max(x_of(last), float(_LABEL_W))
            y0 = rank_row[r] * band
            quiet = end_ns.get(r, last) - last
            said = (f" ({human_duration(quiet)} until its trace ends)" if quiet >= 1_000_000
                    else " in its trace")
            before = last_step.get(r, step)
            said = (f"rank {r}: no event in step {step} (its last was in step {before}"
                    + (f", {human_duration(quiet)} before its trace ends)" if quiet >= 1_000_000
                       else ", where its trace ends)")
                    if before < step else f"rank {r}: no further event{said}")
            items.append(markup.fmt(
                "<rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='url(#nothing)' "
                "stroke='#999' stroke-width='.5'><title>{}</title></rect>",
                x0, y0, _LABEL_W + _PLOT_W - x0, band - 12, said))
            text_x = max(min(x0, _LABEL_W + _PLOT_W - 5.2 * len(said)), 0.0)
            items.append(markup.fmt(
                "<text x='{:.1f}' y='{}' font-size='10' fill='#444'>{}</text>",
                text_x, y0 + band - 3, said))  # under the band's rows
    axis_y = band * len(ranks) + 14
    items += _ticks(t0, t1, axis_y)
    width = int(_LABEL_W + _PLOT_W + 10)
    return markup.fmt("<figure class='step' id='step-{}'><figcaption>Step {}: {} from its "
                      "first event to its last</figcaption><svg width='{}' height='{}' "
                      "viewBox='0 0 {} {}' role='img' aria-label='timeline of step {}'>{}"
                      "</svg></figure>",
                      step, step, human_duration(length), width, axis_y + 4, width,
                      axis_y + 4, step, markup.Markup("".join(items)))


def timeline_section(all_spans: list[Span], marks: list[Computed], findings: list[Finding],
                     steps: list[int], left_out: list[int], last_ns: Mapping[int, int],
                     end_ns: Mapping[int, int], why_empty: str = "") -> str:
    """The timeline section: a legend, then one timeline per step in `steps`; `why_empty`:
    what the page says after "No forward ... in this trace." when nothing is drawn."""
    out = ["<section id='timeline'><h2>Timelines</h2>"]
    kept = ("allreduce", "phase", "gradients")
    by_step = {st: [s for s in all_spans if s.step == st and s.cat in kept
                    and (s.name in PHASE_FILL or s.cat != "phase")] for st in steps}
    marks_of = {st: [m for m in marks if m.step == st] for st in steps}
    drawn = [st for st in steps if by_step[st] or marks_of[st]]
    if not drawn:
        out.append(markup.fmt("<p class='muted'>No forward, backward or all-reduce in this "
                              "trace.{}</p></section>", why_empty))
        return "".join(out)
    ranks = sorted({s.rank for s in all_spans} | {m.rank for m in marks})
    stopped = stopped_steps(findings)
    last_step: dict[int, int] = {}
    for rank, step in [(s.rank, s.step) for s in all_spans] + [(m.rank, m.step) for m in marks]:
        last_step[rank] = max(last_step.get(rank, step), step)
    out.append(markup.fmt(
        "<p>One timeline per step, each on its own axis (time from the step's first event, on "
        "the aligned clock); one band per rank. Drawn: steps {}.{}</p>",
        format_ranges(drawn),
        markup.fmt(" Not drawn: {} more recorded step{} ({}).", len(left_out),
                   "s" if len(left_out) != 1 else "", format_ranges(left_out, most=8))
        if left_out else ""))
    summarized = sorted({s.step for st in drawn for s in by_step[st] if s.cat == "gradients"})
    if summarized:
        out.append(markup.fmt(
            "<p>Steps {}: per-parameter hooks were not recorded; a 'grads' row per rank draws "
            "each bucket from its first to its last gradient ready ({} records every step).</p>",
            format_ranges(summarized), recording_advice("every=1")))
    buckets = sorted({int(s.lane.rsplit(" ", 1)[1]) for st in drawn for s in by_step[st]
                      if s.cat == "allreduce"})
    out.append(_legend(buckets, bool(summarized), bool(stopped & set(drawn))))
    for st in drawn:
        # the ranks whose last activity is in this step or before it
        quiet = {r: t for r, t in last_ns.items() if last_step.get(r, -1) <= st}
        out.append(_step_svg(st, by_step[st], marks_of[st], ranks,
                             quiet if st in stopped else {}, end_ns, st in stopped,
                             last_step))
    out.append("</section>")
    return "".join(out)


def last_activity(all_spans: list[Span], marks: list[Computed]) -> dict[int, int]:
    """Per rank, the time of its last DDP activity: the end of its last finished span, the
    start of an unfinished one, or its last backward mark."""
    out: dict[int, int] = {}
    for s in all_spans:
        t = s.end_ns if s.finished else s.start_ns
        out[s.rank] = max(out.get(s.rank, t), t)
    for m in marks:
        out[m.rank] = max(out.get(m.rank, m.end_ns), m.end_ns)
    return out
