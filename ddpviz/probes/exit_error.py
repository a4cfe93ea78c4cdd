"""A rank that dies of an uncaught exception says so itself: its type, message and where it was
raised (the innermost frame of the user's code), at which DDP step, as a `rank_exited` error
finding in its own events, before the interpreter exits. Its peers only see a connection
close (or are stopped by the launcher first); the rank that raised knows the cause.

[Note: a rank's own exception]
Python runs `sys.excepthook` for an uncaught exception before the traceback prints and before
the exit handlers run (the sender writes the rank's file in one of those), so the finding
emitted there reaches the trace. Exceptions that are another rank's failure seen from here
(the backend's closed or timed-out connection) and ddpviz's own errors (a hang or mismatch,
already a finding of its own) are not this rank's cause and are not reported as one.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import weakref
from types import TracebackType
from typing import Any, Protocol

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import Finding, fix_for
from ddpviz.probes import stack_text as st

MAX_MESSAGE = 300  # characters of the exception's message kept


class _Watched(Protocol):
    tap: Tap
    rank: int
    world_size: int
    step: int


_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False
_reported = False


def peer_error(exc: BaseException) -> bool:
    """Is `exc` another rank's failure seen from this one (the backend's connection closed,
    reset or timed out), or ddpviz's own finding raised (See [Note: a rank's own exception])?"""
    from ddpviz.errors import DiagnosisError

    if isinstance(exc, DiagnosisError):
        return True
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer",
                                   "Timed out waiting", "Application timeout caused pair closure",
                                   "collective operation timeout"))


def raised_where(tb: TracebackType | None) -> tuple[str, tuple[str, ...]]:
    """Where an exception was raised: 'train.py:36 in next_batch' (the innermost frame of the
    user's code; the innermost frame when none is the user's) and its folded stack lines."""
    frames = [st.Frame(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]
    if not frames:
        return "", ()
    inner_first = frames[::-1]
    user = next((f for f in inner_first if st.owner(f.file) is None), inner_first[0])
    return st.where(user), tuple(st.stack_lines(inner_first, source=False))


def finding_for(exc: BaseException, tb: TracebackType | None, rank: int, step: int,
                world_size: int) -> Finding:
    """The rank_exited finding of `rank`, which died of `exc` at DDP step `step`."""
    name = type(exc).__qualname__
    message = st.clip(" ".join(str(exc).split()), MAX_MESSAGE)
    where, stack = raised_where(tb)
    at = f"after step {step}" if step >= 0 else "before its first step"
    said = f"{name}: {message}" if message else name
    title = f"rank {rank} exited on an uncaught exception {at}: {said}"
    if where:
        title += f" (raised at {where})"
    return Finding(
        kind="rank_exited", severity="error", title=title, ranks=(rank,), name=name,
        field="exception", step=step,
        values=((f"exited on {said}" + (f" at {where}" if where else ""), (rank,)),),
        detail=(f"rank {rank}'s traceback (most recent call last):",
                *(f"  {line}" for line in stack)),
        fix=fix_for("rank_exited", "exception", rank=rank), world_size=world_size)


def watch(owner: _Watched) -> None:
    """Report `owner`'s rank's uncaught exception through `owner.tap` (its `rank`, `step`,
    `world_size` read then); kept weakly, hooked once per process."""
    global _hooked
    with _lock:
        _watched.add(owner)
        if _hooked:
            return
        _hooked = True
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException,
                   tb: TracebackType | None) -> None:
        try:
            report(exc, tb)
        finally:
            previous(kind, exc, tb)

    sys.excepthook = excepthook


def report(exc: BaseException, tb: TracebackType | None) -> None:
    """Emit the finding on every watched DDP's tap (once per process; never raises)."""
    global _reported
    if _reported or peer_error(exc) or not isinstance(exc, Exception):
        return  # (KeyboardInterrupt, SystemExit: the user stopped it)
    _reported = True
    for owner in list(_watched):
        try:
            tap = owner.tap
            if not tap.enabled:
                continue
            finding = finding_for(exc, tb, owner.rank, owner.step, owner.world_size)
            tap.emit_as(owner.step, time.monotonic_ns(), FindingReported, finding)
            tap.flush()
        except Exception:  # never in the way of the traceback
            continue
