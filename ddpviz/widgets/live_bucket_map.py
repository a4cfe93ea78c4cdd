"""LiveBucketMap: the planner's BucketMap fed from a run's events, with per-bucket timing.

`ddpviz.plan.observed_plan` turns a rank's ParamsBuilt and BucketAssigned events into the plan
of the maps DDP actually used; the widget wraps the existing BucketMap
(one FigureWidget, created when the first map arrives), shows the map in force at the cursor's
iteration, and below it each bucket's timing averaged over the iterations that used that map.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.model.event_model import CONSTRUCTION, EventModel, Timed
from ddpviz.model.hook_analysis import bucket_averages, hook_columns
from ddpviz.plan import ObservedMaps, observed_plan
from ddpviz.units import human_bytes
from ddpviz.widgets.bucket_map import BucketMap, Which
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.replay_controls import Cursor

MAX_TIMING_ROWS = 1_000  # rows of the timing table; past it a line says how many are left


def map_disagreements(maps: dict[int, list[Timed]], rank: int) -> tuple[str, ...]:
    """Ranks whose bucket maps differ from `rank`'s (DDP requires the same buckets)."""
    def key(lst: list[Timed]) -> list[tuple[bool, tuple[tuple[int, ...], ...]]]:
        return [(m.event.rebuilt, m.event.buckets) for m in lst
                if isinstance(m.event, ev.BucketAssigned)]

    mine = key(maps.get(rank, []))
    out = []
    for r, lst in sorted(maps.items()):
        theirs = key(lst)
        if r != rank and theirs and theirs != mine[: len(theirs)]:
            out.append(f"rank {r}'s bucket map differs from rank {rank}'s")
    return tuple(out)


