"""TraceView: the JupyterLab trace viewer's panels as an anywidget, for every notebook host.

The front end is extension/src/traceWidget.ts, the viewer's own parse, model and view code
bundled on its own (extension/build-widget.js) into static/trace_view.js: one set of
TypeScript components draws a `.ddpviz` file in JupyterLab's file viewer and this widget. The
kernel sends the run as `.ddpviz` bytes in binary buffers, never markup; the iteration
and rank pickers, hover and scrolling then run in the browser, also while the kernel is busy
with a cell. Any host that renders anywidget draws it: JupyterLab, Notebook 7, marimo
(`mo.ui.anywidget(view)`), VS Code, Colab (docs/guide/jupyterlab.md says which were tried).

A live source (a Run still running, a Session) is followed on a daemon thread: only the
events new since the last send go out, at most twice a second, and diagnose()'s findings
again at a slower pace it can afford, until the source ends (See [Note: a live view's wire],
trace_feed.py). Any other source is sent once; `refresh()` sends it again. The bucket
advisor's answer (sent as data, drawn in the browser) is computed on a second daemon thread,
since it takes far longer than diagnose(): once, or for a live source again at a pace of its
own (the same rule as diagnose()'s) and once more when the source ends.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anywidget
import traitlets

from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.advisor.wire import PENDING, advice_bytes
from ddpviz.events import Event
from ddpviz.findings import Finding
from ddpviz.traces.source import RunSource, open_run
from ddpviz.traces.view_bytes import (
    STATIC,
    TraceViewError,
    diagnosis_bytes,
    front_end,
    summary_notice,
    view_bytes,
)
from ddpviz.widgets import trace_feed
from ddpviz.widgets.debugger_wire import DebuggerWire, debugger_of
from ddpviz.widgets.static_copy import static_copy, with_copy
from ddpviz.widgets.trace_feed import LiveFile, Pace, Refused, status_of

__all__ = ["MAX_BYTES", "TraceView", "TraceViewError"]

# The most a view sends to the browser (a live view: in all, the run when it was made and
# every send of new events since). A trace's events are ~50 bytes each; the view reads
# `max_events` of them per panel, and a bigger run belongs in the file viewer, which reads the
# file itself (no kernel message), or in the dashboard.
MAX_BYTES = 64 << 20
# the bucket colour schemes of extension/src/colors.ts's PALETTES (test_trace_view checks them)
SCHEMES = ("tableau10", "okabe-ito", "viridis")


class TraceView(anywidget.AnyWidget):
    """The trace viewer's panels for one run, drawn in the browser.

    Its verdict and findings are `ddpviz.diagnose()`'s for the run, computed in the kernel
    when the view is made (and on `refresh()`; for a live run again while it runs, labelled
    "so far"): the same set `ddpviz diagnose`, the report and the CLI give, where JupyterLab's
    file viewer, which has no kernel, shows only what the ranks reported while the job ran.

    Kernel-side state: `trace` (the `.ddpviz` bytes sent when the view was made or
    refreshed), `trace_events` (the events in it), `events_sent` (those and every live send
    since), `live` ("running" while a live source runs, then how it ended: "finished",
    "failed", "closed", ...; "" for a source that is not live), `status` (a live source's
    status line from the kernel: trace_feed.live_status; {} otherwise), `notice` (a line the view
    shows, e.g. why it stopped following), `findings` (diagnose()'s), `diagnosis` (those, as
    sent), `advice` (the bucket advisor's answer for the run, or why it cannot advise, as
    sent: ddpviz/advisor/wire.py; `wire.PENDING` until the advisor's thread has it; `advised`
    is set each time it is sent), `name` (the title shown),
    `scheme` (bucket colours: "tableau10", "okabe-ito", "viridis"), `max_events` (events each
    panel reads at most, as the viewer's setting).

    Args:
        source: a `Trace`, a `.ddpviz` path or a folder of them, a `ddpviz.Run`, a `Session`,
            or a list of events.
        scheme: the bucket colour scheme.
        max_events: events each panel reads at most.
        name: the title shown; None: the file's or folder's name, else the source's type.
        debugger: a `Debugger` whose panel the view draws above the run (`debugger_state`,
            ddpviz/widgets/debugger_wire.py); True: the source's (`run.debugger`,
            `session.debugger`); None: none.

    Raises:
        TraceViewError: the run is over `MAX_BYTES` as a trace, or the front end is not built.
        SourceError: `source` is no kind of run (see ddpviz/traces/source.py).
    """

    _esm = front_end("trace_view.js")
    _css = front_end("trace_view.css")
    trace = traitlets.Bytes(b"").tag(sync=True)
    trace_events = traitlets.Int(0).tag(sync=True)
    events_sent = traitlets.Int(0).tag(sync=True)
    live = traitlets.Unicode("").tag(sync=True)
    notice = traitlets.Unicode("").tag(sync=True)
    status = traitlets.Dict({}).tag(sync=True)  # a live source's: trace_feed.live_status
    diagnosis = traitlets.Bytes(b"").tag(sync=True)
    advice = traitlets.Bytes(b"").tag(sync=True)
    name = traitlets.Unicode("").tag(sync=True)
    scheme = traitlets.Unicode("tableau10").tag(sync=True)
    max_events = traitlets.Int(20000).tag(sync=True)
    # the debugger panel's state as JSON (ddpviz/widgets/debugger_wire.py); "" without one
    debugger_state = traitlets.Unicode("").tag(sync=True)

    def __init__(self, source: object, *, scheme: str = "tableau10", max_events: int = 20000,
                 name: str | None = None, debugger: Any = None, **kwargs: Any) -> None:
        if not self._esm or not self._css:
            raise TraceViewError(
                f"ddpviz: the TraceView's front end (trace_view.js and .css) is not built in "
                f"{STATIC}.\nInstall ddpviz from a wheel, or build it in a checkout: cd "
                "extension && jlpm install && jlpm build.")
        if scheme not in SCHEMES:
            raise ValueError(f"ddpviz: scheme must be one of {', '.join(map(repr, SCHEMES))}; "
                             f"got {scheme!r}.")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"ddpviz: max_events must be a positive int, got {max_events!r}.")
        self.debugger = debugger_of(source, debugger)  # (before anything is started)
        self.debugger_wire: DebuggerWire | None = None
        self._source = source
        self._stop = threading.Event()
        self._send_lock = threading.RLock()  # a send of frames or of the whole file at a time
        self._pending_lock = threading.Lock()
        self._pending: list[Event] = []  # received from a live source, not yet sent
        self._file: LiveFile | None = None  # a live source's file as sent so far
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None
        self.pace = Pace()
        self.advice_pace = Pace(trace_feed.ADVISE_SHARE)  # the advisor's, apart from diagnose()'s
        self.advised = 0  # answers of the advisor sent
        self._advisor: threading.Thread | None = None
        self._readvise = threading.Event()  # refresh() asked while it was at work
        self._advice_lock = threading.Lock()  # _advisor: set while its thread is at work
        self.sends = 0  # sends of new events (frames messages)
        self._undiagnosed = False  # events were sent since the last diagnose()
        self.first_error: BaseException | None = None  # what stopped the thread, if anything
        # the source read once (files parsed once), for the bytes, diagnose() and the copy
        self._run = run = open_run(source, refusal="TraceView cannot show")
        live = run.running
        if live:
            data, named = self._subscribe(run), type(source).__name__
            count = self._file.total if self._file is not None else 0
        else:  # (a run over MAX_BYTES: its hooks summarized per bucket, said in `notice`)
            sent = view_bytes(source, run, limit=MAX_BYTES)
            data, named, count = sent.data, sent.name, sent.events
            kwargs.setdefault("notice", summary_notice(sent, MAX_BYTES))
        try:
            self.findings: list[Finding] = list(diagnose(run))
            super().__init__(trace=data, trace_events=count, events_sent=count,
                             live="running" if live else "",
                             status=trace_feed.live_status(run) if live else {},
                             diagnosis=diagnosis_bytes(self.findings),
                             advice=PENDING,
                             name=named if name is None else str(name), scheme=scheme,
                             max_events=max_events, **kwargs)
        except BaseException:
            self._detach()
            raise
        self.on_msg(self._on_msg)
        if self.debugger is not None:
            self.debugger_wire = DebuggerWire(self.debugger, self._debugger_said)
            self.debugger_wire.push()
        if live:
            self._thread = threading.Thread(target=self._follow, name="ddpviz-trace-view",
                                            daemon=True)
            self._thread.start()
        self._start_advisor()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # beside the widget, for hosts without widgets (nbconvert, nbviewer): See static_copy.py
        run = self._run  # (as read when the view was made or last refreshed)
        live = run.kind == "session" or (run.kind == "run" and run.live.status == "running")
        trace = run.gathered
        return with_copy(super()._repr_mimebundle_(**kwargs),
                         static_copy(run, live=live,
                                     events=0 if trace is None else len(trace)))

    @property
    def following(self) -> bool:
        """Whether the view's thread still follows a live source."""
        return self._thread is not None and self._thread.is_alive()

    def refresh(self) -> None:
        """Send what is new: for a live source still followed, the events since the last send
        and diagnose()'s findings now; else the run again (files are read again), with
        diagnose()'s findings computed again."""
        if self.following:
            with self._send_lock:
                self._send_new()
                self._diagnose()
            return
        self._run = run = open_run(self._source, refusal="TraceView cannot show")
        sent = view_bytes(self._source, run, limit=MAX_BYTES)
        self.findings = list(diagnose(run))
        with self._send_lock:
            self._file = None
            with self.hold_sync():
                self.trace = sent.data
                self.trace_events = self.events_sent = sent.events
                self.notice = summary_notice(sent, MAX_BYTES)
                self.diagnosis = diagnosis_bytes(self.findings)
        self._start_advisor()

    def close(self) -> None:
        """Stop following a live source (the thread ends), then close the widget."""
        if hasattr(self, "_stop"):  # (not when __init__ refused its arguments)
            self._stop.set()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(5.0)
            self._detach()
            if self.debugger_wire is not None:
                self.debugger_wire.close()
        super().close()

    # --- following a live source (See [Note: a live view's wire], trace_feed.py) ----------------

    def _subscribe(self, run: RunSource) -> bytes:
        """Subscribe to the live source's new events; returns the file of those before."""
        session = run.live.session if run.kind == "run" else run.live
        seen: list[Any] = []

        def history(trace: Any) -> None:  # under the session's lock: a snapshot, no more
            seen.append((dict(trace.meta), trace.columns(), dict(trace.clock)))

        def receive(batch: list[Event]) -> None:  # on the collector's thread: cheap
            with self._pending_lock:
                self._pending.extend(batch)

        self._unsubscribe = session.subscribe(receive, batch=True, history=history)
        meta, tables, clock = seen[0]
        self._file = LiveFile(meta, tables, clock)
        if len(self._file.data) > MAX_BYTES:
            self._detach()
            raise TraceViewError(
                f"ddpviz: this run is already {len(self._file.data) / (1 << 20):,.0f} MiB as a "
                f"trace, over the {MAX_BYTES >> 20} MiB a TraceView sends to the browser.\n"
                "Once it ended, a view of it draws its gradient hooks summarized per bucket; "
                "meanwhile save it (run.trace.save(PATH)) and open the .ddpviz file in "
                "JupyterLab's file browser, or record it with a coarser detail (docs/guide/"
                "recording.md).")
        return bytes(self._file.data)

    def _detach(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def _follow(self) -> None:
        """The daemon thread: new events at most EVENTS_HZ a second, diagnose() at its pace;
        at the end the final events and findings, then it returns."""
        try:
            while not self._stop.wait(1 / trace_feed.EVENTS_HZ):
                status = status_of(self._run)  # before the send: an ended run has all events
                with self._send_lock:
                    sent = self._send_new()
                    if status != "running" or ((sent or self._undiagnosed) and self.pace.due()):
                        self._diagnose()
                    self.status = trace_feed.live_status(self._run, status)
                    if status != "running":
                        self.live = status
                        return
        except Refused as exc:
            self.first_error = exc
            self.notice = str(exc)  # (refresh() may have said it already: the same line)
        except Exception as exc:  # a thread must never print into a cell: said in the view
            self.first_error = exc
            self.notice = (f"ddpviz: this view stopped following the run ({type(exc).__name__}:"
                           f" {exc}). Call view.refresh() to send it again.")
        finally:
            self._detach()

    def _send_new(self) -> bool:
        """Send the events received since the last send (and changed clock offsets) as
        frames; False when there were none. Raises Refused over a bound."""
        file = self._file
        if file is None:
            return False
        with self._pending_lock:
            batch, self._pending = self._pending, []
        run = self._run
        clock = dict((run.live.session if run.kind == "run" else run.live).trace.clock)
        new = file.frames(batch, clock)
        data, n, _ = new
        if not data:
            return False
        if len(data) > trace_feed.MAX_DELTA_BYTES or len(file.data) + len(data) > MAX_BYTES:
            over = (f"the {trace_feed.MAX_DELTA_BYTES >> 20} MiB one update carries"
                    if len(data) > trace_feed.MAX_DELTA_BYTES
                    else f"the {MAX_BYTES >> 20} MiB a TraceView sends in all")
            self._stop.set()  # (refused events are not kept: a later send would skip them)
            refused = Refused(
                f"ddpviz: {n:,} new events ({len(data) / (1 << 20):,.1f} MiB) would go over "
                f"{over}; this view stopped following the run at {file.total:,} events.\n"
                "Call view.refresh() once the run ended (a view of a run over the bound draws its "
                "gradient hooks summarized per bucket), or save the run (run.trace.save(PATH)) "
                "and open the .ddpviz file in JupyterLab's file browser.")
            self.notice = str(refused)
            raise refused
        base = file.total
        file.commit(new)
        self.send({"kind": "frames", "base": base, "total": file.total}, buffers=[data])
        self.sends += 1
        self.events_sent = file.total
        self._undiagnosed = True
        return True

    def _diagnose(self) -> None:
        started = time.monotonic()
        self.findings = list(diagnose(self._run))
        self.diagnosis = diagnosis_bytes(self.findings)
        self._undiagnosed = False
        self.pace.ran(started)

    # --- the bucket advisor's answer, on a thread of its own --------------------------------

    def _start_advisor(self) -> None:
        with self._advice_lock:
            if self._advisor is not None:
                self._readvise.set()  # (refresh() while it is at work: once more after)
                return
            self._advisor = threading.Thread(target=self._advise, name="ddpviz-trace-advice",
                                             daemon=True)
            self._advisor.start()

    def _advise(self) -> None:
        """The advisor thread: the advice for the run as it is now; while a live source is
        followed, again when new events came and its pace allows (`advice_pace`: the rule of
        diagnose()'s, counted apart, so the slower advisor never delays the findings); once
        more after the source ended; then it returns."""
        seen = -1
        try:
            while not self._stop.is_set():
                following = self.following  # (first: a source no longer followed sent all)
                events = self.events_sent
                if events != seen or self._readvise.is_set():
                    self._readvise.clear()
                    started = time.monotonic()
                    data = advice_bytes(self._run)
                    if self._stop.is_set():
                        return  # (closed meanwhile)
                    self.advice = data
                    self.advised += 1
                    self.advice_pace.ran(started)
                    seen = events
                with self._advice_lock:
                    if not following and not self._readvise.is_set():
                        self._advisor = None  # (a later refresh() starts another)
                        return
                while self.following and not self.advice_pace.due():  # (an end: at once)
                    if self._stop.wait(0.05):
                        return
        except Exception as exc:  # (advice_bytes says the advisor's own failures as data)
            self.first_error = exc
        finally:
            with self._advice_lock:
                if self._advisor is threading.current_thread():
                    self._advisor = None

    def _debugger_said(self, state: str) -> None:
        self.debugger_state = state

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A view that lacks frames asks for the whole file so far (`hello`); the debugger
        panel's commands go to its wire (`debugger`)."""
        if isinstance(content, dict) and content.get("kind") == "debugger":
            if self.debugger_wire is not None:
                self.debugger_wire.handle(content)
            return
        if not isinstance(content, dict) or content.get("kind") != "hello":
            return
        to = content.get("id")
        if not isinstance(to, str) or len(to) > 64:
            return
        with self._send_lock:
            file = self._file
            if file is None:
                return
            self.send({"kind": "whole", "to": to, "total": file.total},
                      buffers=[bytes(file.data)])
