"""Holding a kernel interrupt back while a short section must not be cut in half.

A KeyboardInterrupt can land between any two bytecodes of the main thread. Inside
`subprocess.Popen` after the fork it leaves a rank nobody knows the pid of; inside the first
import of a C extension it leaves the extension half-initialised (the next import segfaults);
inside the set-up or close of a zmq socket served by another thread it leaves a socket that a
later garbage collection closes under that thread's poll (a hang in `term()`, or a crash).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a kernel interrupt (SIGINT) back until the block is done, then raise it.

    For short sections that must not be cut in half: a KeyboardInterrupt inside
    `subprocess.Popen` after the fork would leave a rank nobody knows the pid of, and one
    inside `stop_ranks` would leave ranks running. Only the main thread can install signal
    handlers; elsewhere the block runs as is (interrupts only reach the main thread anyway).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)  # the kernel's own handler: KeyboardInterrupt
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt
