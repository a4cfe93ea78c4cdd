"""The one subscriber list of the Collector, a FolderFeed and a Session (transport/subscribers.py):
batch and per-event delivery, errors that do not stop the stream, unsubscribing (once, by
subscription), and the end of the stream told to iterators."""

from __future__ import annotations

import threading
from typing import Any

from ddpviz import events as ev
from ddpviz.transport.subscribers import Subscribers


def _events(n: int) -> list[Any]:
    return [ev.ForwardStarted(rank=0, step=i, t_ns=i, seq=i) for i in range(n)]


def test_batch_subscribers_get_lists_the_others_events_one_by_one() -> None:
    subs = Subscribers()
    lists: list[Any] = []
    single: list[Any] = []
    subs.add(lists.append, batch=True)
    subs.add(single.append)
    batch = _events(3)
    subs.deliver(batch, lambda cb, exc: None)
    assert lists == [batch] and single == batch


def test_an_error_is_reported_and_delivery_goes_on() -> None:
    subs = Subscribers()
    errors: list[tuple[object, Exception]] = []
    got: list[Any] = []

    def bad(e: Any) -> None:
        raise ValueError(e.seq)

    subs.add(bad)
    subs.add(got.append)
    subs.deliver(_events(2), lambda cb, exc: errors.append((cb, exc)))
    assert [(cb, str(exc)) for cb, exc in errors] == [(bad, "0"), (bad, "1")]
    assert len(got) == 2


def test_unsubscribe_removes_its_own_subscription_once() -> None:
    subs = Subscribers()
    got: list[Any] = []
    first = subs.add(got.append)
    subs.add(got.append)  # the same callback twice: two subscriptions
    snapshot = subs.current
    first()
    first()  # again: nothing more is removed
    subs.deliver(_events(1), lambda cb, exc: None)
    assert len(got) == 1 and len(snapshot) == 2  # a snapshot never changes


def test_close_tells_the_subscribers_waiting_for_the_end() -> None:
    subs = Subscribers()
    ended: list[str] = []
    subs.add(lambda e: None)
    subs.add(lambda e: None, batch=True, on_close=lambda: ended.append("end"))
    subs.close()
    assert ended == ["end"]


def test_the_owner_s_lock_guards_adding_and_removing() -> None:
    lock = threading.RLock()
    subs = Subscribers(lock)
    with lock:  # re-entrant: a Session subscribes under its own lock
        unsubscribe = subs.add(lambda e: None)
    done = threading.Event()

    def remove() -> None:
        unsubscribe()
        done.set()

    with lock:  # a delivery holds it: removing waits until it is over
        t = threading.Thread(target=remove)
        t.start()
        assert not done.wait(0.1)
        assert len(subs.current) == 1
    t.join(5)
    assert done.is_set() and subs.current == ()
