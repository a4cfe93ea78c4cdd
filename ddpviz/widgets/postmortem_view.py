"""PostMortemView: a Flight Recorder post-mortem in a notebook: the findings, then one row per
rank (last completed, first pending) and each rank's last collectives as a strip, done in grey,
pending in red, collectives that are not DDP's outlined. Every text from a dump is escaped.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as w

if TYPE_CHECKING:
    from ddpviz.postmortem import PostMortem

STRIP = 24  # collectives shown per rank, newest last


def _cell(row: dict[str, Any]) -> str:
    color = "#d0d5dd" if row["completed"] else "#f04438"
    border = "2px solid #6941c6" if row["ddp_phase"] == "not DDP's" else "1px solid #fff"
    return (f"<span title='{html.escape(row['label'], quote=True)}' style='display:inline-block;"
            f"min-width:22px;padding:0 2px;margin:1px;font-size:10px;text-align:center;"
            f"background:{color};border:{border}'>{int(row['seq'])}</span>")


def postmortem_html(pm: PostMortem) -> str:
    """The view's HTML (escaped throughout)."""
    parts = [f"<pre style='font-size:12px;white-space:pre-wrap'>"
             f"{html.escape(str(pm.findings))}</pre>"]
    rows = pm.to_records()
    strips: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        strips.setdefault((row["pg"], row["rank"]), []).append(row)
    head = "".join(f"<th style='text-align:left;padding:2px 6px'>{h}</th>" for h in
                   ("pg", "rank", "last completed", "first pending", f"last {STRIP} collectives"))
    body = []
    for r in pm.rank_rows():
        strip = "".join(_cell(x) for x in strips.get((r["pg"], r["rank"]), [])[-STRIP:])
        body.append("<tr>" + "".join(
            f"<td style='padding:2px 6px;vertical-align:top'>{html.escape(str(v))}</td>"
            for v in (r["pg"], r["rank"], r["last_completed"], r["first_pending"]))
            + f"<td>{strip}</td></tr>")
    parts.append(f"<table style='font-size:12px;border-collapse:collapse'><tr>{head}</tr>"
                 f"{''.join(body)}</table>")
    return "".join(parts)


class PostMortemView(w.VBox):
    """The post-mortem's findings and per-rank positions (`ddpviz.postmortem(...).show()`)."""

    def __init__(self, pm: PostMortem, **kwargs: Any) -> None:
        self.postmortem = pm
        self.html = w.HTML(postmortem_html(pm))
        super().__init__([self.html], **kwargs)
