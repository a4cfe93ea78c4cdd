"""Timing one call in-process, for the benchmarks that time a single function (not whole steps:
those compare variants side by side through _ranks.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def times_us(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """`fn()` called `repeat` times: the median and the 95th percentile, in microseconds."""
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(0.95 * len(samples))] * 1e6
