"""Replica agreement as plain data: one row per tensor a `replicas_diverged` finding named,
one cell per rank (the letter of the group of ranks holding the same bytes: A, the most common,
agrees with the majority), columns grouped when there are more than MANY_RANKS ranks.

Read from the findings only (ddpviz/probes/replica_verdict.py writes them, findings.py's
`tensor_groups` reads their per-tensor lines back), so a live run and a trace show the same.
Pure functions: no widgets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ddpviz.findings import Finding, tensor_groups
from ddpviz.model.rank_groups import MANY_RANKS, rank_label, value_groups


class ReplicaRow(NamedTuple):
    """One differing tensor at one checked step."""

    step: int
    name: str
    severity: str
    cells: dict[int, str]  # rank -> group letter ("A": the most common bytes)
    sizes: dict[str, str]  # group letter -> what those ranks hold (norms)


class ReplicaMatrix(NamedTuple):
    rows: list[ReplicaRow]
    columns: list[tuple[str, tuple[int, ...]]]  # (label, ranks): one rank or a group of ranks
    world_size: int


def replica_matrix(findings: Sequence[object], world_size: int = 0,
                   many: int = MANY_RANKS) -> ReplicaMatrix:
    """The rows of every replicas_diverged finding in `findings`, and the columns: each rank
    up to `many` ranks, else the groups of ranks whose cells are alike in every row."""
    rows: list[ReplicaRow] = []
    ranks: set[int] = set()
    for f in findings:
        if not isinstance(f, Finding) or f.kind != "replicas_diverged":
            continue
        world_size = max(world_size, f.world_size)
        for line in f.detail:
            read = tensor_groups(line)
            if read is None:
                continue
            name, groups = read
            cells: dict[int, str] = {}
            sizes: dict[str, str] = {}
            for k, (rs, held) in enumerate(groups):
                letter = chr(ord("A") + k) if k < 26 else str(k)
                sizes[letter] = held
                for r in rs:
                    cells[r] = letter
            ranks |= cells.keys()
            rows.append(ReplicaRow(f.step, name, f.severity, cells, sizes))
    everyone = sorted(ranks | set(range(world_size)))
    columns: list[tuple[str, tuple[int, ...]]]
    if len(everyone) <= many:
        columns = [(str(r), (r,)) for r in everyone]
    else:  # ranks alike in every row share a column, labelled by rank ranges
        pattern = {r: tuple(row.cells.get(r, "") for row in rows) for r in everyone}
        columns = [(rank_label(g.ranks), g.ranks) for g in value_groups(pattern)]
    return ReplicaMatrix(rows, columns, world_size or len(everyone))
