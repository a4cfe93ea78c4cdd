"""Throttle: coalesce "something changed" signals from any thread into at most N redraws/s.

Events arrive on the collector's thread in bursts of thousands; redrawing per event would cost
the kernel and flood the browser. `request()` only marks the widget dirty (cheap, any thread);
one daemon thread per throttle runs the redraw when dirty, never sooner than 1/max_hz after the
previous one. A redraw may return True ("more to do later", e.g. a part held back to keep the
bytes per second down): the throttle then asks again itself. Redraw errors are counted and the
first is kept (`errors`, `first_error`); a background thread must never print into a cell.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

Redraw = Callable[[], "bool | None"]


class Throttle:
    """Args:
        redraw: called with no arguments; returns True if it deferred something.
        max_hz: redraws per second at most (10 by default).
    """

    def __init__(self, redraw: Redraw, max_hz: float = 10.0, *,
                 name: str = "ddpviz-redraw") -> None:
        if not max_hz > 0:
            raise ValueError(f"ddpviz: max_hz must be > 0, got {max_hz!r}.\n"
                             "Pass a rate in redraws per second, e.g. max_hz=10.")
        self._redraw = redraw
        self.interval = 1.0 / max_hz
        self._cond = threading.Condition()
        self._run_lock = threading.RLock()  # a redraw runs in one thread at a time
        self._dirty = False
        self._closed = False
        self._last = 0.0
        self._thread: threading.Thread | None = None
        self._name = name
        self.redraws = 0
        self.times: deque[float] = deque(maxlen=10_000)  # monotonic time of each redraw
        self.errors = 0
        self.first_error: BaseException | None = None

    def request(self) -> None:
        """Ask for a redraw soon (cheap; from any thread)."""
        with self._cond:
            if self._closed:
                return
            self._dirty = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self) -> None:
        """Redraw now in this thread (if anything is pending), not waiting for the timer."""
        with self._cond:
            if not self._dirty:
                return
            self._dirty = False
        self._run()

    def run_now(self) -> None:
        """Redraw now in this thread, pending or not (e.g. after a slider moved)."""
        with self._cond:
            self._dirty = False
        self._run()

    @property
    def pending(self) -> bool:
        with self._cond:
            return self._dirty

    def close(self) -> None:
        """Stop the thread; later requests are ignored."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def _run(self) -> None:
        with self._run_lock:
            again = False
            try:
                again = bool(self._redraw())
            except Exception as exc:  # a redraw must never kill the thread or reach a cell
                self.errors += 1
                if self.first_error is None:
                    self.first_error = exc
            now = time.monotonic()
            with self._cond:
                self._last = now
                self.redraws += 1
                self.times.append(now)
                if again:
                    self._dirty = True
                    self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                wait = self._last + self.interval - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue  # re-check: closed, flushed meanwhile, or time is up
                self._dirty = False
            self._run()
