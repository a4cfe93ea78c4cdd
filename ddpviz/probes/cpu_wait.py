"""How long this process's main thread has waited for a CPU: the kernel's run-queue delay, read
from /proc (Linux), for the straggler verdict. See [Note: waiting for a CPU].
"""

from __future__ import annotations

import contextlib
import os

# [Note: waiting for a CPU]
# A rank whose host is oversubscribed (a CPU hog beside it, more DataLoader workers or OpenMP
# threads than cores, another job) is slower every step though its code does the same work as
# the others'. The kernel counts, per thread, the time it was runnable but not running (the
# second number of /proc/<pid>/task/<tid>/schedstat, ns; a thread asleep in a sleep, a wait on
# a socket or a lock is not runnable and does not count). Each BackwardComputed carries the
# main thread's cumulative count (`cpu_wait_ns`; the thread that runs the forward, the
# backward on CPU, the optimizer step and the data loading in a plain loop), so the straggler
# verdict can say how much of a rank's lateness was time spent waiting for a CPU rather than
# the job's own work. One pread of a few dozen bytes a step (~2.5 us measured here); -1 where
# the file is missing (not Linux, no schedstat in the kernel) or unreadable.

UNKNOWN = -1
_MAX_BYTES = 128  # three decimal numbers and a newline


class CpuWait:
    """Reads the main thread's run-queue delay; reopens the file after a fork."""

    __slots__ = ("_fd", "_pid")

    def __init__(self) -> None:
        self._fd = -1
        self._pid = -1

    def read(self) -> int:
        """The main thread's cumulative run-queue delay in ns, or UNKNOWN."""
        pid = os.getpid()
        try:
            if pid != self._pid:
                self.close()
                self._pid = pid
                self._fd = os.open(f"/proc/{pid}/task/{pid}/schedstat", os.O_RDONLY)
            if self._fd < 0:
                return UNKNOWN
            return parse(os.pread(self._fd, _MAX_BYTES, 0))
        except OSError:
            self.close()
            self._pid = pid  # (missing here: not asked again in this process)
            return UNKNOWN

    def close(self) -> None:
        """Close the file (opened again at the next read)."""
        fd, self._fd, self._pid = self._fd, -1, -1
        if fd >= 0:  # (after a fork, the child's copy of the parent's)
            with contextlib.suppress(OSError):
                os.close(fd)


def parse(data: bytes) -> int:
    """The run-queue delay (the second field) of a schedstat line, or UNKNOWN."""
    fields = data[:_MAX_BYTES].split()
    if len(fields) < 2 or not fields[1].isdigit() or len(fields[1]) > 19:
        return UNKNOWN
    return int(fields[1])
