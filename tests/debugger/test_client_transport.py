"""The Debugger over the real control path: a listen() Session's Collector signs commands to
ranks' Senders (CURVE + HMAC with the session secret), simulated ranks answer through the same
Senders, and the Debugger matches the answers by request number; a silent rank is named."""

from __future__ import annotations

import itertools
import queue
import threading

import msgspec
import numpy as np
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.debugger.client import DebuggerTimeout
from ddpviz.transport.sender import Sender
from tests.debugger.fake_ranks import FakeRank, bucket_assigned, params_built


class WiredRank:
    """A FakeRank behind a real Sender: commands in through on_control, answers out."""

    def __init__(self, connect: str, rank: FakeRank) -> None:
        self.rank = rank
        self.sender = Sender(connect, rank.rank)
        self.seq = itertools.count()
        self.inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.sender.on_control(self.inbox.put)  # never blocks the shipping thread
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def emit(self, e: ev.Event) -> None:
        self.sender(msgspec.structs.replace(e, seq=next(self.seq)))

    def _serve(self) -> None:
        while (commands := self.inbox.get()) is not None:
            for c in commands:  # type: ignore[attr-defined]
                for e in self.rank.handle(c):
                    self.emit(e)

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(5)
        self.sender.close()


def test_pause_inspect_resume_through_the_collector() -> None:
    session = ddpviz.listen(show=False)
    names, shapes = ["a.weight", "a.bias"], [(4, 3), (4,)]
    wired = []
    try:
        for r in range(2):
            a = np.arange(12, dtype=np.float32).reshape(4, 3) + (r == 1) * np.eye(4, 3,
                                                                                  dtype=np.float32)
            fr = FakeRank(r, {("a.weight", "grad"): a, ("a.bias", "grad"): np.zeros(4,
                                                                                   np.float32)})
            wr = WiredRank(session.connect_string, fr)
            wr.emit(params_built(r, names, shapes))
            wr.emit(bucket_assigned(r, -1, ((1, 0),)))
            assert wr.sender.flush(10)
            wired.append(wr)
        assert session.wait(events=4, timeout=10)
        dbg = session.debugger
        assert session.debugger is dbg  # one per session
        dbg.pause()
        stop = dbg.wait(timeout=10)
        assert stop.agreed and stop.step == 3 and sorted(stop.ranks) == [0, 1]
        values = dbg.inspect("a.weight", "grad", timeout=10)
        assert [g.ranks for g in values.comparison.groups] == [(1,), (0,)]
        assert values.difference is not None and values.difference.position == (0, 0)
        assert values.difference.values == {0: 0.0, 1: 1.0}
        assert dbg.inspect("a.bias", "grad", timeout=10).all_equal
        # every command and reply is in the trace too
        kinds = {type(e).__name__ for e in session.trace.events()}
        assert {"Parked", "Inspected", "Fetched"} <= kinds
        wired[1].rank.silent.add("RunCode")
        with pytest.raises(DebuggerTimeout) as err:
            dbg.run("1 + 1", timeout=1)
        assert err.value.ranks == (1,)
        dbg.resume(timeout=10)
        assert dbg.stop is None
    finally:
        for wr in wired:
            wr.close()
        session.close()