class LiveBucketMap(EventView):
    """The bucket maps a run really used, in the planner's BucketMap, plus bucket timing.

    Kernel-side state: `observed` (ObservedMaps or None), `bucket_map` (the BucketMap, None
    until the constructor's BucketAssigned arrives), `which` ("initial"/"rebuilt" in force at
    the cursor), `timing` (per-bucket averages), `header_html`, `timing_html`, `marked`
    (the bucket highlighted: where the debugger's ranks stopped, or None).
    """

    def __init__(self, source: object = None, **kwargs: Any) -> None:
        self.observed: ObservedMaps | None = None
        self.plan_error: str | None = None  # why the observed maps cannot be drawn
        self.bucket_map: BucketMap | None = None
        self.which: Which = "initial"
        self.marked: tuple[int, str] | None = None  # (bucket, note) to highlight
        self.timing: tuple[Any, ...] = ()
        self._plan_key: tuple[Any, ...] | None = None
        self._timing_key: tuple[Any, ...] | None = None
        super().__init__(source, **kwargs)

    @classmethod
    def embedded_in(cls, model: EventModel, **kwargs: Any) -> LiveBucketMap:
        return cls(model=model, embedded=True, controls=False, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.header_html = w.HTML()
        self.map_box = w.VBox()
        self.timing_html = w.HTML()
        return [self.header_html, self.map_box, self.timing_html]

    def render(self, cursor: Cursor) -> bool:
        self._update_plan(cursor)
        obs = self.observed
        if obs is None:
            self._set(self.header_html, markup.fmt(
                "<i style='font-size:12px'>{}</i>", self.plan_error) if self.plan_error else
                markup.fmt("<i style='font-size:12px'>waiting for the constructor's "
                           "BucketAssigned event</i>"))
            return False
        step = self._step(cursor)
        which = self.which = self._which(obs, cursor)
        assert self.bucket_map is not None
        if self.bucket_map.map_toggle.value != which:
            self.bucket_map.map_toggle.value = which  # the BucketMap redraws itself
        span = (f"iteration {obs.rebuilt_step} on" if which == "rebuilt" else
                "the constructor's map" + (f", iterations 0-{obs.rebuilt_step - 1}"
                                           if obs.rebuilt_step else ""))
        where = "construction" if step < 0 else f"iteration {step}"
        warn = markup.join(markup.fmt("<br><b style='color:#b42318'>✘ {}</b>", d)
                           for d in obs.disagreements)
        self._set(self.header_html, markup.fmt(
            "<div style='font-size:12px'>map in force at {}: <b>{}</b> ({}); observed on rank "
            "{}{}</div>", where, which, span, obs.rank, warn))
        self._draw_timing(step, which, obs, cursor)
        return False

    def mark_bucket(self, bucket: int | None, note: str = "") -> None:
        """Highlight bucket `bucket` in the map (now, or once the map is drawn); None clears
        it."""
        self.marked = None if bucket is None else (bucket, note)
        if self.bucket_map is not None:
            self.bucket_map.mark_bucket(bucket, note)

    def _step(self, cursor: Cursor) -> int:
        return cursor.step if cursor.step is not None else (self.model.steps or [-1])[-1]

    def _which(self, obs: ObservedMaps, cursor: Cursor) -> Which:
        """The map in force at the cursor's iteration."""
        step = self._step(cursor)
        return ("rebuilt" if obs.rebuilt_step is not None and step >= obs.rebuilt_step
                else "initial")

    def _update_plan(self, cursor: Cursor) -> None:
        # the plan depends on the maps seen by then and on iteration 0's hook order
        maps = self.model.maps(cursor.as_of)
        key = (self.model.versions["maps"], self.model.versions["construction"],
               self.model.settled(CONSTRUCTION, cursor.as_of),
               tuple(len(v) for v in maps.values()), self.model.settled(0, cursor.as_of),
               self.model.step_version(0))
        if key == self._plan_key:
            return
        self._plan_key = key
        states = self.model.construction(cursor.as_of)
        rank = next((r for r, s in states.items() if s.params is not None and maps.get(r)),
                    None)
        if rank is None:
            return
        built = states[rank].params
        assert built is not None and isinstance(built.event, ev.ParamsBuilt)
        order = None
        records = self.model.step_records(0, cursor.as_of).get(rank)
        if records is not None and records.backward_end is not None and not records.summarized:
            # (summarized at detail "buckets": unknown)
            order = hook_columns(records.grads)[0].tolist()
        try:
            observed = observed_plan(built.event, maps[rank], rank=rank,
                                     grad_ready_order=order)
        except ValueError as err:  # e.g. a dtype this torch does not know: say so, draw on
            self.plan_error = str(err)
            return
        self.plan_error = None
        observed = observed._replace(disagreements=map_disagreements(maps, rank))
        if self.observed is not None and self.observed.plan == observed.plan:
            self.observed = observed
            return
        self.observed = observed
        if self.bucket_map is None:
            # open on the map in force, so the figure ships its data once, not twice
            self.bucket_map = BucketMap(observed.plan, which=self._which(observed, cursor))
            self.map_box.children = [self.bucket_map]
            if self.marked is not None:
                self.bucket_map.mark_bucket(*self.marked)
        else:
            self.bucket_map.set_plan(observed.plan)

    def _draw_timing(self, step: int, which: Which, obs: ObservedMaps, cursor: Cursor) -> None:
        steps = [s for s in self.model.steps if s <= step and (
            (obs.rebuilt_step is None or s < obs.rebuilt_step) if which == "initial"
            else s >= (obs.rebuilt_step or 0))]
        key = (which, tuple(steps[-1:]), len(steps), cursor.as_of,
               self.model.step_version(steps[-1]) if steps else 0)
        if key == self._timing_key:
            return
        self._timing_key = key
        with self.model.lock():
            self.timing = bucket_averages(self.model.step_history(), steps)
        buckets = obs.plan.buckets(which) if which == "initial" or obs.plan.rebuilt else ()
        size = {b.index: b.nbytes for b in buckets}
        rows = markup.join(markup.fmt(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.bucket, human_bytes(size.get(t.bucket, 0)), t.iterations, _ms(t.ready_ms),
            _ms(t.allreduce_ms), _ms(t.exposed_ms)) for t in self.timing[:MAX_TIMING_ROWS])
        if len(self.timing) > MAX_TIMING_ROWS:
            rows = markup.join([rows, markup.fmt(
                "<tr><td colspan=6>… and {:,} more buckets (the first {:,} in reduction order "
                "are listed)</td></tr>", len(self.timing) - MAX_TIMING_ROWS, MAX_TIMING_ROWS)])
        text = ("" if not rows else markup.fmt(
                "<div style='font-size:12px'>per-bucket timing, mean over the iterations that "
                "used this map (max over ranks each):</div><table style='font-size:11px' "
                "cellpadding=2><tr><th>bucket</th><th>bytes</th><th>iterations</th>"
                "<th>ready ms after backward start</th><th>all-reduce ms</th>"
                "<th>exposed ms</th></tr>{}</table>", rows))
        self._set(self.timing_html, text)

    @staticmethod
    def _set(widget: w.HTML, value: str) -> None:
        if widget.value != value:
            widget.value = value


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.3f}"
