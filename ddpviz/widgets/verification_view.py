"""VerificationView: is the model the same on every rank? Parameter x rank matrix, live.

A one-line verdict on top; below it one row per parameter (then buffer), one coloured cell per
rank (same / differs / missing / pending), differing rows first when the model is large; pick
a row and a rank to see the values on every rank, ranks grouped per distinct value. Plain
ipywidgets (HTML + dropdowns): no plotly, so it costs a few KB, not megabytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as w

from ddpviz import markup
from ddpviz.model.event_model import CONSTRUCTION, EventModel
from ddpviz.model.rank_groups import rank_label
from ddpviz.model.verification_matrix import (
    FIELD_ORDER,
    Matrix,
    Row,
    build_matrix,
    format_ranks,
    group_ranks,
)
from ddpviz.widgets.event_view import EventView
from ddpviz.widgets.replay_controls import Cursor

COLOURS = {"same": "#dff3dc", "differs": "#fdd9b5", "missing": "#f6c5c5", "pending": "#eeeeee"}
GLYPHS = {"same": "✓", "differs": "≠", "missing": "∅", "pending": "…"}
_VERDICT_COLOUR = {"passed": "#1e7b34", "failed": "#b42318", "verifying": "#555",
                   "waiting": "#555", "unverified": "#8a6d00"}
_CSS = (
    ".ddpviz-vm{border-collapse:collapse;font-size:11px;font-family:monospace}"
    ".ddpviz-vm td,.ddpviz-vm th{padding:1px 5px;border:1px solid #fff;white-space:nowrap}"
    ".ddpviz-vm th{background:#f4f4f4;font-weight:normal}"
    + "".join(f".ddpviz-vm .{s[0]}{{background:{c};text-align:center}}"
              for s, c in COLOURS.items())
    + ".ddpviz-vm tr.sel td{outline:1px solid #333}.ddpviz-vm .rsel{font-weight:bold}")
_STYLE = markup.tag("style", markup.Markup(_CSS))  # constants only
ALL_RANKS = -1
MAX_COLUMNS = 64  # columns (ranks or groups of ranks) drawn; the rest are counted
MAX_RANK_OPTIONS = 1024  # ranks listed in the rank dropdown (those named by a row first)


def _row_label(row: Row) -> str:
    return f"{'p' if row.kind == 'param' else 'b'}{row.position} {row.name}"


class VerificationView(EventView):
    """The verification matrix of a run, live or replayed.

    Kernel-side state: `matrix` (a `Matrix`: rows, per-rank cell statuses, verdict),
    `verdict_html`, `matrix_html`, `row_select`, `rank_select`, `details_html`,
    `cell(name, rank)`, `select(name, rank)`.

    Args:
        source: a Run, Session, Trace, `.ddpviz` path or list of events (see `EventView`).
        max_rows: rows drawn in the table (rows that differ first); every row stays
            selectable in the dropdown.
        group_ranks: one column per group of ranks that agree on everything (default: when
            there are more than 8 ranks).
    """

    def __init__(self, source: object = None, *, max_rows: int = 40,
                 group_ranks: bool | None = None, **kwargs: Any) -> None:
        self.max_rows = max_rows
        self._group_default = group_ranks
        self.matrix: Matrix = build_matrix({})
        self._key: tuple[Any, ...] | None = None
        self._columns: tuple[Matrix | None, list[tuple[int, ...]]] = (None, [])
        self._ranks: tuple[Matrix | None, frozenset[int]] = (None, frozenset())
        self._status: tuple[Matrix | None, tuple[str, ...]] = (None, ())
        self._picked: int | None = None
        super().__init__(source, **kwargs)

    def _build(self) -> list[w.Widget]:
        self.verdict_html = w.HTML()
        self.matrix_html = w.HTML(layout=w.Layout(max_height="420px", overflow="auto"))
        self.row_select = w.Dropdown(options=[("(no parameters yet)", "")], value="",
                                     description="row", layout=w.Layout(width="340px"),
                                     style={"description_width": "initial"})
        self.rank_select = w.Dropdown(options=[("all ranks", ALL_RANKS)], value=ALL_RANKS,
                                      description="rank", layout=w.Layout(width="150px"),
                                      style={"description_width": "initial"})
        self.group_checkbox = w.Checkbox(value=bool(self._group_default),
                                         description="group ranks that agree", indent=False,
                                         layout=w.Layout(width="190px"))
        self.details_html = w.HTML()
        self._user_grouping = self._group_default is not None
        for control in (self.row_select, self.rank_select):
            control.observe(self._on_select, names="value")
        self.group_checkbox.observe(self._on_group, names="value")
        return [self.verdict_html, self.matrix_html,
                w.HBox([self.row_select, self.rank_select, self.group_checkbox]),
                self.details_html]

    # --- public ---------------------------------------------------------------------------

    @classmethod
    def embedded_in(cls, model: EventModel, **kwargs: Any) -> VerificationView:
        return cls(model=model, embedded=True, controls=False, **kwargs)

    def cell(self, name: str, rank: int, kind: str = "param") -> str:
        """The status drawn for `name` on `rank`: same, differs, missing or pending."""
        row = self._row(f"{kind}:{name}")
        if rank not in self._rank_set():
            raise ValueError(f"ddpviz: rank {rank} is not in the verification matrix (ranks "
                             f"0-{len(self.matrix.ranks) - 1}).\nPass one of its ranks.")
        return row.cell(rank)

    def select(self, name: str, rank: int = ALL_RANKS, kind: str = "param") -> None:
        """Show `name`'s values on every rank, `rank`'s group first (like clicking a cell)."""
        key = f"{kind}:{name}"
        self._row(key)
        if rank != ALL_RANKS and rank not in [v for _, v in self.rank_select.options]:
            self._picked = rank  # beyond the listed ranks: listed from now on
            self._sync_selects()
        self.rank_select.value = rank
        self.row_select.value = key

    # --- drawing --------------------------------------------------------------------------

    def render(self, cursor: Cursor) -> bool:
        as_of = self.model.settled(CONSTRUCTION, cursor.as_of)
        key = (self.model.versions["construction"], as_of)
        if key == self._key:
            return False
        self._key = key
        self.matrix = build_matrix(self.model.construction(as_of),
                                   self.model.world_size)
        if not self._user_grouping:
            self._set_group(len(self.matrix.ranks) > 8)
        self._sync_selects()
        self._draw()
        return False

    def _row(self, key: str) -> Row:
        for row in self.matrix.rows:
            if row.key == key:
                return row
        names = ", ".join(r.key for r in self.matrix.rows[:5])
        raise KeyError(f"ddpviz: no row {key!r} in the verification matrix (rows start with "
                       f"{names or 'nothing yet'}).\nPass a dotted parameter name and "
                       "kind='param' or kind='buffer'.")

    def _statuses(self) -> tuple[str, ...]:
        """Each row's status, computed once per matrix (10,000 rows are read several times
        per draw)."""
        if self._status[0] is not self.matrix:
            self._status = (self.matrix, tuple(r.status for r in self.matrix.rows))
        return self._status[1]

    def _rank_set(self) -> frozenset[int]:
        if self._ranks[0] is not self.matrix:
            self._ranks = (self.matrix, frozenset(self.matrix.ranks))
        return self._ranks[1]

    def _rank_options(self) -> list[int]:
        """Every rank when few; else the ranks some row names or that reported, first."""
        m = self.matrix
        if len(m.ranks) <= MAX_RANK_OPTIONS:
            return list(m.ranks)
        named = set(m.base)
        for row in m.rows:
            if len(named) >= MAX_RANK_OPTIONS:
                break
            named.update(row.known)
        chosen = sorted(named)[:MAX_RANK_OPTIONS]
        if len(chosen) < MAX_RANK_OPTIONS:
            have = set(chosen)
            chosen += [r for r in m.ranks[:MAX_RANK_OPTIONS] if r not in have]
            chosen = sorted(chosen[:MAX_RANK_OPTIONS])
        if self._picked is not None and self._picked not in chosen:
            chosen.append(self._picked)
        return chosen

    def _set_group(self, value: bool) -> None:
        if self.group_checkbox.value != value:
            self.group_checkbox.unobserve(self._on_group, names="value")
            self.group_checkbox.value = value
            self.group_checkbox.observe(self._on_group, names="value")

    def _sync_selects(self) -> None:
        m = self.matrix
        rows = [(f"{GLYPHS[status]} {_row_label(r)}", r.key)
                for r, status in zip(m.rows, self._statuses(), strict=True)]
        ranks = [("all ranks", ALL_RANKS)] + [(f"rank {r}", r) for r in self._rank_options()]
        for control, options in ((self.row_select, rows or [("(no parameters yet)", "")]),
                                 (self.rank_select, ranks)):
            if [tuple(o) for o in control.options] != options:
                value = control.value
                control.unobserve(self._on_select, names="value")
                control.options = options
                values = [v for _, v in options]
                control.value = value if value in values else self._default(values)
                control.observe(self._on_select, names="value")

    def _default(self, values: Sequence[Any]) -> Any:
        if values and isinstance(values[0], str):
            bad = [r.key for r, status in zip(self.matrix.rows, self._statuses(), strict=True)
                   if status in ("differs", "missing")]
            return bad[0] if bad else values[0]
        return ALL_RANKS

    def _on_select(self, _change: dict[str, Any]) -> None:
        with self._render_lock:
            self._draw()

    def _on_group(self, _change: dict[str, Any]) -> None:
        self._user_grouping = True
        with self._render_lock:
            self._draw()

    def _draw(self) -> None:
        m = self.matrix
        colour = _VERDICT_COLOUR[m.state]
        verdict = markup.fmt("<div style='font-weight:bold;color:{};font-size:13px'>{}</div>",
                             colour, m.verdict)
        if self.verdict_html.value != verdict:
            self.verdict_html.value = verdict
        table = self._table()
        if self.matrix_html.value != table:
            self.matrix_html.value = table
        details = self._details()
        if self.details_html.value != details:
            self.details_html.value = details

    def columns(self) -> list[tuple[int, ...]]:
        """The matrix's columns: one rank each, or groups of ranks identical on every row."""
        m = self.matrix
        if not self.group_checkbox.value:
            return [(r,) for r in m.ranks]
        if self._columns[0] is m:
            return list(self._columns[1])
        # Only rows with a difference tell ranks apart (elsewhere every holder has the same
        # values), and there only the cell and the differing fields' values do. A rank a row
        # does not name has the cell its class gives (Matrix.base) and no values there, so a
        # rank's signature is its class plus the rows where it departs from that: linear in
        # the cells rows name, not rows x ranks.
        odd = [row for row, status in zip(m.rows, self._statuses(), strict=True)
               if row.differing or status != "same"]
        departs: dict[int, list[tuple[int, str]]] = {}
        for i, row in enumerate(odd):
            blank = "|" * max(len(row.differing) - 1, 0)
            for r, cell in row.known.items():
                entry = cell + "|" + "|".join(row.values.get(r, {}).get(f, "")
                                              for f in row.differing)
                if entry != m.base.get(r, "pending") + "|" + blank:
                    departs.setdefault(r, []).append((i, entry))
        groups: dict[tuple[object, ...], list[int]] = {}
        for r in m.ranks:
            groups.setdefault((m.base.get(r, "pending"), *departs.get(r, ())), []).append(r)
        columns = sorted((tuple(rs) for rs in groups.values()), key=lambda g: g[0])
        self._columns = (m, columns)  # a matrix is immutable: its columns are computed once
        return list(columns)

    def shown_rows(self) -> list[Row]:
        """The rows drawn in the table: every row that is not "same" first, in order, then as
        many "same" rows as fit in `max_rows`, in order."""
        rows = self.matrix.rows
        if len(rows) <= self.max_rows:
            return list(rows)
        statuses = self._statuses()
        bad = [i for i, status in enumerate(statuses) if status != "same"][: self.max_rows]
        room = self.max_rows - len(bad)
        good = [i for i, status in enumerate(statuses) if status == "same"][:room]
        return [rows[i] for i in sorted(bad + good)]

    def _table(self) -> str:
        m = self.matrix
        if not m.rows:
            return ""
        columns = self.columns()
        left_out = columns[MAX_COLUMNS:]
        columns = columns[:MAX_COLUMNS]
        chosen = self.rank_select.value
        head = markup.join(
            markup.fmt("<th{} title='{}'>{}</th>",
                       markup.Markup(" class=rsel" if chosen in g else ""),
                       _short(rank_label(g), 400),
                       ("r" if len(g) == 1 else f"{len(g)} ranks: ") + _short(rank_label(g)))
            for g in columns)
        lines: list[str] = [_STYLE, markup.fmt(
            "<table class=ddpviz-vm><tr><th>#</th><th>name</th>{}</tr>", head)]
        shown = self.shown_rows()
        for row in shown:
            sel = markup.Markup(" class=sel" if row.key == self.row_select.value else "")
            cells = []
            for g in columns:
                status = row.cell(g[0])
                title = markup.Markup("")
                if status not in ("same", "pending"):
                    values = row.values.get(g[0], {})
                    what = "missing" if status == "missing" else " ".join(
                        f"{f}={values[f]}" for f in row.differing if f in values)
                    title = markup.fmt(" title='{}'", _short(format_ranks(g), 400) + ": "
                                       + what)
                cells.append(markup.fmt("<td class={}{}>{}</td>", status[0], title, GLYPHS[status]))
            lines.append(markup.fmt("<tr{}><td>{}{}</td><td>{}</td>{}</tr>", sel,
                                    "p" if row.kind == "param" else "b", row.position, row.name,
                                    markup.join(cells)))
        lines.append("</table>")
        if left_out:
            lines.append(markup.fmt("<div style='font-size:11px;color:#555'>… and {:,} more "
                                    "columns ({:,} ranks): group ranks that agree to see "
                                    "them</div>", len(left_out), sum(len(g) for g in left_out)))
        hidden = len(m.rows) - len(shown)
        if hidden:
            lines.append(markup.fmt("<div style='font-size:11px;color:#555'>… and {:,} more rows, "
                                    "the same on every rank (pick them in the row list)</div>",
                                    hidden))
        for note in m.notes:
            lines.append(markup.fmt("<div style='font-size:11px;color:#b42318'>{}</div>", note))
        return "".join(lines)

    def _details(self) -> str:
        key = self.row_select.value
        row = next((r for r in self.matrix.rows if r.key == key), None)
        if row is None:
            return ""
        chosen = self.rank_select.value
        described: dict[int, str] = {}
        for r in self.matrix.ranks:  # one string per distinct cell: few distinct texts
            status = row.cell(r)
            values = row.values.get(r, {})
            if status == "missing":
                described[r] = "missing"
            elif status == "pending":
                described[r] = "not reported yet"
            else:
                described[r] = _describe_html(values, row.differing)
        what = "parameter" if row.kind == "param" else "buffer"
        lines = [markup.fmt("<b>{} {} '{}'</b>{}", what, row.position, row.name,
                            " · differs in: "
                            + ", ".join(f for f in row.differing if f != "present")
                            if row.differing else " · the same on every rank")]
        groups = group_ranks(described)
        for text, ranks in groups[:MAX_COLUMNS]:
            mark = "▶ " if chosen in ranks else ""
            weight = "bold" if chosen in ranks else "normal"
            lines.append(markup.fmt("<div style='font-weight:{}'>{}{}: {}</div>", weight, mark,
                                    _short(format_ranks(ranks), 400), text))
        if len(groups) > MAX_COLUMNS:
            lines.append(markup.fmt("<div>… and {:,} more groups of ranks</div>",
                                    len(groups) - MAX_COLUMNS))
        return markup.fmt("<div style='font-size:12px;font-family:monospace'>{}</div>",
                          markup.join(lines))


def _short(label: str, limit: int = 40) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _describe_html(values: dict[str, str], differing: Sequence[str]) -> str:
    parts = []
    for f in FIELD_ORDER:
        if f not in values or f == "present":
            continue
        label = "index" if f == "order" else f
        text = markup.escape(f"{label}={values[f]}")
        parts.append(markup.fmt("<span style='color:#b42318;font-weight:bold'>{}</span>", text)
                     if f in differing else text)
    return markup.join(parts, " ") or markup.Markup("present")
