"""A Dashboard of a 256-rank run: still one FigureWidget (plotly.js shipped once), and every
part reads at that scale: the hook timeline as distributions with the planted slow rank named
first, the verification matrix in two columns (the rank with another shape alone), broadcast
bars per group of ranks; what is shipped stays within the 6 MB budget."""

from __future__ import annotations

import ipywidgets as w
import plotly.graph_objects as go

from ddpviz.widgets import Dashboard
from tests.widgets.streams import Plant, synthetic_run
from tests.widgets.wire import WireCounter


def widgets_in(root: w.Widget) -> list[w.Widget]:
    out = [root]
    for child in getattr(root, "children", ()):
        out += widgets_in(child)
    return out


def test_a_256_rank_dashboard_ships_plotly_once_and_groups_every_part() -> None:
    events = synthetic_run(256, 40, 3, plant=Plant(slow={100: 400}))
    with WireCounter() as wire:
        d = Dashboard(events)
    figures = [x for x in widgets_in(d) if isinstance(x, go.FigureWidget)]
    assert len(figures) == 1
    assert sum(size > 1_000_000 for size in wire.largest(5)) == 1  # plotly.js, once
    assert wire.total <= 6_000_000
    t = d.timeline
    assert t.spread is not None and t.spread.n_ranks == 256
    assert t.spread.slowest[0].rank == 100 and t.shown_ranks() == [100]
    assert t.svg_html.value.count("font-weight='bold'>rank ") == 1
    assert d.broadcast.grouped and sum(len(g.ranks) for g in d.broadcast.groups) == 256
    assert len(d.broadcast.rows_box.children) <= 25  # bars for groups, not for ranks
    assert d.verification.columns() == [tuple(range(256))]


def test_a_256_rank_verification_failure_shows_the_odd_rank_in_its_own_column() -> None:
    d = Dashboard(synthetic_run(256, 10, 0, plant=Plant(shape={200: (4, (3, 16))})))
    assert d.verification.columns() == [(*range(200), *range(201, 256)), (200,)]
    assert "rank 200" in d.verification.matrix.verdict or "2.weight" in \
        d.verification.matrix.verdict
