"""PostMortemView: a Flight Recorder post-mortem in a notebook: the findings, then one row per
rank (last completed, first pending) and each rank's last collectives as a strip, done in grey,
pending in red, collectives that are not DDP's outlined, then the job's own collectives by call
site. Every text from a dump is escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ddpviz import markup
from ddpviz.findings import format_ranges

if TYPE_CHECKING:
    from ddpviz._postmortem import PostMortem

STRIP = 24  # collectives shown per rank, newest last


def _cell(row: dict[str, Any]) -> str:
    color = "#d0d5dd" if row["completed"] else "#f04438"
    own = row["ddp_phase"] == "not DDP's" or row["origin"] == "job"
    border = "2px solid #6941c6" if own else "1px solid #fff"
    return markup.fmt("<span title='{}' style='display:inline-block;"
                      "min-width:22px;padding:0 2px;margin:1px;font-size:10px;text-align:center;"
                      "background:{};border:{}'>{}</span>", row["label"], color, border,
                      int(row["seq"]))


def postmortem_html(pm: PostMortem) -> str:
    """The view's HTML (escaped throughout)."""
    parts = [markup.fmt("<pre style='font-size:12px;white-space:pre-wrap'>{}</pre>",
                        str(pm.findings))]
    rows = pm.to_records()
    strips: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        strips.setdefault((row["pg"], row["rank"]), []).append(row)
    head = markup.join(markup.fmt("<th style='text-align:left;padding:2px 6px'>{}</th>", h)
                       for h in ("pg", "rank", "last completed", "first pending",
                                 f"last {STRIP} collectives"))
    body = []
    for r in pm.rank_rows():
        strip = markup.join(_cell(x) for x in strips.get((r["pg"], r["rank"]), [])[-STRIP:])
        body.append(markup.fmt("<tr>{}<td>{}</td></tr>", markup.join(
            markup.fmt("<td style='padding:2px 6px;vertical-align:top'>{}</td>", v)
            for v in (r["pg"], r["rank"], r["last_completed"], r["first_pending"])), strip))
    parts.append(markup.fmt("<table style='font-size:12px;border-collapse:collapse'><tr>{}</tr>"
                            "{}</table>", head, markup.join(body)))
    parts.append(_job_table(pm))
    return "".join(parts)


def _job_table(pm: PostMortem) -> markup.Markup:
    """The job's own collectives (not DDP's), one row per call site and op."""
    jobs = pm.job_collectives()
    if not jobs:
        return markup.Markup()
    head = markup.join(markup.fmt("<th style='text-align:left;padding:2px 6px'>{}</th>", h)
                       for h in ("call site", "op", "sizes", "ranks", "times", "#",
                                 "process group"))
    body = []
    for j in jobs:
        seqs = f"{j['first_seq']}-{j['last_seq']}" if j["last_seq"] > j["first_seq"] else \
            str(j["first_seq"])
        cells = (j["call_site"] or "(no stack in the dumps)", j["op"], ", ".join(j["sizes"]),
                 format_ranges(j["ranks"]), j["count"], seqs, j["group"])
        body.append(markup.fmt("<tr>{}</tr>", markup.join(
            markup.fmt("<td style='padding:2px 6px;vertical-align:top'>{}</td>", v)
            for v in cells)))
    return markup.fmt("<div style='font-size:12px;margin-top:6px'>The job's own collectives "
                      "(not DDP's), by call site:</div><table style='font-size:12px;"
                      "border-collapse:collapse'><tr>{}</tr>{}</table>", head,
                      markup.join(body))


class PostMortemView(w.VBox):
    """The post-mortem's findings and per-rank positions (`ddpviz.postmortem(...).show()`)."""

    def __init__(self, pm: PostMortem, **kwargs: Any) -> None:
        self.postmortem = pm
        self.html = w.HTML(postmortem_html(pm))
        super().__init__([self.html], **kwargs)
