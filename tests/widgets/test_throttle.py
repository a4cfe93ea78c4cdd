"""Throttle: bursts of requests from other threads coalesce into redraws at most max_hz apart;
deferred work is redone, errors never escape a background thread."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

import pytest

from ddpviz.widgets.throttle import Throttle
from tests.polling import eventually


def test_a_burst_of_requests_from_threads_coalesces_into_few_redraws() -> None:
    calls: list[float] = []
    t = Throttle(lambda: calls.append(time.monotonic()), max_hz=10)

    def hammer() -> None:
        for _ in range(2000):
            t.request()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert eventually(lambda: not t.pending, limit=5.0)
    time.sleep(0.15)
    t.close()
    assert 1 <= len(calls) <= 3  # 8,000 requests in a burst, not 8,000 redraws


def test_redraws_are_never_closer_than_one_over_max_hz() -> None:
    t = Throttle(lambda: None, max_hz=10)
    stop = time.monotonic() + 1.0
    while time.monotonic() < stop:  # a steady stream of requests, every 5 ms
        t.request()
        time.sleep(0.005)
    t.close()
    gaps = [b - a for a, b in pairwise(t.times)]
    assert t.redraws >= 5
    assert min(gaps) >= t.interval * 0.99


def test_a_redraw_that_defers_work_is_run_again_by_the_throttle() -> None:
    left = [3]

    def redraw() -> bool:
        left[0] -= 1
        return left[0] > 0  # "more to do"

    t = Throttle(redraw, max_hz=50)
    t.request()
    assert eventually(lambda: left[0] == 0, limit=5.0)
    t.close()
    assert t.redraws == 3


def test_errors_are_counted_and_kept_not_raised_in_the_thread() -> None:
    def boom() -> None:
        raise RuntimeError("draw failed")

    t = Throttle(boom, max_hz=50)
    t.request()
    assert eventually(lambda: t.errors == 1, limit=5.0)
    t.request()
    assert eventually(lambda: t.errors == 2, limit=5.0)
    t.close()
    assert isinstance(t.first_error, RuntimeError)


def test_flush_redraws_pending_work_in_the_calling_thread() -> None:
    seen: list[str] = []
    t = Throttle(lambda: seen.append(threading.current_thread().name), max_hz=0.5)
    t.flush()
    assert seen == []  # nothing pending
    t._last = time.monotonic()  # the timer would wait 2 s now
    t.request()
    t.flush()
    assert seen[-1] == threading.current_thread().name
    t.close()


def test_max_hz_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ddpviz: max_hz must be > 0"):
        Throttle(lambda: None, max_hz=0)
