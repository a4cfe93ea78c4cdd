"""Polling for a condition another thread makes true (shared by the thread tests)."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], bool], limit: float = 60.0) -> bool:
    """True once `check()` is, polled every 10 ms; after `limit` seconds (which only bounds a
    broken run), whatever a last `check()` says."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()
