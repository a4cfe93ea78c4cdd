"""BucketMap: a BucketPlan in a notebook, with DDP's bucketing settings as live controls.

The widget holds only plan data (never a module): changing a control re-plans through
`BucketPlan.with_settings` and redraws the single FigureWidget in one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import ipywidgets as w

from ddpviz import markup
from ddpviz.plan import BucketPlan, PlannedBucket
from ddpviz.units import human_bytes
from ddpviz.widgets import bucket_figure
from ddpviz.widgets.bucket_segments import (
    LimitMarker,
    Segment,
    bucket_label,
    limit_markers,
    segments,
)

Which = Literal["initial", "rebuilt"]

# ipywidgets reserves a selection value of None for "nothing selected", so torch's default
# bucket_cap_mb=None is the string "None" in the dropdown.
DEFAULT_CAP = "None"
DEFAULT_CAP_CHOICES: tuple[float | None, ...] = (None, 0.25, 1, 5, 25, 100)
CapValue = str | float | tuple[float, ...]


def _cap_options(choices: Sequence[float | None], plan: BucketPlan) -> list[tuple[str, Any]]:
    numbers = sorted({float(c) for c in choices if c is not None}
                     | ({float(plan.settings.bucket_cap_mb)}
                        if plan.settings.bucket_cap_mb is not None else set()))
    options: list[tuple[str, Any]] = [("None (torch default)", DEFAULT_CAP)]
    options += [(f"{c:g}", c) for c in numbers]
    if plan.settings.bucket_cap_mb_list:
        caps = tuple(float(c) for c in plan.settings.bucket_cap_mb_list)
        options.append((f"list {[f'{c:g}' for c in caps]}".replace("'", ""), caps))
    return options


def _cap_value(plan: BucketPlan) -> CapValue:
    s = plan.settings
    if s.bucket_cap_mb_list:
        return tuple(float(c) for c in s.bucket_cap_mb_list)
    return DEFAULT_CAP if s.bucket_cap_mb is None else float(s.bucket_cap_mb)


def _first_rebuilt_iteration(plan: BucketPlan) -> int:
    # static_graph delays the rebuild by one iteration (before the 3rd forward).
    return 2 if plan.settings.static_graph else 1


def _initial_span(plan: BucketPlan) -> str:
    """The iterations that use the initial map."""
    if plan.rebuilt is None:
        return "every iteration"
    last = _first_rebuilt_iteration(plan) - 1
    return "iteration 0" if last == 0 else f"iterations 0-{last}"


def _map_line(name: str, buckets: Sequence[PlannedBucket], limits: Sequence[int] | None,
              shown: bool) -> str:
    n = len(buckets)
    total = sum(b.nbytes for b in buckets)
    caps = ", ".join(human_bytes(x) for x in limits) if limits else "none"
    text = (f"{name}: {n} bucket{'s' if n != 1 else ''}, {human_bytes(total)} in "
            f"{sum(len(b.slots) for b in buckets)} parameters; limits {caps}")
    return markup.fmt("<b>▶ {}</b>", text) if shown else markup.escape(text)


class BucketMap(w.VBox):
    """DDP's buckets for a plan, drawn in reduction order, one stacked bar per bucket.

    Kernel-side state (for tests and scripts): `plan` (the BucketPlan shown), `figure` (the one
    plotly FigureWidget), the controls `cap_dropdown`, `find_unused_checkbox`,
    `static_graph_checkbox`, `map_toggle`, the text `summary_html`, `segments()`, and
    `marked` (the bucket highlighted by `mark_bucket`, or None).

    Args:
        plan: the BucketPlan to show (from `ddpviz.bucket_plan`).
        which: the map shown first, "initial" (iteration 0) or "rebuilt" (iteration 1 on).
        cap_choices: bucket_cap_mb values offered; None is torch's default and always offered.
    """

    def __init__(self, plan: BucketPlan, which: Which = "initial",
                 cap_choices: Sequence[float | None] = DEFAULT_CAP_CHOICES) -> None:
        if not isinstance(plan, BucketPlan):
            raise TypeError(f"ddpviz: BucketMap takes a BucketPlan, got {type(plan).__name__}. "
                            "Build one with ddpviz.bucket_plan(model).")
        if which not in ("initial", "rebuilt"):
            raise ValueError(f"ddpviz: which={which!r} is not a map; use 'initial' or "
                             "'rebuilt'.")
        self.plan = plan
        self._syncing = False
        self.marked: int | None = None
        self._mark_note = ""
        self.cap_dropdown = w.Dropdown(
            options=_cap_options(cap_choices, plan), value=_cap_value(plan),
            description="bucket_cap_mb", style={"description_width": "initial"},
            layout=w.Layout(width="260px"))
        self.find_unused_checkbox = w.Checkbox(
            value=plan.settings.find_unused_parameters, description="find_unused_parameters",
            indent=False, layout=w.Layout(width="210px"))
        self.static_graph_checkbox = w.Checkbox(
            value=plan.settings.static_graph, description="static_graph", indent=False,
            layout=w.Layout(width="130px"))
        self.map_toggle = w.ToggleButtons(options=self._toggle_options(plan), value=which,
                                          style={"button_width": "auto"})
        self.summary_html = w.HTML()
        self.figure = bucket_figure.new_figure(*self._picture())
        for control in (self.cap_dropdown, self.find_unused_checkbox,
                        self.static_graph_checkbox):
            control.observe(self._on_settings, names="value")
        self.map_toggle.observe(self._on_toggle, names="value")
        super().__init__(children=[
            w.HBox([self.cap_dropdown, self.find_unused_checkbox, self.static_graph_checkbox]),
            self.map_toggle, self.summary_html, self.figure])
        self.summary_html.value = self._summary()

    # --- state --------------------------------------------------------------------------

    @property
    def which(self) -> Which:
        """The map on show: "initial" or "rebuilt"."""
        return self.map_toggle.value

    def shown_buckets(self) -> tuple[PlannedBucket, ...]:
        """The buckets drawn now; empty when the rebuilt map is chosen but torch never
        rebuilds."""
        if self.which == "rebuilt" and self.plan.rebuilt is None:
            return ()
        return self.plan.buckets(self.which)

    def segments(self) -> list[dict[str, Any]]:
        """The drawn segments as plain dicts (one per parameter, in drawing order)."""
        return [s._asdict() for s in segments(self.shown_buckets())]

    def set_plan(self, plan: BucketPlan) -> None:
        """Show another plan (e.g. of another model); the controls follow its settings."""
        self.plan = plan
        self._syncing = True
        try:
            self.cap_dropdown.options = _cap_options(
                [v for _, v in self.cap_dropdown.options if isinstance(v, float)], plan)
            self.cap_dropdown.value = _cap_value(plan)
            self.find_unused_checkbox.value = plan.settings.find_unused_parameters
            self.static_graph_checkbox.value = plan.settings.static_graph
        finally:
            self._syncing = False
        self._redraw()

    # --- reactions ----------------------------------------------------------------------

    def _settings_from_controls(self) -> dict[str, Any]:
        cap = self.cap_dropdown.value
        changes: dict[str, Any] = {
            "find_unused_parameters": bool(self.find_unused_checkbox.value),
            "static_graph": bool(self.static_graph_checkbox.value),
        }
        if isinstance(cap, tuple):
            changes["bucket_cap_mb_list"] = cap
        else:
            changes["bucket_cap_mb"] = None if cap == DEFAULT_CAP else cap
            changes["bucket_cap_mb_list"] = None
        return changes

    def _on_settings(self, _change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self.plan = self.plan.with_settings(**self._settings_from_controls())
        self._redraw()

    def _on_toggle(self, _change: dict[str, Any]) -> None:
        if not self._syncing:
            self._redraw()

    @staticmethod
    def _toggle_options(plan: BucketPlan) -> list[tuple[str, str]]:
        if plan.rebuilt is None:
            return [(f"initial ({_initial_span(plan)})", "initial"),
                    ("rebuilt: never (torch does not rebuild)", "rebuilt")]
        return [(f"initial ({_initial_span(plan)})", "initial"),
                (f"rebuilt (iteration {_first_rebuilt_iteration(plan)} on)", "rebuilt")]

    def _sync_toggle(self) -> None:
        options = self._toggle_options(self.plan)
        if list(self.map_toggle.options) != options:
            which = self.which
            self._syncing = True
            try:
                self.map_toggle.options = options
                self.map_toggle.value = which
            finally:
                self._syncing = False

    def _picture(self) -> tuple[list[Segment], list[LimitMarker], list[str], str, str | None]:
        """What the figure shows for the current plan and map: bars, markers, rows, title,
        message."""
        plan, which = self.plan, self.which
        buckets = self.shown_buckets()
        message = None
        if which == "rebuilt" and plan.rebuilt is None:
            message = ("No rebuilt map: torch never rebuilds buckets with "
                       "find_unused_parameters=True and static_graph=False.<br>"
                       "The initial map is used in every iteration.")
        title = (f"{markup.escape(plan.model)}: {which} map, {len(buckets)} bucket"
                 f"{'s' if len(buckets) != 1 else ''}, reduced top to bottom")
        return (segments(buckets), limit_markers(buckets), [bucket_label(b) for b in buckets],
                title, message)

    def _redraw(self) -> None:
        self._sync_toggle()
        bucket_figure.draw(self.figure, *self._picture())
        self.summary_html.value = self._summary()
        if self.marked is not None:
            self._draw_mark()

    def mark_bucket(self, bucket: int | None, note: str = "") -> None:
        """Highlight bucket `bucket`'s row (e.g. where the debugger's ranks stopped), with
        `note` written on it; None clears the highlight."""
        if (bucket, note) == (self.marked, self._mark_note):
            return
        self.marked, self._mark_note = bucket, note
        self._draw_mark()

    def _draw_mark(self) -> None:
        index = next((i for i, b in enumerate(self.shown_buckets()) if b.index == self.marked),
                     None)
        self.figure.layout.shapes = () if index is None else (
            bucket_figure.row_highlight(index, self._mark_note),)

    def _summary(self) -> str:
        plan, which = self.plan, self.which
        s = plan.settings
        settings = (f"bucket_cap_mb={s.bucket_cap_mb}"
                    + (f", bucket_cap_mb_list={list(s.bucket_cap_mb_list)}"
                       if s.bucket_cap_mb_list else "")
                    + f", find_unused_parameters={s.find_unused_parameters}"
                    + f", static_graph={s.static_graph}"
                    + (", DDP_SET_LAST_BUCKET_CAP=1" if s.set_last_bucket_cap else ""))
        total = sum(p.nbytes for p in plan.params)
        lines = [
            markup.fmt("<b>{}</b>: {} parameters, {} of gradients", plan.model,
                       len(plan.params), human_bytes(total)),
            markup.fmt("settings: <code>{}</code>", settings),
            _map_line(f"initial map ({_initial_span(plan)})", plan.initial, plan.limits.initial,
                      which == "initial"),
        ]
        if plan.rebuilt is None:
            text = "rebuilt map: none, torch never rebuilds with these settings"
            lines.append(markup.fmt("<b>▶ {}</b>", text) if which == "rebuilt"
                         else markup.escape(text))
        else:
            lines.append(_map_line(
                f"rebuilt map (iteration {_first_rebuilt_iteration(plan)} on, gradient-ready "
                f"order {plan.order_source})", plan.rebuilt, plan.limits.rebuild,
                which == "rebuilt"))
        body: str = markup.join(lines, markup.Markup("<br>"))
        if plan.notes:
            body += markup.fmt("<ul style='margin:2px 0'>{}</ul>", markup.join(
                markup.fmt("<li>{}</li>", n) for n in plan.notes))
        return markup.fmt("<div style='font-size:12px;line-height:1.4'>{}</div>",
                          markup.Markup(body))
