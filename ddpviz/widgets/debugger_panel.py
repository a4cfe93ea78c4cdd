"""DebuggerPanel: the debugger's controls in the dashboard, each calling the `Debugger`'s own
Python functions (ddpviz/debugger/client.py), never a second path to the ranks.

A status line (running; paused at step s before bucket k on every rank; which ranks are where),
the buttons pause / resume / step bucket / step step / abort, a break-at row (step, where,
bucket), the break set, and an inspect row (parameter, what, bucket) that shows the per-rank
values side by side. Clicking a bucket's bar in the bucket map (`attach_bucket_map`) or a
bucket in the hook timeline (`attach_timeline`) sets a break before that bucket's all-reduce
at the step in the break row; `stop_mark` says where the ranks are parked, for the dashboard
to mark on the timeline and the map. Errors show in the panel in words (escaped), as the
functions raise them. What an action prints lands in the panel's `output` area: for a %%ddp
pool's debugger, resume and step run the rest of the parked cell (blocking the kernel until
the ranks finish it or park again, as a resume typed in a cell does), so its output and result
show there, the latest continuation only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ddpviz import markup
from ddpviz.debugger import protocol as p
from ddpviz.debugger.client import Debugger
from ddpviz.findings import format_ranks
from ddpviz.widgets.bucket_figure import bar_traces
from ddpviz.widgets.bucket_map import BucketMap
from ddpviz.widgets.hook_timeline import HookTimeline
from ddpviz.widgets.timeline_svg import StopMark

_WHAT = [(label.replace("_", " "), label) for label in p.What.__args__]  # type: ignore[attr-defined]
_WHERE = [("before bucket's all-reduce", "bucket"), ("before forward", "forward"),
          ("after backward (all-reduced)", "after_backward"),
          ("after optimizer step", "optimizer_step")]


def _calling(action: Callable[[], object], failed: list[BaseException]) -> None:
    """`action()`; the error a Debugger function raises for the user goes into `failed`."""
    try:
        action()
    except (ValueError, RuntimeError, TimeoutError) as exc:  # DebuggerError included
        failed.append(exc)


def _button(text: str, tip: str, style: str = "") -> w.Button:
    return w.Button(description=text, tooltip=tip, button_style=style,
                    layout=w.Layout(width="auto"))


class DebuggerPanel(w.VBox):
    """The debugger's controls for one `Debugger`.

    Kernel-side state (for tests and scripts): `debugger`, `status_html`, the buttons
    (`pause_button`, `resume_button`, `step_bucket_button`, `step_step_button`,
    `abort_button`, `break_button`, `clear_button`, `inspect_button`), the inputs
    (`break_step`, `break_where`, `break_bucket`, `inspect_name`, `inspect_what`,
    `inspect_bucket`), `message_html` (the last error or confirmation), `result_html` (the
    last inspect's table), `result` (the last RankValues), `output` (what the last resume or
    step printed: a %%ddp pool's parked cell goes on there).
    """

    def __init__(self, debugger: Debugger) -> None:
        self.debugger = debugger
        self.result: Any = None
        self.status_html = w.HTML()
        self.message_html = w.HTML()
        self.result_html = w.HTML()
        self.breaks_html = w.HTML()
        self.output = w.Output()
        self.pause_button = _button("pause", "stop every rank at the next step", "warning")
        self.resume_button = _button("resume", "let every rank go on", "success")
        self.step_bucket_button = _button("step bucket",
                                          "go on to before the next bucket's all-reduce")
        self.step_step_button = _button("step step", "go on to before the next forward")
        self.abort_button = _button("abort", "end every rank (traces saved)", "danger")
        # A break set now reaches ranks between steps at their next forward and applies from
        # the step after it (See [Note: claiming a boundary]): the first step it surely stops
        self.break_step = w.BoundedIntText(value=debugger.next_step() + 1, min=0, max=1 << 40,
                                           description="step", layout=w.Layout(width="150px"))
        self.break_where = w.Dropdown(options=_WHERE, value="bucket",
                                      layout=w.Layout(width="200px"))
        self.break_bucket = w.BoundedIntText(value=0, min=0, max=1 << 20,
                                             description="bucket",
                                             layout=w.Layout(width="150px"))
        self.break_button = _button("break at", "stop every rank there")
        self.clear_button = _button("clear breaks", "remove every break")
        self.inspect_name = w.Combobox(options=debugger.param_names(), placeholder="parameter name",
                                       ensure_option=False, layout=w.Layout(width="220px"))
        self.inspect_what = w.Dropdown(options=_WHAT, value="grad",
                                       layout=w.Layout(width="190px"))
        self.inspect_bucket = w.BoundedIntText(value=0, min=0, max=1 << 20,
                                               description="bucket",
                                               layout=w.Layout(width="150px"))
        self.inspect_button = _button("inspect", "the tensor on every paused rank")
        actions: list[tuple[w.Button, Callable[[], object]]] = [
            (self.pause_button, debugger.pause),
            (self.resume_button, self._going_on(debugger.resume)),
            (self.step_bucket_button, self._going_on(lambda: debugger.step("bucket",
                                                                          wait=False))),
            (self.step_step_button, self._going_on(lambda: debugger.step("step", wait=False))),
            (self.abort_button, self._abort),
            (self.break_button, self._break_at),
            (self.clear_button, debugger.clear),
            (self.inspect_button, self._inspect),
        ]
        for button, action in actions:
            button.on_click(self._doing(action))
        self._hooked: set[int] = set()  # figures and timelines that call break_at on a click
        self._stop_listening = debugger.on_change(self.refresh)
        self._stop_hearing: list[Callable[[], None]] = []  # timelines' click listeners
        super().__init__(children=[
            self.status_html,
            w.HBox([self.pause_button, self.resume_button, self.step_bucket_button,
                    self.step_step_button, self.abort_button]),
            w.HBox([self.break_step, self.break_where, self.break_bucket, self.break_button,
                    self.clear_button]),
            self.breaks_html,
            w.HBox([self.inspect_name, self.inspect_what, self.inspect_bucket,
                    self.inspect_button]),
            self.message_html, self.result_html, self.output])
        self.refresh()

    # --- what the buttons do ------------------------------------------------------------------

    def _doing(self, action: Callable[[], object]) -> Callable[[w.Button], None]:
        def clicked(_button: w.Button) -> None:
            self.run(action)
        return clicked

    def _going_on(self, action: Callable[[], object]) -> Callable[[], object]:
        """`action` (resume, step), with the output area cleared first: it shows the latest
        continuation of a pool's parked cell."""
        def go_on() -> object:
            self.output.clear_output()
            return action()
        return go_on

    def run(self, action: Callable[[], object]) -> bool:
        """Call one of the Debugger's functions; show its error, if any, in the panel, and
        what it prints in `output` (on the kernel's main thread: a widget's capture follows the
        message being handled). Returns whether it succeeded."""
        failed: list[BaseException] = []
        if threading.current_thread() is threading.main_thread():
            with self.output:  # (inside: an Output shows and swallows what escapes it)
                _calling(action, failed)
        else:
            _calling(action, failed)
        if failed:
            self._say(str(failed[0]), error=True)
            return False
        self._say("")
        self.refresh()
        return True

    def _say(self, text: str, *, error: bool = False) -> None:
        self.message_html.value = "" if not text else markup.fmt(
            "<div style='font-size:12px;white-space:pre-wrap;color:{}'>{}</div>",
            "#b42318" if error else "#555", text)

    def _break_at(self) -> None:
        where = self.break_where.value
        self.debugger.break_at(self.break_step.value,
                               self.break_bucket.value if where == "bucket" else None,
                               where=where)

    def _inspect(self) -> None:
        what = self.inspect_what.value
        if what in ("bucket_buffer", "bucket_grads"):
            values = self.debugger.inspect_bucket(self.inspect_bucket.value, what)
        else:
            values = self.debugger.inspect(self.inspect_name.value.strip(), what)
        self.result = values
        self.result_html.value = values._repr_html_()

    def _abort(self) -> None:
        # the ranks take up to 5 s to end: wait for them off the kernel's main thread
        self.debugger.abort(wait=False)
        threading.Thread(target=self._after_abort, daemon=True,
                         name="ddpviz-debugger-abort").start()

    def _after_abort(self) -> None:
        self.run(self.debugger.abort)

    # --- the bucket map -----------------------------------------------------------------------

    def attach_bucket_map(self, bucket_map: BucketMap | None) -> None:
        """Make a click on a bucket's bar in `bucket_map` set a break before that bucket's
        all-reduce at the step in the break row (once per figure)."""
        if bucket_map is None or id(bucket_map.figure) in self._hooked:
            return
        self._hooked.add(id(bucket_map.figure))
        for trace in bar_traces(bucket_map.figure):
            trace.on_click(self._bar_clicked, append=True)

    def _bar_clicked(self, _trace: Any, points: Any, _state: Any) -> None:
        ys = list(getattr(points, "ys", []) or [])
        if not ys:
            return
        label = str(ys[0])  # "3 · float32 · cap 25 MiB": the bucket's index first
        try:
            bucket = int(label.split(" · ", 1)[0])
        except ValueError:
            self._say(f"ddpviz: cannot tell which bucket {label!r} is.", error=True)
            return
        self.bucket_clicked(bucket)

    def attach_timeline(self, timeline: HookTimeline) -> None:
        """Make a click on a bucket in `timeline` (an all-reduce span or a bucket's hooks)
        set a break before that bucket's all-reduce at the step in the break row (once)."""
        if id(timeline) in self._hooked:
            return
        self._hooked.add(id(timeline))
        self._stop_hearing.append(timeline.on_bucket_click(self.bucket_clicked))

    def bucket_clicked(self, bucket: int) -> None:
        """What a click on bucket `bucket` does: a break before its all-reduce at the step in
        the break row, said in the panel."""
        self.break_where.value = "bucket"
        self.break_bucket.value = bucket
        if self.run(self._break_at):
            self._say(f"break set before bucket {bucket}'s all-reduce at step "
                      f"{self.break_step.value}")

    # --- drawing ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Redraw the status line and the break set (the Debugger calls it on every park)."""
        dbg = self.debugger
        stop = dbg.stop
        status = dbg.status()
        color = "#555" if stop is None else ("#1a7f37" if stop.agreed else "#8a5300")
        text = markup.fmt("<div style='font-size:12px;background:#f6f8fa;padding:3px 6px;"
                          "border-radius:3px'><b>debugger</b> · <span style='color:{}'>{}"
                          "</span>{}</div>", color, status,
                          markup.fmt("<br>{}", "; ".join(repr(stop).splitlines()[1:]))
                          if stop is not None else "")
        if self.status_html.value != text:
            self.status_html.value = text
        breaks = "; ".join(_break_text(b) for b in dbg.breaks)
        text = markup.fmt("<div style='font-size:11px;color:#555'>breaks: {}</div>",
                          breaks or "none")
        if self.breaks_html.value != text:
            self.breaks_html.value = text
        if not self.inspect_name.options:
            names = dbg.param_names()
            if names:
                self.inspect_name.options = names

    def stop_mark(self, aligned: Callable[[int, int], int] | None = None) -> StopMark | None:
        """Where the ranks are parked now, for the timeline and the map to mark (the point
        most ranks are at); None while none is.

        Args:
            aligned: (rank, t_ns) -> the time on the drawing's clock (the dashboard's model's
                `aligned_ns`); None: the marks go at each lane's last event.
        """
        stop = self.debugger.stop
        if stop is None:
            return None
        ranks = stop.groups[0].ranks
        times = tuple((r, aligned(r, stop.ranks[r].t_ns)) for r in ranks
                      if aligned is not None and stop.ranks[r].t_ns)
        label = stop.where if stop.agreed else f"{stop.where} ({format_ranks(ranks)})"
        return StopMark(stop.step, stop.point, stop.bucket, times, label)

    def close(self) -> None:
        self._stop_listening()
        for remove in self._stop_hearing:
            remove()
        super().close()


def _break_text(b: p.ANY_BREAK) -> str:
    if isinstance(b, p.BreakAt):
        return (f"step {b.step} bucket {b.bucket}" if b.where == "bucket"
                else f"step {b.step} {b.where.replace('_', ' ')}")
    if isinstance(b, p.BreakOn):
        return f"on {b.kind}"
    return f"when {b.predicate}"
