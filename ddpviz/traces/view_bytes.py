"""A run as the trace viewer's front end reads it (extension/src/traceWidget.ts): the bytes of
one `.ddpviz` file, and diagnose()'s findings as msgpack events. What the notebook's TraceView
sends to the browser, and what the HTML report embeds for the same components to draw; and
that front end's built files (`front_end`).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import NamedTuple

import msgspec

from ddpviz import events as ev
from ddpviz.findings import Finding
from ddpviz.traces.fileformat import SUFFIX
from ddpviz.traces.source import RunSource, open_run
from ddpviz.traces.tablebytes import min_bytes
from ddpviz.traces.trace import write_run
from ddpviz.traces.view_summary import has_hooks, summarized_bytes

# the viewer's front end as extension/build-widget.js builds it (not in git)
STATIC = Path(__file__).resolve().parents[1] / "widgets" / "static"


def front_end(name: str) -> str:
    """A built front-end file's text (`trace_view.js`, ...); "" when it is not built."""
    path = STATIC / name
    return path.read_text(encoding="utf-8") if path.is_file() else ""


class TraceViewError(ValueError):
    """The run cannot be shown in a view; the message says why and what to use."""


def trace_bytes(source: object, run: RunSource | None = None, *, limit: int,
                carrier: str = "a TraceView sends to the browser") -> tuple[bytes, str]:
    """The run as the bytes of one `.ddpviz` file, and the name the view shows: a single
    file's own bytes; anything else (a folder, several files, a Trace, a live run) merged and
    written as `Trace.save` writes it (COPY and COLUMNS frames). `run`: `source` opened
    already (`open_run`).

    Raises:
        TraceViewError: the bytes would be over `limit` (what `carrier` carries at most).
    """
    if isinstance(source, (str, Path)) and Path(source).is_file() \
            and Path(source).suffix == SUFFIX:
        path = Path(source)
        _bounded(path.stat().st_size, path.name, limit, carrier)
        return path.read_bytes(), path.name
    if run is None:
        run = open_run(source, refusal="TraceView cannot show")
    trace = run.as_trace()
    name = Path(source).name if isinstance(source, (str, Path)) else type(source).__name__
    with tempfile.TemporaryDirectory(prefix="ddpviz-view-") as folder:
        path = Path(folder) / f"view{SUFFIX}"
        write_run(trace, path)
        _bounded(path.stat().st_size, name, limit, carrier)
        return path.read_bytes(), name


class ViewBytes(NamedTuple):
    data: bytes  # one `.ddpviz` file
    name: str  # the name the view shows
    events: int  # the events in `data`
    folded: int  # GradReady events summarized away (view_summary.py); 0: the run whole


def view_bytes(source: object, run: RunSource, *, limit: int,
               carrier: str = "a TraceView sends to the browser") -> ViewBytes:
    """The run for a view: whole (`trace_bytes`) where it fits `limit`, else with its
    gradient hooks summarized per bucket (view_summary.py), which a run recorded with every
    hook needs: 256 ranks x 10,000 parameters is 2.6M GradReady events a step.

    Raises:
        TraceViewError: the run is over `limit` even summarized.
    """
    trace = run.as_trace()
    # A run whose hot events alone would be over `limit` as event maps is summarized, though
    # its COLUMNS frames might fit: the browser's work is per event, so a view sends at most
    # the events that `limit` of event maps holds (~1M hooks), as before columns; a file too.
    few = sum(min_bytes(t) for t in trace.columns().values()) <= limit
    if few:
        try:
            data, name = trace_bytes(source, run, limit=limit, carrier=carrier)
            return ViewBytes(data, name, len(trace), 0)
        except TraceViewError:
            if not has_hooks(trace):
                raise
    name = Path(source).name if isinstance(source, (str, Path)) else type(source).__name__
    data, events, folded = summarized_bytes(trace)
    if len(data) > limit:
        if not few:  # (small buckets: a summary per bucket can take more than the hooks did)
            with contextlib.suppress(TraceViewError):
                whole, name = trace_bytes(source, run, limit=limit, carrier=carrier)
                return ViewBytes(whole, name, len(trace), 0)
        _bounded(len(data), f"{name} (its gradient hooks summarized per bucket)", limit,
                 carrier)
    return ViewBytes(data, name, events, folded)


def summary_notice(view: ViewBytes, limit: int) -> str:
    """What a view of a summarized run says above it; "" for a run sent whole."""
    if not view.folded:
        return ""
    return (f"ddpviz: this run is over the {limit >> 20} MiB a view sends to the browser, so "
            "its gradient hooks are drawn summarized per bucket, one event per bucket a step "
            f"instead of one per parameter ({view.folded:,} events fewer; the hook timeline "
            "shows each bucket's span, not each parameter's mark). The findings are "
            "diagnose()'s of every event. To see every hook, open the .ddpviz file in "
            "JupyterLab's file browser, which reads the file itself.")


def diagnosis_bytes(findings: list[Finding]) -> bytes:
    """diagnose()'s findings for the front end: msgpack FindingReported events, which it checks
    as it checks the trace's own (traceWidget.ts, `diagnosisOf`)."""
    return msgspec.msgpack.encode([
        ev.FindingReported(rank=f.ranks[0] if f.ranks else 0, step=max(f.step, -1), t_ns=0,
                           seq=i, finding=f) for i, f in enumerate(findings)])


def _bounded(size: int, name: str, limit: int, carrier: str) -> None:
    if size > limit:
        raise TraceViewError(
            f"ddpviz: {name} is {size / (1 << 20):,.0f} MiB as a trace, over the "
            f"{limit >> 20} MiB {carrier}.\nOpen the .ddpviz file in JupyterLab's file "
            "browser (the viewer reads the file, not the kernel), or write its HTML report "
            "(`ddpviz report PATH`).")
