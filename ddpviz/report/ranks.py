"""The report's per-rank figures, each labelled with what it counts.

Recording samples steps (watch()'s default: steps 0-2, the rebuild, every 100th): the counts of
all-reduces and the backward and all-reduce means cover the steps recorded in full only, and the
table says which. An all-reduce finishes only when every rank joined it, so a rank's
launch-to-done time includes its wait for the last rank to hand in the same bucket; that wait is
shown apart, from the launches of every rank on the aligned clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ddpviz import events as ev
from ddpviz import markup
from ddpviz.findings import format_ranges, recording_advice
from ddpviz.model.spans import Span
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from ddpviz.units import human_duration


class RankCounts(NamedTuple):
    """One rank's counts, read from its columns."""

    events: int
    steps: int  # steps run: its highest step + 1
    in_steps_ns: int  # from its first event in a step to its last event (0: none in a step)
    dropped: int  # events the recording dropped (EventsDropped)
    holes: int  # sequence numbers missing (events lost without a note)


def rank_counts(table: Table) -> RankCounts:
    """`RankCounts` of one rank's table."""
    n = len(table)
    dropped_code = col.CODE[ev.EventsDropped]
    seqs = np.unique(table.seq[table.kind != dropped_code])
    holes = int(seqs[-1]) + 1 - len(seqs) if len(seqs) else 0
    dropped = sum(e.count for e in table.rare(ev.EventsDropped))
    steps = (int(table.step.max()) if n else -1) + 1
    in_steps = table.t[table.step >= 0]
    span = int(table.t.max() - in_steps.min()) if len(in_steps) else 0
    return RankCounts(n, steps, span, dropped, holes)


def launch_waits(spans_by_rank: Mapping[int, list[Span]]) -> dict[int, list[int]]:
    """Per rank, for each all-reduce every rank recorded (same step, same bucket): how long
    after this rank's launch the last rank launched it (0 for the last one)."""
    launches: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)
    for rank, spans in spans_by_rank.items():
        for s in spans:
            if s.cat == "allreduce":
                launches[(s.step, s.lane)].setdefault(rank, s.start_ns)
    ranks = set(spans_by_rank)
    out: dict[int, list[int]] = {r: [] for r in spans_by_rank}
    for by_rank in launches.values():
        if set(by_rank) != ranks:
            continue  # not every rank recorded it: no wait to tell
        last = max(by_rank.values())
        for rank, t in by_rank.items():
            out[rank].append(last - t)
    return out


def _mean(values: list[int]) -> str:
    return human_duration(sum(values) / len(values)) if values else "-"


def ranks_section(tables: Mapping[int, Table], spans_by_rank: Mapping[int, list[Span]],
                  clock: Mapping[int, tuple[int, int]]) -> str:
    """The per-rank table and the notes that say what each column counts."""
    head = ["rank", "events", "steps run", "steps recorded in full", "time in steps ¹",
            "backward mean ²", "all-reduces recorded ³", "all-reduce launch to done, mean ⁴",
            "of which waiting for the last rank's launch ⁴", "unfinished spans ⁵", "dropped",
            "seq holes", "clock offset"]
    waits = launch_waits(spans_by_rank)
    rows: list[list[object]] = []
    for rank, table in tables.items():
        c = rank_counts(table)
        sp = spans_by_rank.get(rank, [])
        back = [s.end_ns - s.start_ns for s in sp if s.name == "backward" and s.finished]
        ars = [s.end_ns - s.start_ns for s in sp if s.cat == "allreduce" and s.finished]
        full = {s.step for s in sp if s.cat == "allreduce" or s.name == "backward"}
        offset, error = clock.get(rank, (0, 0))
        said = (f"{human_duration(offset)} ± {human_duration(error)}" if error >= 0
                else f"{human_duration(offset)} (wall clock)")
        rows.append([rank, c.events, c.steps, format_ranges(full) or "none",
                     human_duration(c.in_steps_ns) if c.steps else "-", _mean(back), len(ars),
                     _mean(ars), _mean(waits.get(rank, [])),
                     sum(1 for s in sp if not s.finished), c.dropped, c.holes, said])
    cls = [markup.Markup(" class='l'" if i == 3 else "") for i in range(len(head))]
    heads = markup.join(markup.fmt("<th{}>{}</th>", c, h) for c, h in zip(cls, head, strict=True))
    body = markup.join(
        markup.fmt("<tr>{}</tr>", markup.join(markup.fmt("<td{}>{}</td>", c, v)
                                              for c, v in zip(cls, row, strict=True)))
        for row in rows)
    notes = markup.fmt(
        "<ol class='notes'>"
        "<li>From this rank's first event in a step to its last event. The time before its "
        "first step (the model comparison, DDP's construction, the script's setup until its "
        "first forward) is left out: the summary above says it.</li>"
        "<li>From the backward's start to its end, on the steps recorded in full: it includes "
        "waiting for the all-reduces.</li>"
        "<li>Bucket all-reduces on the steps recorded in full only (the recording samples "
        "steps; {} records every step).</li>"
        "<li>From this rank handing a bucket to its all-reduce to the all-reduce done. An "
        "all-reduce finishes only once every rank joined it: this includes the wait for the "
        "last rank to hand in the same bucket, shown in the next column (the launches of every "
        "rank compared on the aligned clock, to within the clock offset's error).</li>"
        "<li>Spans with a start and no end event: a rank that hung or crashed inside them.</li>"
        "</ol>", recording_advice("every=1"))
    return markup.fmt("<section id='ranks'><h2>Per-rank summary</h2><div class='wide'>"
                      "<table><tr>{}</tr>{}</table></div>{}</section>", heads, body, notes)
