"""Who receives a stream of events, and how a message's events reach them.

`subscribe(callback, batch=...)` is one verb on the Collector, a FolderFeed (session/follow.py)
and a Session; `Subscribers` is its one implementation, and `deliver` the one way events are
handed over. The list is copy-on-write: the thread delivering reads a tuple that adding or
removing never changes, so it needs no lock and no copy per message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from ddpviz.events import Event


class Subscriber(NamedTuple):
    callback: Callable[[Any], None]
    batch: bool  # called with each message's list of events, not event by event
    on_close: Callable[[], None] | None = None  # told when the stream ends (an iterator)


class Subscribers:
    """The subscribers of one stream, added and removed from any thread.

    Args:
        lock: taken to add or remove one; pass the owner's lock when removing must wait for a
            delivery that holds it (a Session delivers under its lock, so once `unsubscribe()`
            returns the callback is not called again). A fresh lock by default.
    """

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        self._lock = lock if lock is not None else threading.Lock()
        self._current: tuple[Subscriber, ...] = ()

    @property
    def current(self) -> tuple[Subscriber, ...]:
        """A snapshot: later additions and removals do not change it."""
        return self._current

    def add(self, callback: Callable[[Any], None], *, batch: bool = False,
            on_close: Callable[[], None] | None = None) -> Callable[[], None]:
        """Subscribe `callback`; returns the function that unsubscribes it (again: nothing)."""
        sub = Subscriber(callback, batch, on_close)
        with self._lock:
            self._current = (*self._current, sub)

        def unsubscribe() -> None:
            with self._lock:
                # by identity: the same callback subscribed twice is two subscriptions
                self._current = tuple(s for s in self._current if s is not sub)

        return unsubscribe

    def deliver(self, events: list[Event], on_error: Callable[[object, Exception], None]
                ) -> None:
        """Hand `events` to everyone subscribed now (see `deliver`)."""
        deliver(self._current, events, on_error)

    def close(self) -> None:
        """Tell the subscribers that wait for the end of the stream (iterators) it ended."""
        for sub in self._current:
            if sub.on_close is not None:
                sub.on_close()


def deliver(subscribers: Iterable[Subscriber], events: list[Event],
            on_error: Callable[[object, Exception], None]) -> None:
    """Hand `events` to each subscriber: the list at once (batch) or event by event; a
    callback's exception goes to `on_error`, and the stream goes on (the rest of the list
    included)."""
    for callback, batch, _ in subscribers:
        if batch:
            try:
                callback(events)
            except Exception as exc:
                on_error(callback, exc)
            continue
        for e in events:
            try:
                callback(e)
            except Exception as exc:  # costs nothing until raised (3.11 zero-cost try)
                on_error(callback, exc)
