"""The viewer's replica panel (extension/src/replicas.ts) reads the same rows, letters, hover
texts and columns from replicas_diverged findings as Python's replica_matrix
(ddpviz/widgets/replica_matrix.py, the oracle of the panel), run in node on the
same findings: the replica check's own (probes/replica_verdict.judge), random ones with
overlapping and many-rank groups, and old traces' detail lines."""

from __future__ import annotations

import random
from typing import Any

import msgspec

from ddpviz.findings import Finding, format_spans
from ddpviz.limits import MAX_WORLD_SIZE
from ddpviz.widgets.replica_matrix import ReplicaMatrix, replica_matrix
from tests.extension.mirror import run_typescript
from tests.model.test_replica_matrix import _finding

OUT = """cases.map(c => { const m = g.replicaMatrix(c.findings, 0, c.many);
  return { rows: m.rows.map(r => [r.step, r.name, r.severity, r.cells, [...r.sizes]]),
           columns: m.columns, world: m.worldSize }; })"""


def python_side(m: ReplicaMatrix) -> dict[str, Any]:
    return {"rows": [[r.step, r.name, r.severity, [list(s) for s in r.cells.spans],
                      [list(kv) for kv in r.sizes.items()]] for r in m.rows],
            "columns": [[label, [list(s) for s in spans]] for label, spans in m.columns],
            "world": m.world_size}


def random_finding(rng: random.Random, world: int, *, as_lines: bool) -> Finding:
    tensors = []
    for t in range(rng.randrange(1, 5)):
        groups = []
        for g in range(rng.randrange(1, 4)):
            spans = []
            for _ in range(rng.randrange(1, 4)):
                lo = rng.randrange(world)
                spans.append((lo, min(world - 1, lo + rng.choice([0, 0, 1, 5, 40]))))
            groups.append((f"norm {g}.{t} <b>x</b>", tuple(spans)))  # overlaps on purpose
        tensors.append((f"layer{t}.weight", tuple(groups)))
    severity = rng.choice(["error", "error", "info"])
    if as_lines:  # a trace written before findings carried `tensors`
        detail = tuple(f"{name}: " + "; ".join(
            f"ranks {format_spans(spans, sep=',')}: {held}" for held, spans in groups)
            for name, groups in tensors) + ("cause: an edit on one rank",)
        return Finding(kind="replicas_diverged", severity=severity, title="t",
                       step=rng.randrange(50), detail=detail, world_size=world)
    return Finding(kind="replicas_diverged", severity=severity, title="t",
                   step=rng.randrange(50), tensors=tuple(tensors), world_size=world)


def cases() -> list[dict[str, Any]]:
    rng = random.Random(40)
    out: list[list[Finding]] = [
        [],
        [_finding(3, {1: [1, 9, 3], 2: [1, 8, 4]})],
        [_finding(40, {5: [1, 9, 3], 6: [1, 9, 3], 30: [7, 2, 3]})],
        [Finding(kind="replicas_diverged", severity="error", title="t", step=3,
                 detail=(f"w: ranks 0-{MAX_WORLD_SIZE + 5}: norm 1; rank 7: norm 2",
                         "v: rank 0007: a", "u: ranks x: no"))],
        [Finding(kind="nan_found", severity="error", title="not a replica finding")],
    ]
    for world in (2, 5, 16, 17, 64, 300):
        for as_lines in (False, True):
            out.append([random_finding(rng, world, as_lines=as_lines)
                        for _ in range(rng.randrange(1, 4))])
    return [{"findings": [msgspec.to_builtins(f) for f in fs], "many": many, "py": fs}
            for fs in out for many in (16, 4)]


def test_typescript_replica_matrix_equals_pythons() -> None:
    data = cases()
    got = run_typescript("replicas.ts", OUT, [{k: c[k] for k in ("findings", "many")}
                                              for c in data])
    assert any(len(ts["rows"]) > 3 for ts in got)
    assert any("," in label for ts in got for label, _ in ts["columns"])  # grouped columns
    for case, ts in zip(data, got, strict=True):
        assert ts == python_side(replica_matrix(case["py"], many=case["many"])), case["py"]
