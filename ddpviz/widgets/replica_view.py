"""ReplicaView: do the ranks still hold the same parameters? Tensor x rank, from the
`replicas_diverged` findings of the live replica check (docs/replicas.md).

One verdict line (no divergence reported, or how many tensors differ since which step), then
one row per differing tensor and checked step, one cell per rank holding the letter of its
group of identical bytes (A: the most common; others highlighted), columns grouped by rank
ranges above MANY_RANKS ranks; hovering a cell shows what that group holds (norms). Plain
ipywidgets HTML.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from ddpviz import markup
from ddpviz.model.event_model import EventModel
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.replay_controls import Cursor
from ddpviz.widgets.replica_matrix import ReplicaMatrix, replica_matrix

MAX_ROWS = 64  # rows drawn; the rest are counted
MAX_COLUMNS = 64  # columns (ranks or groups) drawn; the rest are counted
_CSS = (".ddpviz-rm{border-collapse:collapse;font-size:11px;font-family:monospace}"
        ".ddpviz-rm td,.ddpviz-rm th{padding:1px 5px;border:1px solid #fff;white-space:nowrap}"
        ".ddpviz-rm th{background:#f4f4f4;font-weight:normal}"
        ".ddpviz-rm .a{background:#dff3dc;text-align:center}"
        ".ddpviz-rm .o{background:#fdd9b5;text-align:center;font-weight:bold}"
        ".ddpviz-rm .i{background:#e8eef7;text-align:center}")
_STYLE = markup.tag("style", markup.Markup(_CSS))  # constants only


class ReplicaView(EventView):
    """Replica agreement, tensor x rank (kernel-side: `matrix`, `html`)."""

    def __init__(self, source: object = None, **kwargs: Any) -> None:
        self.matrix: ReplicaMatrix | None = None
        self._key: tuple[Any, ...] | None = None
        super().__init__(source, **kwargs)

    @classmethod
    def embedded_in(cls, model: EventModel, **kwargs: Any) -> ReplicaView:
        return cls(model=model, embedded=True, controls=False, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.html = w.HTML()
        return [self.html]

    def render(self, cursor: Cursor) -> bool:
        findings = self.model.findings(cursor.as_of)
        key = (len(findings), cursor.as_of is None)
        if key == self._key:
            return False
        self._key = key
        self.matrix = replica_matrix(findings)  # (world size: the findings say it)
        value = _draw(self.matrix)
        if self.html.value != value:
            self.html.value = value
        return False


def _draw(m: ReplicaMatrix) -> str:
    if not m.rows:
        return markup.fmt("<div style='color:#555;font-size:12px'>replicas: no divergence "
                          "reported (the check compares each rank's parameters, gradients and "
                          "buffers bitwise every 25th step by default)</div>")
    first = min(r.step for r in m.rows)
    errors = sum(r.severity != "info" for r in m.rows)
    verdict = markup.fmt(
        "<div style='font-size:12px;font-weight:bold;color:{}'>replicas diverged: {} tensor(s) "
        "differ across ranks, first seen after step {}{}</div>",
        "#b42318" if errors else "#1f4e8c", len({r.name for r in m.rows}), first,
        "" if errors else " (per-rank buffers, broadcast_buffers=False: expected)")
    columns = m.columns[:MAX_COLUMNS]
    head = markup.join([markup.tag("th", "step"), markup.tag("th", "tensor"),
                        *(markup.tag("th", label) for label, _ in columns)])
    body = []
    for row in m.rows[:MAX_ROWS]:
        cells = []
        for _, spans in columns:
            letter = row.cells.get(spans[0][0], "")  # the column's ranks share their letters
            cls = "i" if row.severity == "info" and letter != "A" else (
                "a" if letter == "A" else "o")
            cells.append(markup.tag("td", letter or "·", class_=cls,
                                                          title=row.sizes.get(letter, "")))
        body.append(markup.tag("tr", markup.join([markup.tag("td", row.step),
                                                  markup.tag("td", row.name), *cells])))
    more = []
    if len(m.rows) > MAX_ROWS:
        more.append(f"{len(m.rows) - MAX_ROWS} more rows")
    if len(m.columns) > MAX_COLUMNS:
        more.append(f"{len(m.columns) - MAX_COLUMNS} more columns")
    table = markup.tag("table", markup.join([markup.tag("tr", head), *body]),
                       class_="ddpviz-rm")
    note = markup.fmt("<div style='color:#555;font-size:11px'>{}</div>", "; ".join(more)) \
        if more else ""
    return markup.join([_STYLE, verdict, table, note])
