"""hook_analysis reads a step's hooks from its columns (numpy): the unused parameters, the
firing-order departures and the per-bucket averages it finds equal the per-hook Python it
replaced (kept here as the reference), on random orders, reports, records and counts."""

from __future__ import annotations

import random
from statistics import fmean

import numpy as np

from ddpviz.findings import group_ranks
from ddpviz.model.event_model import GradArray, StepRecord
from ddpviz.model.hook_analysis import (
    MAX_DEPARTURES_LISTED,
    MAX_UNUSED_LISTED,
    BucketAverages,
    OrderDiff,
    _counts,
    _unused,
    bucket_averages,
    compute_end,
    hook_columns,
    order_diff,
)


def unused_reference(reported: list[int], fired: list[int], n_params: int | None
                     ) -> tuple[tuple[int, ...], int]:
    out = set(reported)
    if n_params is None:
        return tuple(sorted(out)[:MAX_UNUSED_LISTED]), len(out)
    done = {p for p in fired if 0 <= p < n_params}
    extra = sum(1 for p in out if not 0 <= p < n_params or p in done)
    first: list[int] = []
    i = 0
    while i < n_params and len(first) < MAX_UNUSED_LISTED:
        if i not in done:
            first.append(i)
        i += 1
    listed = sorted(out | set(first))[:MAX_UNUSED_LISTED]
    return tuple(listed), n_params - len(done) + extra


def order_diff_reference(orders: dict[int, tuple[int, ...]]) -> OrderDiff:
    if not orders:
        return OrderDiff((), (), {}, {})
    groups = group_ranks({r: ",".join(map(str, o)) for r, o in orders.items()})
    ref_ranks = groups[0][1]
    reference = orders[ref_ranks[0]]
    positions: dict[int, tuple[int, ...]] = {}
    departures: dict[int, int] = {}
    for r, o in orders.items():
        common = min(len(o), len(reference))
        first = [i for i in range(common) if o[i] != reference[i]]
        count = len(first) + max(len(o), len(reference)) - common
        tail = range(common, common + max(0, MAX_DEPARTURES_LISTED - len(first)))
        positions[r] = tuple(first[:MAX_DEPARTURES_LISTED]) + tuple(
            i for i in tail if i < common + count - len(first))
        departures[r] = count
    return OrderDiff(reference, ref_ranks, positions, departures)


def test_unused_parameters_from_the_columns_equal_the_per_hook_count() -> None:
    rng = random.Random(0)
    for _ in range(400):
        n = rng.choice([None, 0, 1, 5, 70, 300, 5_000])
        top = max(n or 0, 10)
        fired = [rng.randrange(-2, top + 3) for _ in range(rng.randint(0, 2 * top))]
        if rng.random() < 0.3:  # a full backward: every parameter once, shuffled
            fired = list(range(top))
            rng.shuffle(fired)
        reported = [rng.randrange(-1, top + 2) for _ in range(rng.randint(0, 80))]
        expected = unused_reference(reported, fired, n)
        assert _unused(reported, fired, n) == expected
        assert _unused(reported, hook_columns(GradArray.of(
            (i, p, 0) for i, p in enumerate(fired)))[0], n) == expected


def test_departures_from_the_reference_order_equal_the_per_position_compare() -> None:
    rng = random.Random(1)
    for _ in range(300):
        n = rng.choice([0, 1, 3, 40, 700])
        base = list(range(n))
        rng.shuffle(base)
        orders: dict[int, tuple[int, ...]] = {}
        for r in rng.sample(range(40), rng.randint(1, 12)):
            o = list(base)
            what = rng.random()
            if what < 0.3 and n > 1:  # a few swaps
                for _ in range(rng.randint(1, 4)):
                    i = rng.randrange(n - 1)
                    o[i], o[i + 1] = o[i + 1], o[i]
            elif what < 0.5:  # still inside backward: a prefix
                o = o[: rng.randint(0, n)]
            elif what < 0.6:  # another order altogether, longer or shorter
                o = [rng.randrange(n + 5) for _ in range(rng.randint(0, n + 300))]
            orders[r] = tuple(o)
        assert order_diff(orders) == order_diff_reference(orders)


