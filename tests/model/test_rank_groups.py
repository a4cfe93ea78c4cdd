"""rank_groups: rank-range labels, value groups, percentiles (checked against numpy), and the
slowest ranks."""

from __future__ import annotations

import numpy as np
import pytest

from ddpviz.model.rank_groups import (
    percentile,
    rank_label,
    slowest,
    spread,
    value_groups,
)


def test_rank_label_writes_runs_of_three_or_more_as_ranges() -> None:
    assert rank_label([*range(128), *range(129, 256)]) == "0-127, 129-255"
    assert rank_label([7, 0, 1, 2, 3, 5, 8]) == "0-3, 5, 7, 8"
    assert rank_label([4, 5]) == "4, 5"
    assert rank_label([]) == ""


def test_value_groups_put_the_largest_group_first_and_label_it_with_ranges() -> None:
    values = {r: "a" for r in range(256)}
    values[128] = "b"
    values[3] = "c"
    groups = value_groups(values)
    assert [g.value for g in groups] == ["a", "c", "b"]  # equal sizes: lowest rank first
    assert groups[0].label == "0-2, 4-127, 129-255"
    assert groups[1].ranks == (3,) and groups[2].ranks == (128,)
    assert sum(len(g.ranks) for g in groups) == 256


@pytest.mark.parametrize("q", [0, 10, 37.5, 50, 90, 100])
def test_percentile_equals_numpys_linear_interpolation(q: float) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 256):
        xs = sorted(rng.normal(size=n).tolist())
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_spread_and_slowest() -> None:
    values = {r: float(r % 10) for r in range(256)}
    values[77] = 1000.0
    values[3] = 500.0
    s = spread(values.values())
    assert s is not None
    xs = list(values.values())
    assert (s.n, s.min, s.max) == (256, 0.0, 1000.0)
    assert (s.p10, s.p50, s.p90) == pytest.approx(tuple(np.percentile(xs, [10, 50, 90])))
    assert spread([]) is None
    assert slowest(values, 3) == [(77, 1000.0), (3, 500.0), (9, 9.0)]  # ties: lowest rank
    with pytest.raises(ValueError, match="ddpviz: percentile of no values"):
        percentile([], 50)
