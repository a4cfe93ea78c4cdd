"""Who made the all-reduce wait: a rank x bucket table in the dashboard, under the live
straggler verdict (the `straggler` finding of diagnose(), recomputed as events come in).

Each cell: in how many recorded steps that rank launched that bucket's all-reduce last, and the
total time the others waited for it (ddpviz/_diagnose/straggler.py computes and folds it; above 16
ranks the 8 ranks that caused most wait get a row each and the rest share one). Darker cells cost
more. Light ipywidgets HTML; recomputed from the trace at most every `every_s` seconds,
and only when events came in.
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as w

from ddpviz import markup
from ddpviz._diagnose.straggler import (
    WaitFold,
    bucket_waits,
    fold,
    straggler_findings,
    timeline,
    wait_rows,
)
from ddpviz.findings import Finding
from ddpviz.traces.source import open_run
from ddpviz.units import human_duration


def verdict_html(found: list[Finding]) -> str:
    """The straggler verdict over the table: the finding's title and where it loses time."""
    if not found:
        return markup.fmt("<div style='font-size:12px;color:#555'>{}</div>",
                          "No straggler: no rank is persistently last by more than the noise "
                          "and the clock uncertainty.")
    f = found[0]
    return markup.fmt("<div style='font-size:12px;color:#b54708;font-weight:bold'>{}</div>"
                      "<div style='font-size:12px;color:#555'>{}</div>", f.title,
                      "; ".join(f.detail[:1]))


def wait_table_html(table: WaitFold) -> str:
    """The table as HTML (escaped through ddpviz.markup)."""
    if not table.steps:
        return markup.fmt("<div style='color:#555;font-size:12px'>{}</div>",
                          "No step with every rank's all-reduce launches recorded yet (they "
                          "come with the guard, or on the steps Recording.every samples).")
    rows = wait_rows(table)
    peak = max((x for r in rows for x in r.wait_ns), default=0.0) or 1.0
    head = markup.join(markup.fmt("<th style='padding:1px 6px'>b{}</th>", b)
                       for b in table.buckets)
    body = []
    for r in rows:
        cells = []
        for c, x in zip(r.n_last, r.wait_ns, strict=True):
            shade = int(235 - 150 * (x / peak))
            text = f"{c} · {human_duration(x)}" if c else ""
            cells.append(markup.fmt("<td style='padding:1px 6px;text-align:right;"
                                    "background:rgb(255,{},{})'>{}</td>", shade, shade, text))
        body.append(markup.fmt("<tr><th style='text-align:left;padding:1px 6px'>{}</th>{}"
                               "</tr>", r.label, markup.join(cells)))
    note = (f"{table.steps} steps with every rank's launches; cell: steps in which the rank "
            "launched the bucket last · total time the others waited for it; "
            f"{table.unsure} bucket-steps within the clock uncertainty "
            f"(+-{human_duration(table.max_error_ns)} a rank) attributed to nobody.")
    return markup.fmt("<table style='font-size:12px;border-collapse:collapse'><tr><th></th>{}"
                      "</tr>{}</table><div style='color:#555;font-size:11px'>{}</div>",
                      head, markup.join(body), note)


class WaitTable:
    """The rank x bucket "who made the all-reduce wait" table of a run (a Trace, Session, Run,
    `.ddpviz` path or folder, or events: traces/source.py); `widget` is what is shown."""

    def __init__(self, source: object = None, *, every_s: float = 2.0, **kwargs: Any) -> None:
        self.widget = w.HTML(**kwargs)
        self._source = source
        self._trace: Any = None
        self._every_s = every_s
        self._last = -float("inf")
        self._seen = -1
        self.table: WaitFold | None = None
        self.straggler: list[Finding] = []  # the straggler finding, when there is one

    def _resolve(self) -> Any:
        if self._trace is None and self._source is not None:
            self._trace = open_run(self._source, refusal="the wait table cannot read").as_trace()
        return self._trace

    def update(self, *, force: bool = False) -> bool:
        """Recompute when events came in and `every_s` passed (or `force`); True if drawn."""
        trace = self._resolve()
        now = time.monotonic()
        if trace is None or (not force and now - self._last < self._every_s):
            return False
        n = len(trace)
        if n == self._seen and not force:
            return False
        self._last, self._seen = now, n
        tables, clock = trace.columns(), dict(trace.clock)
        tl = timeline(tables, clock)
        self.table = fold(bucket_waits(tl))
        self.straggler = straggler_findings(tables, clock, timeline_=tl)
        html = verdict_html(self.straggler) + wait_table_html(self.table)
        if self.widget.value != html:
            self.widget.value = html
        return True