def test_hook_columns_read_a_list_and_a_columns_step_alike() -> None:
    grads = [(10, 3, 0), (11, 1, 0), (12, 2, 1)]
    array = GradArray.of(grads[:2])
    array.append(grads[2])  # a hook fed as an object after the trace's columns
    for source in (grads, array):
        params, buckets = hook_columns(source)
        assert params.tolist() == [3, 1, 2] and buckets.tolist() == [0, 0, 1]
    assert [x.tolist() for x in hook_columns([])] == [[], []]


def bucket_averages_reference(history: dict[int, dict[int, StepRecord]], steps: list[int]
                              ) -> tuple[BucketAverages, ...]:
    acc: dict[int, dict[str, list[float]]] = {}
    for step in steps:
        per: dict[int, dict[str, float]] = {}
        for rec in history.get(step, {}).values():
            end_ns = compute_end(rec)
            for b, (start, _, _) in rec.launched.items():
                d = per.setdefault(b, {})
                end = rec.done.get(b)
                if end is not None:
                    d["ar"] = max(d.get("ar", 0.0), (end - start) / 1e6)
                    if end_ns is not None:
                        exposed = max(0, end - max(start, end_ns)) / 1e6
                        d["exp"] = max(d.get("exp", 0.0), exposed)
            if rec.backward is not None:
                for b, t in rec.bucket_ready.items():
                    d = per.setdefault(b, {})
                    d["ready"] = max(d.get("ready", 0.0), (t - rec.backward) / 1e6)
        for b, d in per.items():
            a = acc.setdefault(b, {"ready": [], "ar": [], "exp": []})
            for k, v in d.items():
                a[k].append(v)
    return tuple(BucketAverages(b, max(len(d["ar"]), len(d["ready"])),
                                fmean(d["ready"]) if d["ready"] else None,
                                fmean(d["ar"]) if d["ar"] else None,
                                fmean(d["exp"]) if d["exp"] else None)
                 for b, d in sorted(acc.items()))


def _record(rng: random.Random) -> StepRecord:
    t0 = rng.randrange(10**6)
    rec = StepRecord(t0, t0 + 10**5)
    rec.backward = None if rng.random() < 0.2 else t0 + rng.randrange(-50, 3_000)
    if rng.random() < 0.7:
        rec.grads = [(t0 + rng.randrange(5_000), p, p % 3) for p in range(rng.randint(1, 6))]
    for b in rng.sample(range(6), rng.randint(0, 6)):
        start = t0 + rng.randrange(6_000)
        rec.launched[b] = (start, 64, "float32")
        if rng.random() < 0.8:
            rec.done[b] = start + rng.randrange(-100, 4_000)
        if rng.random() < 0.8:
            rec.bucket_ready[b] = t0 + rng.randrange(-200, 6_000)
    for b in rng.sample(range(8), rng.randint(0, 2)):  # ready, never launched
        rec.bucket_ready[b] = t0 + rng.randrange(6_000)
    return rec


def test_bucket_averages_equal_the_per_bucket_reference() -> None:
    rng = random.Random(2)
    for _ in range(200):
        history = {s: {r: _record(rng) for r in range(rng.randint(0, 5))}
                   for s in range(rng.randint(0, 6))}
        steps = sorted(rng.sample(range(8), rng.randint(0, 8)))
        assert bucket_averages(history, steps) == bucket_averages_reference(history, steps)


def test_hook_counts_per_bucket_read_from_the_column() -> None:
    assert _counts(np.array([3, 0, 3, 3, 7])) == {0: 1, 3: 3, 7: 1}
    assert _counts(np.array([5, -1, 5])) == {-1: 1, 5: 2}  # not a bucket index: np.unique
    assert _counts(np.array([10**9, 2])) == {2: 1, 10**9: 1}
