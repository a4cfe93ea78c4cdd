"""HookTimeline: one iteration's backward on every rank, hook by hook, bucket by bucket.

One lane per rank (see timeline_svg.py), then the hook firing order per rank with every
departure from the most common order highlighted, per-bucket timing with the exposed (not
overlapped) part of each all-reduce, and unused parameters. With many ranks (more than
`lanes_up_to`) it draws distributions instead: per bucket the spread of ready and all-reduce
times across ranks, the slowest ranks named, and one chosen rank's lane against them; firing
orders and tables are grouped by rank ranges. Live it follows the newest
iteration; its redraws are rate-limited by bytes (`live_bytes_per_s`) as well as by time, so a
1,000-parameter model on 8 ranks cannot flood the browser.

The SVG is drawn by an anywidget (svg_view.py): `on_bucket_click` hears a click on a bucket
(the debugger's panel sets a break there). While the debugger's ranks are parked
(`mark_stop`), it shows the paused step with the park marked; `mark_stop(None)` clears it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.findings import Finding, format_ranges, format_ranks
from ddpviz.model.event_model import CONSTRUCTION, EventModel
from ddpviz.model.hook_analysis import IterationView, OrderDiff, analyse
from ddpviz.model.hook_spread import IterationSpread, iteration_spread
from ddpviz.model.rank_groups import MANY_RANKS, Spread, value_groups
from ddpviz.units import human_bytes
from ddpviz.widgets import timeline_svg
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.replay_controls import Cursor
from ddpviz.widgets.svg_view import SvgView

MAX_ORDER_GROUPS = 24  # rows of the firing-order table when ranks are grouped by their order
MAX_BUCKET_ROWS = 1_000  # rows of the per-bucket table; past it a line says how many are left
_CELL = markup.Markup("<style>.ddpviz-ho{border-collapse:collapse;font:11px monospace}"
         ".ddpviz-ho td,.ddpviz-ho th{padding:0 3px;border:1px solid #eee;text-align:center}"
         ".ddpviz-ho .d{background:#f6c5c5;font-weight:bold}.ddpviz-ho .g{color:#aaa}"
         ".ddpviz-ho .n{background:#7a1fa2;color:#fff;font-weight:bold}</style>")
NONFINITE = ("nonfinite_gradient", "nonfinite_parameter")  # findings marked on the timeline


def step_list(steps: list[int], most: int = 8) -> str:
    """[0, 1, 2, 100, 200] -> '0-2, 100, 200'; runs of 3 or more as a-b; past `most` items
    '...'."""
    return format_ranges(steps, most=most)


def summary_note(step: int, full_steps: list[int]) -> str:
    """The line said over a step whose gradients were recorded per bucket only."""
    recorded = (f"per-parameter hooks recorded on steps {step_list(full_steps)}" if full_steps
                else "no step has per-parameter hooks")
    return (f"step {step}: per-bucket summaries; {recorded} (Recording(every=1): every step). "
            "Each bucket is drawn from its first to its last gradient ready.")


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.3f}"


class HookTimeline(EventView):
    """The hooks and all-reduces of one iteration on every rank, live or replayed.

    Kernel-side state: `view` (an `IterationView`: lanes, firing-order differences, bucket
    timing, unused parameters), `step` (the iteration shown), `svg_html` (the SvgView; its
    `value` is the SVG), `order_html`, `buckets_html`, `unused_html`, `header_html`, `stop`
    (the debugger's park marked, or None).

    Args:
        source: a Run, Session, Trace, `.ddpviz` path or list of events (see `EventView`).
        live_bytes_per_s: while following a live run, redraw no more bytes per second than
            this (a large model's timeline is redrawn less often).
        max_order_columns: firing positions shown per rank (departures always among them).
        lanes_up_to: one lane per rank up to this many ranks; above it, distributions
            across ranks (`spread`), the slowest ranks named, and the lane of the rank picked
            in `rank_select` (default: the slowest).
    """

    def __init__(self, source: object = None, *, live_bytes_per_s: int = 30_000,
                 max_order_columns: int = 40, lanes_up_to: int = MANY_RANKS,
                 **kwargs: Any) -> None:
        self.live_bytes_per_s = live_bytes_per_s
        self.max_order_columns = max_order_columns
        self.lanes_up_to = lanes_up_to
        self.view: IterationView | None = None
        self.spread: IterationSpread | None = None  # set when the ranks are too many for lanes
        self.chosen: int | None = None  # rank picked by hand (None: the slowest)
        self._cursor = Cursor(None, None)
        self.step: int | None = None
        self.stop: timeline_svg.StopMark | None = None  # the debugger's park, marked
        self.bytes_drawn = 0  # bytes of HTML/SVG changed by the last redraw
        self._key: tuple[Any, ...] | None = None
        self._next_live = 0.0
        self._names: tuple[int, dict[int, str], int | None] = (-1, {}, None)
        super().__init__(source, **kwargs)

    @classmethod
    def embedded_in(cls, model: EventModel, **kwargs: Any) -> HookTimeline:
        return cls(model=model, embedded=True, controls=False, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.header_html = w.HTML()
        self.svg_html = SvgView(layout=w.Layout(overflow="auto"))
        self.order_html = w.HTML(layout=w.Layout(overflow="auto"))
        self.buckets_html = w.HTML(layout=w.Layout(overflow="auto"))
        self.unused_html = w.HTML()
        self.nan_html = w.HTML()  # where a NaN/Inf began at this iteration (its finding)
        self._nan_marks: set[tuple[int, int]] = set()  # (rank, parameter) cells to mark
        self.rank_select = w.Dropdown(options=[("(slowest rank)", -1)], value=-1,
                                      description="rank drawn",
                                      layout=w.Layout(width="320px", display="none"),
                                      style={"description_width": "initial"})
        self.rank_select.observe(self._on_rank, names="value")
        return [self.header_html, self.nan_html, self.rank_select, self.svg_html,
                self.unused_html,
                self.order_html, self.buckets_html]

    # --- data -----------------------------------------------------------------------------

    def param_names(self) -> tuple[dict[int, str], int | None]:
        """{index: dotted name} and the parameter count, from the lowest rank's ParamsBuilt."""
        version = self.model.versions["construction"]
        if self._names[0] != version:
            names: dict[int, str] = {}
            count = None
            for s in self.model.construction().values():
                if s.params is not None and isinstance(s.params.event, ev.ParamsBuilt):
                    names = {p.index: p.name for p in s.params.event.params}
                    count = len(s.params.event.params)
                    break
            self._names = (version, names, count)
        return self._names[1], self._names[2]

    def _shown_step(self, cursor: Cursor) -> int | None:
        if cursor.step is not None:
            return cursor.step
        steps = self.model.steps
        stop = self.stop
        if stop is not None:  # parked: the paused step (before its forward: the one before)
            before = [s for s in steps if s <= stop.step]
            return before[-1] if before else None
        return steps[-1] if steps else None

    def on_bucket_click(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call `callback(bucket)` when a bucket is clicked in the drawing (an all-reduce
        span or a bucket's hooks). Returns the function that stops the calls."""
        return self.svg_html.on_bucket_click(callback)

    def mark_stop(self, stop: timeline_svg.StopMark | None) -> None:
        """Show the paused step with the debugger's park marked (None: clear the mark and
        follow the run again); drawn at the next render."""
        if stop != self.stop:
            self.stop = stop
            self._next_live = 0.0  # drawn now, whatever the live bytes budget

    def select_rank(self, rank: int | None) -> None:
        """Draw `rank`'s lane against the distribution (None: the slowest rank's), like
        picking it in `rank_select`."""
        self.rank_select.value = -1 if rank is None else rank

    def shown_ranks(self) -> list[int]:
        """The ranks drawn as lanes: every rank when few; else the chosen (or slowest) one."""
        if self.view is None:
            return []
        if self.spread is None:
            return list(self.view.lanes)
        if self.chosen is not None and self.chosen in self.view.lanes:
            return [self.chosen]
        if self.spread.slowest:
            return [self.spread.slowest[0].rank]
        return list(self.view.lanes)[:1]

    def _on_rank(self, _change: dict[str, Any]) -> None:
        value = self.rank_select.value
        self.chosen = None if value == -1 else int(value)
        with self._render_lock:
            self._key = None
            self._next_live = 0.0  # a pick is drawn now, whatever the live bytes budget
            self.render(self._cursor)

    def _sync_rank_select(self) -> None:
        spread = self.spread
        if spread is None or self.view is None:
            options: list[tuple[str, int]] = [("(slowest rank)", -1)]
        else:
            slow = {s.rank: s for s in spread.slowest}
            options = [("(slowest rank)", -1)] + [
                (f"rank {s.rank}: last hook +{s.behind_ms:,.3f} ms after the median", s.rank)
                for s in spread.slowest] + [(f"rank {r}", r) for r in self.view.lanes
                                            if r not in slow]
        display = "none" if spread is None else "flex"
        if self.rank_select.layout.display != display:
            self.rank_select.layout.display = display
        if [tuple(o) for o in self.rank_select.options] != options:
            self.rank_select.unobserve(self._on_rank, names="value")
            self.rank_select.options = options
            values = [v for _, v in options]
            self.rank_select.value = self.chosen if self.chosen in values else -1
            self.rank_select.observe(self._on_rank, names="value")

    # --- drawing --------------------------------------------------------------------------

    def render(self, cursor: Cursor) -> bool:
        self._cursor = cursor
        step = self._shown_step(cursor)
        nan = [f for f in self.model.findings(cursor.as_of)
               if isinstance(f, Finding) and f.kind in NONFINITE and f.step == step]
        stop = self.stop  # marked on the paused step, or when following the run
        if stop is not None and cursor.step is not None and step != stop.step:
            stop = None
        key = (step, self.model.step_version(step) if step is not None else 0, cursor.as_of,
               self.model.versions["construction"], self.chosen, len(nan), stop)
        if key == self._key:
            return False
        following = cursor.step is None
        now = time.monotonic()
        if following and now < self._next_live:
            return True  # over the bytes budget: the throttle asks again later
        self._key = key
        self.step = step
        names, n_params = self.param_names()
        if step is None or step == CONSTRUCTION:
            self.view = None
            self.spread = None
            self._sync_rank_select()
            self.bytes_drawn = self._set(
                header=markup.fmt("<i style='font-size:12px'>{}</i>", (
                    "no iteration yet: the hooks fire in backward"
                    if step is None else "the constructor registers one hook per parameter; "
                    "pick iteration 0 or later to see them fire")),
                svg="", order="", buckets="", unused="", nan="")
            return False
        self._nan_marks = {(f.ranks[0], f.param) for f in nan if f.ranks and f.param >= 0
                           and f.kind == "nonfinite_gradient"}
        self.view = analyse(step, self.model.step_records(step, cursor.as_of), n_params)
        many = len(self.view.lanes) > self.lanes_up_to
        self.spread = iteration_spread(self.view) if many else None
        self._sync_rank_select()
        if self.spread is not None:
            svg = timeline_svg.render_spread(self.view, self.spread, self.shown_ranks(), names,
                                             cursor.as_of, stop=stop)
            buckets = self._bucket_spreads(self.view, self.spread)
        else:
            svg = timeline_svg.render(self.view, names, cursor.as_of, stop=stop)
            buckets = self._buckets(self.view)
        self.bytes_drawn = self._set(
            header=self._header(self.view, stop), svg=svg,
            order=self._order_or_note(self.view, names), buckets=buckets,
            unused=self._unused(self.view, names), nan=_nan_origin(nan))
        if following:
            self._next_live = now + self.bytes_drawn / self.live_bytes_per_s
        return False

    def _set(self, **parts: str) -> int:
        sent = 0
        for name, value in parts.items():
            widget = getattr(self, f"{name}_html")
            if widget.value != value:
                widget.value = value
                sent += len(value)
        return sent

    def _header(self, v: IterationView, stop: timeline_svg.StopMark | None = None) -> str:
        n = len(v.lanes)
        in_backward = [r for r, lane in v.lanes.items() if lane.record.backward is not None
                       and lane.record.backward_end is None]
        backward = [(lane.record.backward_end - lane.record.backward) / 1e6
                    for lane in v.lanes.values()
                    if lane.record.backward is not None and lane.record.backward_end is not None]
        worst = max(v.lanes.values(), key=lambda lane: lane.exposed_ns)
        parts = [markup.fmt("<b>iteration {}</b> · {} rank{}", v.step, n, "s" if n != 1 else "")]
        if stop is not None:
            later = f" (drawn: step {v.step}, the last one run)" if stop.step > v.step else ""
            parts.insert(0, markup.fmt("<b class='ddpviz-paused' style='color:{}'>⏸ paused at {}"
                                       "{}</b>", timeline_svg.STOP_COLOUR, stop.label, later))
        if backward:
            parts.append(markup.fmt("backward {:,.3f} ms (slowest rank)", max(backward)))
        parts.append(markup.fmt("exposed communication {:,.3f} ms (rank {}, after its last "
                                "hook)", worst.exposed_ns / 1e6, worst.rank))
        if in_backward:
            parts.append(markup.fmt("{} still in backward", format_ranks(in_backward)))
        if self.spread is not None and self.spread.slowest:
            parts.append(markup.fmt("slowest: {}", ", ".join(
                f"rank {s.rank} (+{s.behind_ms:,.3f} ms)" for s in self.spread.slowest)))
        if v.order.differs:
            parts.append(markup.Markup("<span style='color:#b42318'>hook order differs across "
                                       "ranks</span>"))
        note = markup.Markup("")
        if v.summarized:
            text = summary_note(v.step, self.model.full_steps())
            if len(v.summarized) < n:
                text += f" ({format_ranks(v.summarized)} only.)"
            note = markup.fmt("<div class='ddpviz-summary-note' style='color:#8a5a00'>ⓘ {}"
                              "</div>", text)
        if self.spread is not None:
            legend = markup.Markup(
                "<span style='color:#777'>across ranks: last hook (box p10-p90, whiskers "
                "min-max, tick median) · bucket ready p10-p90 (tick median) · all-reduce "
                "from the median launch to the median done (whisker: done p10-p90); below, "
                "the lane of the rank picked above</span>")
            return markup.fmt("<div style='font-size:12px'>{}<br>{}{}</div>",
                              markup.join(parts, " · "), legend, note)
        legend = markup.Markup(
            "<span style='color:#777'>lanes: forward ▭ grey, backward ▭ blue · hooks | "
            "(shade per bucket; red: out of order) · ▼ bucket ready · all-reduce ▭ "
            "(red: exposed) · ┊ last hook</span>")
        if v.summarized:
            legend = markup.Markup(
                "<span style='color:#777'>lanes: forward ▭ grey, backward ▭ blue · per-bucket "
                "summary ▭ (first to last gradient ready; shade per bucket) · ▼ bucket ready · "
                "all-reduce ▭ (red: exposed) · ┊ last gradient</span>")
        return markup.fmt("<div style='font-size:12px'>{}<br>{}{}</div>",
                          markup.join(parts, " · "), legend, note)

    def order_columns(self, order: OrderDiff) -> list[int]:
        """Firing positions shown: all when few; else every departure (and its neighbours)
        plus the first positions, up to max_order_columns."""
        n = max([len(order.reference)] + [len(p) and max(p) + 1 for p in
                                           order.positions.values()])
        if n <= self.max_order_columns:
            return list(range(n))
        wanted: set[int] = set()
        for positions in order.positions.values():
            for p in positions:
                wanted |= {p - 1, p, p + 1}
        wanted = {p for p in wanted if 0 <= p < n}
        shown = sorted(wanted)[: self.max_order_columns]
        room = self.max_order_columns - len(shown)
        return sorted(set(shown) | set(range(min(room, n))))

    def _order_or_note(self, v: IterationView, names: dict[int, str]) -> str:
        """The firing-order table; "not recorded" for ranks whose step was summarized."""
        table = self._order(v.order, names)
        if not v.summarized:
            return table
        missing = markup.fmt(
            "<div class='ddpviz-order-not-recorded' style='font-size:12px'>hook firing order "
            "(step {}, {}): not recorded (per-bucket summaries at this detail level; per-"
            "parameter hooks are recorded on steps {})</div>", v.step,
            format_ranks(v.summarized), step_list(self.model.full_steps()) or "none")
        return markup.join([missing, table])  # the table is Markup already

    def _order(self, order: OrderDiff, names: dict[int, str]) -> str:
        if not order.reference and not order.positions:
            return ""
        lanes = self.view.lanes if self.view else {}
        columns = self.order_columns(order)
        head: list[markup.Markup] = []
        prev = -1
        for c in columns:
            if c != prev + 1:
                head.append(markup.Markup("<th class=g>…</th>"))
            head.append(markup.fmt("<th>{}</th>", c))
            prev = c
        rows = []
        groups = [(g.label, g.ranks) for g in value_groups({r: lane.order
                                                             for r, lane in lanes.items()})]
        if len(lanes) <= self.lanes_up_to:
            groups = [(f"r{r}", (r,)) for r in lanes]
        hidden_groups = max(0, len(groups) - MAX_ORDER_GROUPS)
        for label, members in groups[:MAX_ORDER_GROUPS]:
            r = members[0]
            lane = lanes[r]
            bad = set(order.positions.get(r, ()))
            cells: list[markup.Markup] = []
            prev = -1
            for c in columns:
                if c != prev + 1:
                    cells.append(markup.Markup("<td class=g>…</td>"))
                prev = c
                if c >= len(lane.order):
                    cells.append(markup.Markup("<td class=g>·</td>"))
                    continue
                p = lane.order[c]
                cls = markup.Markup(" class=n" if (r, p) in self._nan_marks else
                                    " class=d" if c in bad else "")
                cells.append(markup.fmt("<td{} title='{}'>{}</td>", cls, names.get(p, ""), p))
            rows.append(markup.fmt("<tr><th>{}</th>{}</tr>", label, markup.join(cells)))
        if order.differs:
            worst = max(order.positions, key=lambda r: order.departures.get(
                r, len(order.positions[r])))
            first = order.positions[worst][0]
            mine = lanes[worst].order[first] if first < len(lanes[worst].order) else None
            theirs = order.reference[first] if first < len(order.reference) else None

            def name(p: int | None) -> str:
                return "nothing" if p is None else f"p{p} '{names.get(p, '?')}'"

            summary = markup.fmt(
                "<b style='color:#b42318'>✘ rank {} departs from the order of {} at {} "
                "position(s); first at #{}: {} where they fire {}</b>", worst,
                _short_ranks(order.reference_ranks),
                order.departures.get(worst, len(order.positions[worst])), first,
                name(mine), name(theirs))
        else:
            summary = markup.fmt("✔ the same hook firing order on {} ({} hooks)",
                                 format_ranks(list(lanes)), len(order.reference))
        if hidden_groups:
            rows.append(markup.fmt("<tr><td colspan={}>… and {:,} more groups of ranks with "
                                   "other orders</td></tr>", len(head) + 1, hidden_groups))
        return markup.fmt(
            "{}<div style='font-size:12px'>hook firing order (parameter index per position): "
            "{}</div><table class=ddpviz-ho><tr><th>pos</th>{}</tr>{}</table>", _CELL, summary,
            markup.join(head), markup.join(rows))

    def _buckets(self, v: IterationView) -> str:
        if not v.buckets:
            return ""
        rows = []
        for b in v.buckets[:MAX_BUCKET_ROWS]:
            exposed = (markup.fmt("<b style='color:#b42318'>{}</b>", _ms(b.exposed_ms))
                       if b.exposed_ms else markup.escape(_ms(b.exposed_ms)))
            rows.append(markup.fmt(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td><td>{}</td></tr>", b.bucket, b.dtype, human_bytes(b.nbytes),
                b.n_params, _ms(b.ready_ms), _ms(b.allreduce_ms), exposed,
                _ms(b.exposed_mean_ms)))
        if len(v.buckets) > MAX_BUCKET_ROWS:
            rows.append(_more_buckets_row(len(v.buckets), 8))
        return markup.fmt("<table style='font-size:11px;border-collapse:collapse' "
                          "cellpadding=2><tr><th>bucket</th><th>dtype</th><th>bytes</th>"
                          "<th>hooks</th><th>ready ms after backward start</th>"
                          "<th>all-reduce ms</th><th>exposed ms (max)</th>"
                          "<th>exposed ms (mean)</th></tr>{}</table>", markup.join(rows))

    def _bucket_spreads(self, v: IterationView, spread: IterationSpread) -> str:
        """Many ranks: per bucket the median and spread across ranks, and the rank whose
        bucket was ready last."""
        if not spread.buckets:
            return ""
        info = {b.bucket: b for b in v.buckets}

        def ms(x: Spread | None, scale: float = 1.0) -> str:
            return "—" if x is None else (f"{x.p50 / scale:,.3f} ({x.p10 / scale:,.3f}-"
                                          f"{x.p90 / scale:,.3f})")

        rows = []
        for b in spread.buckets[:MAX_BUCKET_ROWS]:
            i = info.get(b.bucket)
            rows.append(markup.fmt(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td><td>{}</td><td>{}</td></tr>", b.bucket, i.dtype if i else "",
                human_bytes(i.nbytes) if i else "", i.n_params if i else "",
                ms(b.ready, 1e6), ms(b.allreduce_ms), ms(b.exposed_ms),
                _ms(b.exposed_ms.max if b.exposed_ms else None),
                "—" if b.latest_rank is None else b.latest_rank))
        if len(spread.buckets) > MAX_BUCKET_ROWS:
            rows.append(_more_buckets_row(len(spread.buckets), 9))
        return markup.fmt("<table style='font-size:11px;border-collapse:collapse' "
                          "cellpadding=2><tr><th>bucket</th><th>dtype</th><th>bytes</th>"
                          "<th>hooks</th><th>ready ms: median (p10-p90) over {} ranks</th>"
                          "<th>all-reduce ms: median (p10-p90)</th>"
                          "<th>exposed ms: median (p10-p90)</th><th>exposed ms (max)</th>"
                          "<th>ready last on rank</th></tr>{}</table>", spread.n_ranks,
                          markup.join(rows))

    def _unused(self, v: IterationView, names: dict[int, str]) -> str:
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for r, lane in v.lanes.items():
            if lane.unused:
                groups.setdefault((lane.unused, max(lane.n_unused, len(lane.unused))),
                                  []).append(r)
        if not groups:
            return ""
        lines = []
        for (params, n), ranks in list(groups.items())[:MAX_UNUSED_GROUPS]:
            listed = ", ".join(f"p{p} '{names.get(p, '?')}'" for p in params[:10])
            more = f" and {n - 10} more" if n > 10 else ""
            lines.append(f"{format_ranks(ranks)[:400]}: {listed}{more}")
        if len(groups) > MAX_UNUSED_GROUPS:
            lines.append(f"… and {len(groups) - MAX_UNUSED_GROUPS:,} more groups of ranks")
        return markup.fmt("<div style='font-size:12px;color:#b42318'>✕ unused parameters (no "
                          "gradient this iteration): {}</div>", "; ".join(lines))


MAX_UNUSED_GROUPS = 32  # groups of ranks (by their unused parameters) listed


def _nan_origin(findings: Sequence[Finding]) -> str:
    """Where a NaN/Inf began at this iteration: each nonfinite finding's title and per-rank
    values (the parameter's cell in the firing order is marked too)."""
    if not findings:
        return ""
    blocks = []
    for f in findings[:4]:
        values = markup.join([markup.fmt("<br>&nbsp;&nbsp;{}: {}", _short_ranks(ranks), value)
                              for value, ranks in f.values[:16]], "")
        blocks.append(markup.fmt("<div class='ddpviz-nan-origin' style='font-size:12px;"
                                 "color:#7a1fa2'><b>⚠ NaN/Inf: {}</b>{}</div>", f.title,
                                 values))
    return markup.join(blocks, "")


def _short_ranks(ranks: Sequence[int]) -> str:
    text = format_ranks(ranks)
    return text if len(text) <= 400 else text[:399] + "…"


def _more_buckets_row(n_buckets: int, columns: int) -> markup.Markup:
    """The table row that says how many buckets past MAX_BUCKET_ROWS are not listed."""
    return markup.fmt("<tr><td colspan={}>… and {:,} more buckets (the first {:,} in reduction "
                      "order are listed)</td></tr>", columns, n_buckets - MAX_BUCKET_ROWS,
                      MAX_BUCKET_ROWS)
