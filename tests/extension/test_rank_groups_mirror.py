"""The viewer's rank grouping (extension/src/rankGroups.ts) gives the same labels, groups,
percentiles and slowest ranks as Python's (ddpviz/model/rank_groups.py) on the same inputs,
run in node (the TypeScript transpiled with the extension's own compiler)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ddpviz.findings import format_ranges
from ddpviz.model.rank_groups import rank_label, slowest, spread, value_groups
from tests.extension.mirror import run_typescript

# per case: the label, groups, percentiles and slowest ranks rankGroups.ts computes
OUT = """cases.map(c => ({
  label: g.rankLabel(c.ranks),
  groups: g.valueGroups(Object.entries(c.values).map(([r, v]) => [Number(r), v]))
    .map(x => [x.value, x.ranks, x.label]),
  spread: g.spread(c.numbers),
  slowest: g.slowest(Object.entries(c.times).map(([r, v]) => [Number(r), v]), 5),
}))"""


def cases() -> list[dict[str, Any]]:
    rng = random.Random(13)
    out = []
    for n in (1, 2, 17, 256):
        ranks = sorted(rng.sample(range(300), n))
        values = {r: rng.choice(["a", "b", "c"]) if rng.random() < 0.3 else "a" for r in ranks}
        numbers = [rng.uniform(0, 1e6) for _ in range(n)]
        times = {r: float(rng.randrange(20)) for r in ranks}  # ties on purpose
        out.append({"ranks": ranks, "values": values, "numbers": numbers, "times": times})
    out.append({"ranks": [], "values": {}, "numbers": [], "times": {}})
    return out


def test_typescript_rank_groups_equal_pythons() -> None:
    data = cases()
    got = run_typescript("rankGroups.ts", OUT, data)
    for case, ts in zip(data, got, strict=True):
        assert ts["label"] == rank_label(case["ranks"])
        assert ts["groups"] == [[g.value, list(g.ranks), g.label]
                                for g in value_groups(case["values"])]
        s = spread(case["numbers"])
        if s is None:
            assert ts["spread"] is None
        else:
            assert [ts["spread"][k] for k in ("n", "min", "p10", "p50", "p90", "max")] == \
                pytest.approx(list(s))
        assert [tuple(x) for x in ts["slowest"]] == slowest(case["times"], 5)


def test_typescript_range_labels_equal_pythons() -> None:
    # the one range formatter of each side, with the settings of every label that uses it:
    # rank labels, format_ranks ("0-3,5"), step lists (cut past `most`), diagnosed steps
    rng = random.Random(17)
    settings = [{}, {"run": 4, "sep": ","}, {"most": 8}, {"most": 3}, {"run": 2, "most": 6}]
    data = [{"numbers": numbers, **s} for s in settings
            for numbers in ([], [5], [2, 0, 1], [0, 1, 2, 3, 5, 7, 8, 9, 10, 11],
                            [rng.randrange(40) for _ in range(30)])]
    got = run_typescript("rankGroups.ts", "cases.map(c => g.formatRanges(c.numbers, c))", data)
    for case, ts in zip(data, got, strict=True):
        numbers = case.pop("numbers")
        assert ts == format_ranges(numbers, **case), (numbers, case)
