"""The kernel side of launched ranks' events: which `Session` they stream into, and waiting until
every event a rank says it shipped has arrived (so a finished run or cell has all its events).

Each rank runs `ddpviz.connect()` with DDPVIZ_CONNECT pointing at the session's collector; after
a flush it reports its running total of shipped events over the private pipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddpviz.session.live import Session

_SETTLE_S = 5.0  # longest wait for shipped events to be received


class EventStream:
    """Args:
        session: stream into this session (e.g. from `ddpviz.listen()`, shared by several
            runs); None makes a private one on loopback, closed by `close()`.
    """

    def __init__(self, session: Session | None) -> None:
        from ddpviz.session.connect import ENV_CONNECT
        from ddpviz.session.live import Session
        from ddpviz.transport.collector import Collector

        self.owned = session is None
        self.session = Session(Collector()) if session is None else session
        self.env = {ENV_CONNECT: self.session.connect_string}
        self._base = dict(self.session.stats.received)
        self._shipped: dict[int, int] = {}

    def shipped(self, rank: int, total: int) -> None:
        """Rank `rank` has shipped `total` events since it connected."""
        self._shipped[rank] = total

    def settle(self, timeout: float = _SETTLE_S) -> bool:
        """Wait until every shipped event was received; False if some are still missing."""
        base, shipped = self._base, dict(self._shipped)
        return self.session.collector.wait(
            lambda stats: all(stats.received.get(r, 0) - base.get(r, 0) >= n
                              for r, n in shipped.items()), timeout)

    def close(self) -> None:
        if self.owned:
            self.session.close()
