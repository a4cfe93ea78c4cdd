"""A TraceView's live run (a `ddpviz.Run` still running, a `Session`) as the kernel sends it:
one `.ddpviz` file kept in memory, to which only frames are ever appended (`LiveFile`), and
the pace of its sends (`Pace`): new events at most EVENTS_HZ times a second, diagnose() at a
slower rate it can afford. trace_view.py runs the thread that uses them; the front end
(extension/src/liveTrace.ts) appends the same frames to its parsed trace.
See [Note: a live view's wire].
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from ddpviz.events import SCHEMA_VERSION, Event
from ddpviz.traces.columns import Table
from ddpviz.traces.fileformat import (
    CLOCK,
    EVENTS,
    FORMAT_VERSION,
    FRAME,
    HEADER,
    MAGIC,
    Clock,
    FileHeader,
)
from ddpviz.traces.source import RunSource
from ddpviz.traces.view_bytes import TraceViewError

# [Note: a live view's wire]
# A TraceView of a live run keeps what it sent as one append-only `.ddpviz` file (LiveFile):
# the run when the view was made (its `trace` trait), then, at most EVENTS_HZ times a second,
# the events received since the last send as new EVENTS frames (and a CLOCK frame per rank
# whose clock offset changed), sent as an anywidget custom message: JSON content
#   {"kind": "frames", "base": events before, "total": events after}
# and one binary buffer holding just those frames, never markup, never the run again. The
# front end appends them to its parsed trace when `base` is what it holds (liveTrace.ts). A
# view that lacks frames (a page reloaded: it starts from the `trace` trait, or it missed a
# message) sees `events_sent` above what it holds and asks {"kind": "hello", "id": ...}; the
# kernel answers that view alone with {"kind": "whole", "to": id, "total": n} and the whole
# file so far. A kernel busy with a cell reads no message from the browser: the answer comes
# when the cell ends (a second view in the same page needs none: views of one model share
# what it received). diagnose()'s findings are a trait (`diagnosis`), replaced at the slower
# pace; `live` says "running" until the source ends, then how it ended, after the final
# frames and findings.

EVENTS_HZ = 2.0  # sends of new events a second, at most
DIAGNOSE_EVERY_S = 2.0  # diagnose() of a live run at most this often...
DIAGNOSE_SHARE = 0.05  # ...and at most this share of the time (a slow one waits longer)
# The bucket advisor's share of a live view's time (its answer changes slowly, and it costs
# ~10x diagnose(): 64 ranks, 530k events, ~1.4 s): with DIAGNOSE_SHARE and the sends, a
# followed 64-rank run costs the kernel ~5% of a core (benchmarks/bench_live_view.py)
ADVISE_SHARE = 0.02
MAX_DELTA_BYTES = 8 << 20  # the most one send of new events may carry
CHUNK = 8192  # events per frame

_encode = msgspec.msgpack.Encoder().encode


def frame(kind: int, obj: object) -> bytes:
    """One frame of the `.ddpviz` format: kind, length, crc32, msgpack payload."""
    payload = _encode(obj)
    return FRAME.pack(kind, len(payload), zlib.crc32(payload)) + payload


class Refused(TraceViewError):
    """New events that would go over a bound; the message says which and what to use."""


class LiveFile:
    """The `.ddpviz` file a live view has been sent so far: magic, header, frames appended.

    Args:
        meta: the run's metadata (the header's).
        tables: each rank's events so far (a snapshot: `Trace.columns()`).
        clock: the ranks' clock offsets so far.
    """

    def __init__(self, meta: Mapping[str, Any], tables: Mapping[int, Table],
                 clock: Mapping[int, tuple[int, int]]) -> None:
        self.data = bytearray(MAGIC)
        self.data += frame(HEADER, FileHeader(FORMAT_VERSION, SCHEMA_VERSION, dict(meta)))
        self.total = 0  # events in the file
        self.clock: dict[int, tuple[int, int]] = {}
        first = self.frames((e for t in tables.values() for e in t.events()), clock)
        self.commit(first)

    def frames(self, events: Iterable[Event], clock: Mapping[int, tuple[int, int]]
               ) -> tuple[bytes, int, dict[int, tuple[int, int]]]:
        """The frames that would add `events` and the clock offsets that changed, not yet
        appended (`commit` appends them): (bytes, events, the clock they leave)."""
        changed = {r: c for r, c in clock.items() if self.clock.get(r) != c}
        out = bytearray()
        for rank, (offset, error) in sorted(changed.items()):
            out += frame(CLOCK, Clock(rank, offset, error))
        batch = events if isinstance(events, list) else list(events)
        for i in range(0, len(batch), CHUNK):
            out += frame(EVENTS, batch[i:i + CHUNK])
        return bytes(out), len(batch), {**self.clock, **changed}

    def commit(self, new: tuple[bytes, int, dict[int, tuple[int, int]]]) -> None:
        """Append frames made by `frames`."""
        data, n, clock = new
        self.data += data
        self.total += n
        self.clock = clock


def status_of(run: RunSource) -> str:
    """A live source's state: "running"; else how it ended (a Run's `status`: "finished",
    "failed", ...; a Session's "closed")."""
    if run.running:
        return "running"
    return str(run.live.status) if run.kind == "run" else "closed"


def live_status(run: RunSource, status: str | None = None) -> dict[str, Any]:
    """What only the kernel knows of a live source, for the view's status line (TraceView's
    `status` trait; extension/src/replay.ts draws it): the source's label, its state
    (`status`, else `status_of`), the world size (a Run's; None: the view reads it from the
    events), ranks connected (sent events) and finished (said goodbye), and the events dropped
    (EventsDropped markers), messages rejected and events lost (sequence gaps) the collector
    counted. Bounded: counts and a short label, whatever the world size."""
    session = run.live.session if run.kind == "run" else run.live
    stats = getattr(session, "stats", None)  # (None: a stand-in session without a collector)
    if run.kind == "run":
        label = f"ddpviz.launch: {run.live.nprocs} ranks ({run.live.backend})"
        world: int | None = int(run.live.nprocs)
    else:
        label = f"session {getattr(getattr(session, 'collector', None), 'address', '')}"
        world = None
    out: dict[str, Any] = {"label": label[:200], "run_status": status or status_of(run),
                           "world": world}
    if stats is not None:
        out.update(connected=len(stats.received), finished=len(stats.closed),
                   dropped=sum(stats.dropped.values()), rejected=stats.total_rejected,
                   lost=sum(stats.gaps.values()))
    return out


class Pace:
    """When diagnose() (or the advisor) may run again: not before DIAGNOSE_EVERY_S after the
    last, nor before it has been idle 1/share times as long as it took (with DIAGNOSE_SHARE, a
    run whose diagnose() takes 1 s is diagnosed every 20 s)."""

    def __init__(self, share: float = DIAGNOSE_SHARE) -> None:
        self.share = share
        self.next = time.monotonic() + DIAGNOSE_EVERY_S
        self.took: list[float] = []  # seconds each diagnose() took (the last 100)

    def due(self) -> bool:
        return time.monotonic() >= self.next

    def ran(self, started: float) -> None:
        """Record a diagnose() that began at monotonic time `started` and ended now."""
        now = time.monotonic()
        self.took = [*self.took[-99:], now - started]
        self.next = now + max(DIAGNOSE_EVERY_S, (now - started) / self.share)
