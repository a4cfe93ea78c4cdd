"""Dashboard: the four event widgets over one model, one throttle and one pair of sliders.

`run.dashboard()`, `session.dashboard()` and `Trace.load(p).dashboard()` build one. A status
header (source, ranks connected, phase, iteration, events/s, dropped and rejected counts) sits
above the replay sliders; then DDP's life in the walk-through's order: parameters and
verification, broadcast, buckets, hooks and all-reduce. The only plotly FigureWidget is the
BucketMap's (~5 MB of plotly.js, shipped once); everything else is light ipywidgets
and small anywidgets (the hook timeline's SVG, which reports clicks on buckets; the Open in
Perfetto / Save Chrome trace buttons, which fetch the run only when pressed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ddpviz import markup
from ddpviz._diagnose.verdict import verdict, verdict_line
from ddpviz.findings import Finding, format_ranks, sort_findings
from ddpviz.model.event_model import Status
from ddpviz.model.verification_matrix import group_ranks
from ddpviz.traces.source import RunSource, open_run
from ddpviz.widgets.advice_view import AdviceTab
from ddpviz.widgets.broadcast_progress import BroadcastProgress
from ddpviz.widgets.debugger_panel import DebuggerPanel
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.hook_timeline import HookTimeline
from ddpviz.widgets.live_bucket_map import LiveBucketMap
from ddpviz.widgets.perfetto_button import PerfettoButton
from ddpviz.widgets.replay_controls import Cursor
from ddpviz.widgets.replica_view import ReplicaView
from ddpviz.widgets.static_copy import static_copy, with_copy
from ddpviz.widgets.trace_feed import Pace
from ddpviz.widgets.trace_view import TraceViewError
from ddpviz.widgets.verification_view import VerificationView
from ddpviz.widgets.wait_table import WaitTable

if TYPE_CHECKING:
    from ddpviz.debugger.client import Debugger


def _heading(text: str) -> w.HTML:
    return w.HTML(markup.fmt("<div style='font-weight:bold;font-size:13px;border-bottom:1px "
                             "solid #ddd;margin-top:6px'>{}</div>", text))


class Dashboard(EventView):
    """Everything about a DDP run in one widget, live or replayed.

    Kernel-side state: `verification`, `broadcast`, `timeline`, `buckets` (the four widgets),
    `status` (the header's `Status`), `status_html`, `controls` (the sliders), `throttle`
    (redraw counts), `source`, `perfetto` (the Open in Perfetto buttons; None without a source).

    Args:
        source: a `ddpviz.Run`, a `Session`, a `Trace`, a `.ddpviz` path or a list of events.
        max_hz: live redraws per second at most.
        timeline_bytes_per_s: live byte budget of the hook timeline's redraws.
        debugger: show the debugger's panel (ddpviz/widgets/debugger_panel.py) for this
            `Debugger`; True: the source's (`run.debugger`, `session.debugger`); None
            (default): for a launch with debug=True; False: never.
    """

    def __init__(self, source: object = None, *, max_hz: float = 10.0,
                 timeline_bytes_per_s: int = 30_000, debugger: Debugger | bool | None = None,
                 **kwargs: Any) -> None:
        self._timeline_budget = timeline_bytes_per_s
        self._debugger = _debugger_of(source, debugger)
        self.status: Status | None = None
        self._name = Path(source).name if isinstance(source, (str, Path)) else "run"
        # the source read once (files parsed once): the model, the wait table, the advisor,
        # diagnose(), the Perfetto button and the static copy all read this one
        self._advised = _opened(source)
        self._diagnosis: tuple[int, bool, list[Finding] | None] | None = None
        self._pace = Pace()  # a live run's diagnose(): how often it may run
        super().__init__(self._advised, max_hz=max_hz, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.status_html = w.HTML()
        self.advice = AdviceTab(self._advised, model=self.model)  # the advisor reads our model
        self.waits = WaitTable(self._advised)
        self.verification = VerificationView.embedded_in(self.model)
        self.broadcast = BroadcastProgress.embedded_in(self.model)
        self.buckets = LiveBucketMap.embedded_in(self.model)
        self.timeline = HookTimeline.embedded_in(self.model,
                                                 live_bytes_per_s=self._timeline_budget)
        self.replicas = ReplicaView.embedded_in(self.model)
        for part in (self.verification, self.broadcast, self.buckets, self.timeline,
                     self.replicas):
            # one lock for every redraw: the throttle's thread and the sections' own controls
            # (row and rank pickers) never draw at the same time
            part._render_lock = self._render_lock
        half = w.Layout(flex="1 1 420px", min_width="360px", margin="0 8px 0 0")
        self.debugger_panel = (DebuggerPanel(self._debugger) if self._debugger is not None
                               else None)
        self._stop_listening: Callable[[], None] | None = None
        if self.debugger_panel is not None:
            # a click on a bucket in the timeline sets a break there; a park (or its end)
            # redraws the timeline and the map with the stop marked (or cleared)
            self.debugger_panel.attach_timeline(self.timeline)
            self._stop_listening = self.debugger_panel.debugger.on_change(self._request)
        self.perfetto = _perfetto_button(self._advised, self._name)
        return [
            self.status_html,
            *([self.perfetto] if self.perfetto is not None else []),
            *([self.debugger_panel] if self.debugger_panel is not None else []),
            w.HBox([w.VBox([_heading("1-2 · parameters and verification"), self.verification],
                           layout=half),
                    w.VBox([_heading("2-3 · verification exchange and state broadcast"),
                            self.broadcast], layout=half)],
                   layout=w.Layout(flex_flow="row wrap")),
            _heading("4 · buckets (the maps DDP really used)"), self.buckets,
            _heading("5-6 · forward and backward: hooks, buckets, all-reduce"), self.timeline,
            _heading("who made each bucket's all-reduce wait (rank x bucket)"), self.waits.widget,
            _heading("7 · replicas after each optimizer step (docs/replicas.md)"), self.replicas,
            self.advice,
        ]

    def render(self, cursor: Cursor) -> bool:
        if self.debugger_panel is not None:  # where the ranks are parked, marked (or not)
            mark = self.debugger_panel.stop_mark(self.model.aligned_ns)
            self.timeline.mark_stop(mark)
            self.buckets.mark_bucket(mark.bucket if mark is not None and mark.point == "bucket"
                                     else None, "⏸ the ranks stopped before this bucket's "
                                     "all-reduce")
        deferred = False
        for part in (self.verification, self.broadcast, self.buckets, self.timeline,
                     self.replicas):
            deferred |= part.render(cursor)
        if self.debugger_panel is not None:  # a click on a bucket sets a break there
            self.debugger_panel.attach_bucket_map(self.buckets.bucket_map)
        self._draw_status(cursor)
        self.waits.update()
        if self.status is not None and self.status.steps:
            self.advice.update(min(self.status.steps.values()) + 1)
        return deferred

    def _draw_status(self, cursor: Cursor) -> None:
        status = self.model.status(cursor.as_of)
        self.status = status
        src = self.source
        stats = src.stats() if src.stats is not None else None
        world = status.world_size or len(status.ranks)
        parts: list[str] = [markup.fmt("<b>{}</b>", src.label)]  # join below escapes plain ones
        if src.run_status is not None:
            parts.append(f"run {src.run_status()}")
        if stats is not None:
            connected = len(stats.received)
            finished = len(stats.closed)
            parts.append(f"{connected} of {world} ranks connected, {finished} finished")
        else:
            parts.append(f"{len(status.ranks)} of {world} ranks in the trace")
        phases = group_ranks({r: p for r, p in status.phases.items()})
        if phases:
            parts.append("phase: " + "; ".join(f"{format_ranks(rs)} {p}" for p, rs in phases))
        steps = sorted(set(status.steps.values()))
        if steps:
            shown = "constructor" if steps[-1] < 0 else (
                f"{steps[-1]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}")
            parts.append(f"iteration {shown}")
        rate = (f"{status.events_per_s:,.0f} events/s" if src.is_live()
                else f"{status.events_per_s:,.0f} events/s over the steps")
        parts.append(f"{status.events:,} events ({rate})")
        dropped = status.dropped
        rejected = 0
        gaps = 0
        if stats is not None:
            dropped = max(dropped, sum(stats.dropped.values()))
            rejected = stats.total_rejected
            gaps = sum(stats.gaps.values())
        # The findings lead, as one verdict and the most severe title: diagnose()'s, as `ddpviz
        # diagnose`, the report and trace.view() say them, of the whole run once it is over, of
        # the run so far while it runs (its finished steps: See [Note: a run still going] in
        # _diagnose/diagnosis.py); for events fed by hand, what the ranks reported.
        live = self._advised is not None and self._advised.running
        diagnosed = self._diagnosed(live)
        findings = diagnosed if diagnosed is not None else sort_findings(
            f for f in self.model.findings(cursor.as_of) if isinstance(f, Finding))
        if findings or diagnosed is not None:
            title = findings[0].title if findings else ""
            parts.insert(0, markup.fmt("<span style='color:{};font-weight:bold' title='{}'>{}{}{}{}"
                                       "</span>", _VERDICT_COLORS[verdict(findings)],
                                       "what the ranks reported so far" if diagnosed is None
                                       else "ddpviz.diagnose() of the run so far (its steps "
                                       "every rank finished)" if live
                                       else "ddpviz.diagnose() of the whole run",
                                       "so far: " if live and diagnosed is not None else "",
                                       verdict_line(findings).rstrip("."),
                                       f" · {title}" if title else "",
                                       " …" if len(findings) > 1 else ""))
        bad = "color:#b42318;font-weight:bold" if dropped or rejected or gaps else "color:#555"
        parts.append(markup.fmt("<span style='{}'>{:,} dropped · {:,} rejected{}</span>", bad,
                                dropped, rejected, f" · {gaps:,} lost" if gaps else ""))
        text = markup.fmt("<div style='font-size:12px;background:#f6f8fa;padding:3px 6px;"
                          "border-radius:3px'>{}</div>", markup.join(parts, " · "))
        if self.status_html.value != text:
            self.status_html.value = text


    def _diagnosed(self, live: bool | None = None) -> list[Finding] | None:
        """diagnose()'s findings: of a run that is over, once for each count of events (a
        finished run's do not change); of a run still going, again at most every
        DIAGNOSE_EVERY_S and within DIAGNOSE_SHARE of the time (trace_feed.Pace: the
        dashboard's redraws run at up to max_hz). `live`: whether the run is still going (None:
        the source says, `RunSource.running`). None for events fed by hand, or a source
        diagnose() cannot read."""
        if self._advised is None:
            return None
        if live is None:
            live = self._advised.running
        n = len(self.model)
        cached = self._diagnosis
        if cached is not None and cached[1] == live and (
                cached[0] == n or (live and not self._pace.due())):
            return cached[2]
        from ddpviz._diagnose.diagnosis import diagnose

        started = time.monotonic()
        try:
            found: list[Finding] | None = list(diagnose(self._advised))
        except Exception:  # (a source diagnose() cannot read: the ranks' own findings)
            found = None
        if live:
            self._pace.ran(started)
        self._diagnosis = (n, live, found)
        return found

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # beside the widget, for hosts without widgets (nbconvert, nbviewer): See static_copy.py
        return with_copy(super()._repr_mimebundle_(**kwargs), static_copy(
            self._advised, live=self.source.is_live(), events=len(self.model)))

    def close(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
        super().close()


def _opened(source: object) -> RunSource | None:
    """`source` opened once for every part of the dashboard (None: events fed by hand); bare
    events are listed now, since an iterator can be read only once."""
    if source is None:
        return None
    run = open_run(source, refusal="cannot show events from")
    if run.kind == "events" and not isinstance(run.events, (list, tuple)):
        return replace(run, events=list(run.events))
    return run


def _perfetto_button(source: object, name: str) -> PerfettoButton | None:
    """The run's Open in Perfetto / Save Chrome trace buttons; None for events fed by hand, or
    where the front end is not built (a checkout without node: the dashboard draws without)."""
    if source is None:
        return None
    try:
        return PerfettoButton(source, name=name)
    except TraceViewError:
        return None


def _debugger_of(source: object, debugger: Debugger | bool | None) -> Debugger | None:
    """The Debugger whose panel the dashboard shows: the one given; True: the source's
    (`run.debugger`, `session.debugger`); None (default): a launch's with debug=True."""
    if debugger is None:
        debugger = bool(getattr(source, "debug", False))
    if debugger is False:
        return None
    if debugger is True:
        if not hasattr(source, "debugger"):
            raise ValueError(f"ddpviz: Dashboard(debugger=True) needs a live Run or Session, "
                             f"not {type(source).__name__}; recorded runs cannot be paused.")
        return source.debugger
    return debugger


_VERDICT_COLORS = {"errors": "#b42318", "warnings": "#8a5300", "healthy": "#555"}


def dashboard(source: object = None, **kwargs: Any) -> Dashboard:
    """A Dashboard for a Run, Session, Trace, `.ddpviz` path or list of events."""
    return Dashboard(source, **kwargs)
