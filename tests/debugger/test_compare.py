"""The cross-rank comparison on synthetic replies: 64 simulated ranks read as a few bitwise
groups, outliers first; the first differing chunk from chunk digests, then the first differing
element from the fetched bytes; "equal" only where digests of one shape and dtype match."""

from __future__ import annotations

import numpy as np

from ddpviz.debugger.compare import Summary, compare, first_difference, unravel
from ddpviz.debugger.rank_values import RankValues, finiteness_bar
from tests.debugger.fake_ranks import summarize


def summaries(arrays: dict[int, np.ndarray]) -> dict[int, Summary]:
    return {r: Summary.of(summarize(r, 3, 1, "fc1.weight", "grad", a))
            for r, a in arrays.items()}


def test_64_ranks_split_into_bitwise_groups_outliers_first() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 40)).astype(np.float32)
    arrays = {r: base.copy() for r in range(64)}
    arrays[7][10, 3] += 1e-3  # one outlier
    for r in (40, 41):  # a pair of outliers, equal to each other
        arrays[r][50 % 64, 39] = np.nan
    c = compare(summaries(arrays))
    assert [g.ranks for g in c.groups] == [(7,), (40, 41), tuple(
        r for r in range(64) if r not in (7, 40, 41))]
    assert not c.all_equal
    # where each outlier group first differs from the largest group, from chunk digests
    diffs = {d.ranks: d for d in c.differences}
    flat7 = 10 * 40 + 3
    assert diffs[(7,)].start <= flat7 < diffs[(7,)].stop
    assert diffs[(40, 41)].start <= 50 * 40 + 39 < diffs[(40, 41)].stop
    assert sorted(c.nonfinite) == [40, 41] and c.nonfinite[40].nonfinite_at == ((50, 39),)
    # the first differing element, from one chunk of two ranks
    d = diffs[(7,)]
    chunk = {r: arrays[r].reshape(-1)[d.start:d.stop].tobytes() for r in (0, 7)}
    e = first_difference(chunk, "float32", d.start, (64, 40))
    assert e is not None and e.flat == flat7 and e.position == (10, 3)
    assert e.values == {0: float(base[10, 3]), 7: float(arrays[7][10, 3])}


def test_equal_only_when_digests_of_the_same_shape_and_dtype_match() -> None:
    a = np.arange(12, dtype=np.float32)
    same = compare(summaries({0: a, 1: a.copy(), 2: a.copy()}))
    assert same.all_equal and "bitwise equal on all 3 ranks" in same.verdict()
    # the same bytes as another shape are not "equal": the key holds the shape
    reshaped = compare(summaries({0: a, 1: a.reshape(3, 4)}))
    assert not reshaped.all_equal and any("shape differs" in m for m in reshaped.mismatched)
    # a rank without a digest is never called equal
    s = summaries({0: a, 1: a.copy()})
    s[1] = s[1]._replace(digest="")
    partial = compare(s)
    assert not partial.all_equal and partial.uncompared == (1,)
    assert "rank 1 sent no digest" in partial.verdict()


def test_minus_zero_and_nan_compare_bitwise() -> None:
    a = np.array([0.0, np.nan, 1.0], dtype=np.float32)
    b = np.array([-0.0, np.nan, 1.0], dtype=np.float32)
    e = first_difference({0: a.tobytes(), 1: b.tobytes()}, "float32", 0, (3,))
    assert e is not None and e.flat == 0
    assert first_difference({0: a.tobytes(), 1: a.tobytes()}, "float32", 0, (3,)) is None
    bf = np.array([0x3F80, 0x4000], dtype="<u2").tobytes()  # bfloat16 1.0, 2.0
    bf2 = np.array([0x3F80, 0x4040], dtype="<u2").tobytes()  # 1.0, 3.0
    e = first_difference({0: bf, 1: bf2}, "bfloat16", 4, (6,))
    assert e is not None and e.flat == 5 and e.values == {0: 2.0, 1: 3.0}


def test_unravel_is_row_major() -> None:
    for shape in [(5,), (3, 4), (2, 3, 4)]:
        for flat in range(int(np.prod(shape))):
            assert unravel(flat, shape) == tuple(int(i) for i in np.unravel_index(flat, shape))


def test_the_view_groups_many_ranks_and_escapes_names() -> None:
    base = np.ones((8, 8), dtype=np.float32)
    arrays = {r: base.copy() for r in range(20)}
    arrays[3][0, 0] = np.inf
    name = "<script>alert(1)</script>.weight"
    values = RankValues(name, "grad", summaries(arrays), errors={19: "<b>gone</b>"})
    text = repr(values)
    assert "3 (1)" in text.splitlines()[2] and "0-2, 4-19 (19)" in text  # outliers first
    html = values._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>gone</b>" not in html and "&lt;b&gt;gone" in html
    assert not values.all_equal
    few = RankValues("w", "value", summaries({0: base, 1: base.copy()}))
    assert few.all_equal and "bitwise equal on all 2 ranks" in repr(few)


def test_finiteness_bar_shows_any_nonfinite_bin() -> None:
    assert finiteness_bar((0.0, 0.001, 0.5, 1.0)) == "·▁▄█"
