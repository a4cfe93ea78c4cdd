"""Count what widgets send to the browser: every comm message (open with the full state,
updates), as the JSON text plus binary buffers a kernel would put on the wire. Used by the
dashboard tests and benchmarks/bench_widgets.py."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import comm
from comm.base_comm import BaseComm


class WireCounter:
    """`with WireCounter() as wire:` every widget created inside gets a recording comm;
    `wire.total` bytes so far, `wire.messages` [(monotonic s, comm_id, msg_type, bytes)]."""

    def __init__(self) -> None:
        self.messages: list[tuple[float, str, str, int]] = []
        self._lock = threading.Lock()
        self._previous: Any = None

    def __enter__(self) -> WireCounter:
        counter = self

        class RecordingComm(BaseComm):
            def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None,
                            buffers: Any = None, **keys: Any) -> None:
                size = len(json.dumps(data, default=str, separators=(",", ":")))
                size += sum(len(memoryview(b).cast("B")) for b in buffers or ())
                with counter._lock:
                    counter.messages.append((time.monotonic(), self.comm_id, msg_type, size))

        self._previous = comm.create_comm
        comm.create_comm = lambda *a, **k: RecordingComm(*a, **k)
        return self

    def __exit__(self, *exc: object) -> None:
        comm.create_comm = self._previous

    @property
    def total(self) -> int:
        with self._lock:
            return sum(m[3] for m in self.messages)

    def since(self, t: float) -> int:
        """Bytes sent at or after monotonic time t."""
        with self._lock:
            return sum(m[3] for m in self.messages if m[0] >= t)

    def largest(self, n: int = 3) -> list[int]:
        with self._lock:
            return sorted((m[3] for m in self.messages), reverse=True)[:n]
