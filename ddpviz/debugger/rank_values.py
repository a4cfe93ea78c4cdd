"""One tensor on every paused rank, side by side in DDP's terms: what `Debugger.inspect` returns.

Up to 16 ranks, one row per rank (shape, dtype, norm, max |x|, NaN/Inf counts, finiteness map,
digest group, first values); above, one row per bitwise group, outliers first. Below the table:
the verdict (bitwise equal only when every rank's digest of the same shape and dtype matched),
the first differing element when one was fetched, and where the non-finite values are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ddpviz import markup
from ddpviz.debugger.compare import Comparison, ElementDifference, Summary, compare
from ddpviz.debugger.stop import Stop
from ddpviz.findings import format_ranks
from ddpviz.model.rank_groups import MANY_RANKS, rank_label

_BARS = " ▁▂▃▄▅▆▇█"


def finiteness_bar(fractions: tuple[float, ...]) -> str:
    """A finiteness map as text: '·' where a bin is all finite, a bar as tall as its share of
    NaN/Inf otherwise (any non-finite element shows, however few)."""
    out = []
    for f in fractions:
        if not f > 0:
            out.append("·")
        else:
            out.append(_BARS[max(1, min(8, math.ceil(f * 8)))])
    return "".join(out)


def _num(x: float) -> str:
    return "—" if isinstance(x, float) and math.isnan(x) else f"{x:.6g}"


def _head(s: Summary) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in s.head) + (", …" if s.numel > len(s.head)
                                                           else "") + "]"


class RankValues:
    """A tensor on every rank that answered (`summaries`, {rank: Summary}), compared.

    Attributes: `name`, `what` (value, grad, bucket_buffer, ...), `bucket`, `stop` (where the
    ranks were), `comparison` (groups, norms, non-finite ranks), `errors` ({rank: why a rank
    could not inspect it}), `difference` (the first differing element, fetched, or None: not
    fetched, or all equal), `letters` ({rank: 'A'...}, one letter per bitwise group).
    """

    def __init__(self, name: str, what: str, summaries: Mapping[int, Summary], *,
                 errors: Mapping[int, str] | None = None, stop: Stop | None = None,
                 bucket: int = -1, difference: ElementDifference | None = None,
                 bucket_of_param: int | None = None) -> None:
        self.name = name
        self.what = what
        self.bucket = bucket
        self.bucket_of_param = bucket_of_param
        self.stop = stop
        self.errors = dict(sorted((errors or {}).items()))
        self.comparison: Comparison = compare(summaries)
        self.difference = difference
        # letters name the bitwise groups, the largest group "A"
        by_size = sorted(self.comparison.groups, key=lambda g: (-len(g.ranks), g.ranks[0]))
        self.letters = {r: _letter(i) for i, g in enumerate(by_size) for r in g.ranks}

    @property
    def summaries(self) -> dict[int, Summary]:
        """Each rank's summary (rank -> Summary), for the ranks that answered."""
        return self.comparison.summaries

    def __getitem__(self, rank: int) -> Summary:
        return self.comparison.summaries[rank]

    @property
    def all_equal(self) -> bool:
        """Bitwise equal on every rank that answered, digests compared (see Comparison)."""
        return self.comparison.all_equal and not self.errors

    @property
    def title(self) -> str:
        """What this is in DDP's terms (the tensor, its bucket, where the ranks stopped)."""
        if self.what in ("bucket_buffer", "bucket_grads"):
            subject = f"bucket {self.bucket} {self.what.replace('_', ' ')}"
        else:
            subject = f"{self.name} {self.what.replace('_', ' ')}"
            if self.bucket_of_param is not None:
                subject += f" (bucket {self.bucket_of_param})"
        return subject + (f" · {self.stop.where}" if self.stop is not None else "")

    # --- text ---------------------------------------------------------------------------------

    def _notes(self) -> list[str]:
        c = self.comparison
        notes = [c.verdict()]
        if c.norms is not None and c.norms.n > 1:
            n = c.norms
            notes.append(f"norm across ranks: min {_num(n.min)}, median {_num(n.p50)}, "
                         f"max {_num(n.max)}")
        for d in c.differences:
            notes.append(f"{format_ranks(d.ranks)} first differ from {format_ranks(d.against)} "
                         f"in chunk {d.chunk} (elements {d.start:,}-{d.stop - 1:,})")
        if self.difference is not None:
            e = self.difference
            notes.append(f"first differing element: flat {e.flat:,}, index {list(e.position)}: "
                         + ", ".join(f"rank {r} {v!r}" for r, v in e.values.items()))
        for r, s in c.nonfinite.items():
            notes.append(f"rank {r}: {s.n_nan:,} NaN, {s.n_posinf:,} +Inf, {s.n_neginf:,} -Inf"
                         f"; first at {[list(p) for p in s.nonfinite_at]}")
        for r, why in self.errors.items():
            notes.append(f"rank {r} could not: {why}")
        return notes

    def _rows(self) -> list[tuple[str, ...]]:
        c = self.comparison
        if len(c.summaries) <= MANY_RANKS:
            return [(f"{r}", f"{tuple(s.shape)}", s.dtype, _num(s.norm), _num(s.max_abs),
                     f"{s.n_nan}/{s.n_posinf}/{s.n_neginf}", finiteness_bar(s.finiteness),
                     self.letters.get(r, "?") + (f" {s.digest[:8]}" if s.digest else ""),
                     _head(s)) for r, s in c.summaries.items()]
        rows: list[tuple[str, ...]] = []
        for g in c.groups:
            s = c.summaries[g.ranks[0]]
            norms = sorted(c.summaries[r].norm for r in g.ranks)
            rows.append((f"{rank_label(g.ranks)} ({len(g.ranks)})", f"{tuple(s.shape)}",
                         s.dtype, _num(norms[0]) if norms[0] == norms[-1] else
                         f"{_num(norms[0])}…{_num(norms[-1])}", _num(s.max_abs),
                         f"{s.n_nan}/{s.n_posinf}/{s.n_neginf}", finiteness_bar(s.finiteness),
                         self.letters[g.ranks[0]] + f" {s.digest[:8]}", _head(s)))
        if c.uncompared:
            rows.append((f"{rank_label(c.uncompared)} ({len(c.uncompared)})", "", "", "", "",
                         "", "", "no digest", ""))
        return rows

    @property
    def columns(self) -> tuple[str, ...]:
        """The table's column names (a row per rank, or per group above 16 ranks)."""
        many = len(self.comparison.summaries) > MANY_RANKS
        return ("ranks" if many else "rank", "shape", "dtype", "norm", "max |x|",
                "NaN/+Inf/-Inf", "finiteness (64 bins)", "bitwise group", "first values")

    def __repr__(self) -> str:
        rows = [self.columns, *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.columns))]
        table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                 for row in rows]
        return "\n".join([self.title, *table, *self._notes()])

    def _repr_html_(self) -> str:
        head = markup.join(markup.fmt("<th style='text-align:left'>{}</th>", c)
                           for c in self.columns)
        body = markup.join(
            markup.fmt("<tr>{}</tr>", markup.join(
                markup.fmt("<td style='font-family:monospace;white-space:pre'>{}</td>", cell)
                for cell in row)) for row in self._rows())
        color = "#1a7f37" if self.all_equal else "#b42318"
        notes = self._notes()
        return markup.fmt(
            "<div style='font-size:12px'><b>{}</b><table style='font-size:11px' cellpadding=2>"
            "<tr>{}</tr>{}</table><div style='color:{}'>{}</div>{}</div>",
            self.title, head, body, color, notes[0],
            markup.join(markup.fmt("<div>{}</div>", n) for n in notes[1:]))


def _letter(i: int) -> str:
    """0 -> 'A', 25 -> 'Z', 26 -> 'AA'."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(65 + r) + out
    return out
