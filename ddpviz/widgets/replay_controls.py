"""ReplayControls: the iteration and time sliders shared by every event widget.

A `Cursor` says what to show: `step` (the iteration the timeline and bucket map show) and
`as_of` (an aligned time: show the state at that instant). Live, "follow" is on and the cursor
is (None, None): the latest of everything. Moving either slider turns follow off: the time
slider picks an instant (and the iteration going on then); the iteration slider jumps to the
end of that iteration. Iteration -1 is the constructor (verification, broadcast, buckets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import ipywidgets as w

from ddpviz import markup
from ddpviz.model.event_model import CONSTRUCTION, EventModel

TIME_TICKS = 1000  # positions of the time slider over the whole run


class Cursor(NamedTuple):
    step: int | None  # None: the latest iteration
    as_of: int | None  # aligned ns; None: everything received


LATEST = Cursor(None, None)


class ReplayControls(w.HBox):
    """Args:
        model: the events the sliders range over.
        on_change: called with no arguments after the cursor moved (slider or code).
        live: start in follow mode (new events move the view along).
    """

    def __init__(self, model: EventModel, on_change: Callable[[], None], *,
                 live: bool) -> None:
        self.model = model
        self._on_change = on_change
        self._syncing = False
        self.follow = w.Checkbox(value=live, description="follow live", indent=False,
                                 layout=w.Layout(width="110px"))
        self.iteration = w.IntSlider(value=CONSTRUCTION, min=CONSTRUCTION, max=CONSTRUCTION,
                                     description="iteration", continuous_update=False,
                                     style={"description_width": "initial"},
                                     layout=w.Layout(width="300px"))
        self.time = w.IntSlider(value=TIME_TICKS, min=0, max=TIME_TICKS, readout=False,
                                description="time", continuous_update=False,
                                layout=w.Layout(width="340px"))
        self.readout = w.HTML(layout=w.Layout(width="auto"))
        self.iteration.observe(self._on_iteration, names="value")
        self.time.observe(self._on_time, names="value")
        self.follow.observe(self._on_follow, names="value")
        super().__init__([self.follow, self.iteration, self.time, self.readout],
                         layout=w.Layout(align_items="center", flex_flow="row wrap"))
        self._as_of: int | None = None
        self.sync_range()
        if not live:  # a replay opens on its last iteration, everything shown
            steps = model.steps
            self._syncing = True
            try:
                self.iteration.value = steps[-1] if steps else CONSTRUCTION
            finally:
                self._syncing = False
            self._show_readout()

    # --- state --------------------------------------------------------------------------

    def cursor(self) -> Cursor:
        if self.follow.value:
            return LATEST
        return Cursor(int(self.iteration.value), self._as_of)

    def sync_range(self) -> None:
        """Extend the sliders to the events received so far (follow mode tracks the end)."""
        steps = self.model.steps
        top = steps[-1] if steps else CONSTRUCTION
        self._syncing = True
        try:
            if self.iteration.max != top:
                self.iteration.max = top
            if self.follow.value:
                if self.iteration.value != top:
                    self.iteration.value = top
                if self.time.value != TIME_TICKS:
                    self.time.value = TIME_TICKS
        finally:
            self._syncing = False
        self._show_readout()

    def show_step(self, step: int) -> None:
        """Jump to the end of iteration `step` (-1: the constructor), follow off."""
        self._syncing = True
        try:
            self.follow.value = False
            self.iteration.max = max(self.iteration.max, step)
            self.iteration.value = step
        finally:
            self._syncing = False
        self._seek_step(step)

    def show_time(self, fraction: float) -> None:
        """Jump to `fraction` (0..1) of the run's time, follow off."""
        tick = round(max(0.0, min(1.0, fraction)) * TIME_TICKS)
        self._syncing = True
        try:
            self.follow.value = False
            self.time.value = tick
        finally:
            self._syncing = False
        self._seek_time(tick)

    def seek(self, t_ns: int) -> None:
        """Show the state at aligned time `t_ns` exactly (the slider moves to the nearest
        tick), follow off."""
        self._syncing = True
        try:
            self.follow.value = False
        finally:
            self._syncing = False
        self._as_of = t_ns
        step = self.model.step_at(t_ns)
        self._syncing = True
        try:
            if step is not None:
                self.iteration.max = max(self.iteration.max, step)
                self.iteration.value = step
        finally:
            self._syncing = False
        self._set_time_slider()
        self._show_readout()
        self._on_change()

    def show_latest(self) -> None:
        """Back to following the live end."""
        self.follow.value = True

    # --- reactions ----------------------------------------------------------------------

    def _on_follow(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        if change["new"]:
            self._as_of = None
            self.sync_range()
        else:
            self._seek_step(int(self.iteration.value))
            return
        self._on_change()

    def _on_iteration(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._stop_following()
        self._seek_step(int(change["new"]))

    def _on_time(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._stop_following()
        self._seek_time(int(change["new"]))

    def _stop_following(self) -> None:
        if self.follow.value:
            self._syncing = True
            try:
                self.follow.value = False
            finally:
                self._syncing = False

    def _seek_step(self, step: int) -> None:
        bounds = self.model.step_bounds(step)
        self._as_of = bounds[1] if bounds else None
        self._set_time_slider()
        self._show_readout()
        self._on_change()

    def _seek_time(self, tick: int) -> None:
        span = self.model.time_range()
        if span is None:
            self._as_of = None
        else:
            self._as_of = span[0] + (span[1] - span[0]) * tick // TIME_TICKS
            step = self.model.step_at(self._as_of)
            if step is not None and step != self.iteration.value:
                self._syncing = True
                try:
                    self.iteration.max = max(self.iteration.max, step)
                    self.iteration.value = step
                finally:
                    self._syncing = False
        self._show_readout()
        self._on_change()

    def _set_time_slider(self) -> None:
        span = self.model.time_range()
        if span is None or self._as_of is None or span[1] == span[0]:
            return
        tick = round((self._as_of - span[0]) * TIME_TICKS / (span[1] - span[0]))
        self._syncing = True
        try:
            self.time.value = max(0, min(TIME_TICKS, tick))
        finally:
            self._syncing = False

    def _show_readout(self) -> None:
        span = self.model.time_range()
        if span is None:
            text = "no events yet"
        elif self.follow.value:
            text = f"live · {(span[1] - span[0]) / 1e6:,.1f} ms so far"
        else:
            at = self._as_of if self._as_of is not None else span[1]
            step = self.iteration.value
            where = "constructor" if step == CONSTRUCTION else f"iteration {step}"
            text = (f"t = {(at - span[0]) / 1e6:,.3f} ms of {(span[1] - span[0]) / 1e6:,.1f}"
                    f" ms · {where}")
        html = markup.fmt("<span style='font-size:12px;color:#555'>{}</span>", text)
        if self.readout.value != html:
            self.readout.value = html
