"""Ranks as threads around one in-memory store (dist.HashStore): the store protocols of
rendezvous.py and the watchdog, tested without processes or process groups."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist


class FakeGroup:
    """What the store protocols use of a process group: rank() and size()."""

    def __init__(self, rank: int, world_size: int) -> None:
        self._rank = rank
        self._size = world_size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def in_threads(fn: Callable[[int, Any], Any], ranks: list[int], store: dist.Store,
               timeout: float = 30.0) -> dict[int, Any]:
    """Run fn(rank, store) for each rank in its own thread; {rank: result or exception}."""
    results: dict[int, Any] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, store)
        except BaseException as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    return results
