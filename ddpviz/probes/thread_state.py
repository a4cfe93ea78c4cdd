"""What the kernel says about a thread of another process on this host, read from /proc without
new privileges: its state, the kernel function it sleeps in and its system call. This is all
of a stuck thread's native side that ddpviz can have; See [Note: native frames] for what each
read needs and costs, and what would need more.

[Note: native frames]
A rank whose training thread holds the GIL in C code shows its Python stack through faulthandler
(stuck_stack.py). Below the innermost Python frame is C, and C frames need another process to
read the stuck one's memory (ptrace: py-spy dump --native, gdb, eu-stack; or
process_vm_readv), which needs CAP_SYS_PTRACE, or the same user with Yama's ptrace_scope at 0
(Ubuntu's default is 1: only an ancestor may attach), or code of ddpviz's own running in the
stuck process's signal handler (an unwinder in C: ddpviz ships no compiled code; Python 3.14's
faulthandler.dump_c_stack() needs the GIL). Neither is asked for. What the same user reads from
/proc/PID/task/TID/ without them, each a small file read (about 10-30 us):
- `stat`: the thread's state (R on a CPU or waiting for one, S sleeping, D in uninterruptible I/O, T
  stopped): always readable;
- `wchan`: the kernel function a sleeping thread waits in (`futex_do_wait`,
  `hrtimer_nanosleep`, `do_epoll_wait`, ...): needs ptrace *read* access, which the same user
  has whatever Yama's setting ("0" otherwise, and on kernels built without symbols);
- `syscall`: the system call it is in ("running" when it is in none): needs ptrace *attach*
  access, so with Yama's ptrace_scope at 1 or more it is readable from an ancestor only (not
  from a peer rank), and ddpviz goes without it;
- `schedstat`: the time it spent on a CPU: always readable.
/proc/PID/task/TID/stack (the kernel-side stack) needs root. A thread waiting for the GIL waits
in a futex; one that holds it in C code runs, or sleeps in another call (the planted `sleep()`
of the tests: `hrtimer_nanosleep`, clock_nanosleep).
"""

from __future__ import annotations

import os
import platform
import socket
from typing import NamedTuple

# System calls worth naming (blocking ones), by number, for the two architectures torch ships on.
_X86_64 = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 17: "pread64", 18: "pwrite64",
           19: "readv", 20: "writev", 23: "select", 24: "sched_yield", 34: "pause",
           35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom",
           46: "sendmsg", 47: "recvmsg", 61: "wait4", 74: "fsync", 202: "futex",
           230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat",
           270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 299: "recvmmsg",
           441: "epoll_pwait2", 449: "futex_waitv"}
_AARCH64 = {22: "epoll_pwait", 29: "ioctl", 56: "openat", 63: "read", 64: "write",
            65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64", 72: "pselect6",
            73: "ppoll", 82: "fsync", 95: "waitid", 98: "futex", 101: "nanosleep",
            115: "clock_nanosleep", 124: "sched_yield", 202: "accept", 203: "connect",
            206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4",
            243: "recvmmsg", 260: "wait4", 441: "epoll_pwait2", 449: "futex_waitv"}
SYSCALLS = {"x86_64": _X86_64, "aarch64": _AARCH64}.get(platform.machine(), {})

_STATES = {"R": "on a CPU or waiting for one", "S": "sleeping", "D": "in uninterruptible I/O",
           "T": "stopped", "t": "stopped by a tracer", "Z": "a zombie", "X": "dead",
           "I": "idle"}
NOT_IN_A_SYSCALL = -1


class ThreadState(NamedTuple):
    """One thread's kernel-side state ("" / None where unreadable)."""

    state: str  # the letter of /proc/.../stat ("R", "S", "D", ...)
    wchan: str  # the kernel function it sleeps in ("" unknown)
    syscall: int | None  # its system call's number, NOT_IN_A_SYSCALL, or None (unreadable)

    @property
    def waits_on_futex(self) -> bool:
        """Asleep on a lock (the GIL, a condition variable): a futex wait."""
        if self.state not in ("S", "D"):
            return False
        return "futex" in self.wchan or SYSCALLS.get(self.syscall or -2, "").startswith("futex")

    @property
    def asleep_elsewhere(self) -> bool:
        """Asleep on something else than a futex (I/O, a sleep, a socket). A state read as
        asleep with neither a kernel function nor a system call is not: the thread woke between
        the reads."""
        if self.state not in ("S", "D") or self.waits_on_futex:
            return False
        return bool(self.wchan) or (self.syscall is not None and self.syscall >= 0)

    def describe(self) -> str:
        """"sleeping (S) in the kernel's hrtimer_nanosleep, system call clock_nanosleep"."""
        text = f"{_STATES.get(self.state, 'in state')} ({self.state})"
        if self.wchan and self.state != "R":
            text += f" in the kernel's {self.wchan}"
        if self.syscall is not None and self.syscall >= 0:
            text += f", system call {SYSCALLS.get(self.syscall, str(self.syscall))}"
        elif self.syscall == NOT_IN_A_SYSCALL:
            text += ", in no system call (in user-space code)"
        return text


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None


def thread_state(pid: int, tid: int) -> ThreadState | None:
    """Thread `tid` of process `pid` (None: no such thread, or /proc unreadable)."""
    base = f"/proc/{pid}/task/{tid}"
    stat = _read(f"{base}/stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    wchan = (_read(f"{base}/wchan") or "").strip()
    syscall: int | None = None
    text = _read(f"{base}/syscall")
    if text is not None:
        first = text.split(" ", 1)[0].strip()
        if first == "running":
            syscall = NOT_IN_A_SYSCALL
        else:
            try:
                syscall = int(first)
            except ValueError:
                syscall = None
    return ThreadState(fields[0] if fields else "?", "" if wchan == "0" else wchan, syscall)


def cpu_ns(pid: int, tid: int) -> int | None:
    """Nanoseconds thread `tid` of process `pid` has spent on a CPU (/proc's schedstat, no
    privilege needed), or None: a thread waiting for the GIL spends next to none."""
    text = _read(f"/proc/{pid}/task/{tid}/schedstat")
    try:
        return int(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot; "" when unreadable): with the pid, it
    names one process (a pid is recycled, a start time with it is not)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None or ")" not in stat:
        return ""
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else ""


def host_key() -> str:
    """Which host and pid namespace this process runs in: two processes with the same key can
    signal each other by pid and read each other's /proc."""
    boot = (_read("/proc/sys/kernel/random/boot_id") or "").strip()
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return f"{socket.gethostname()} {boot} {pidns}"


def signal_masks(pid: int) -> tuple[int, int]:
    """(caught, ignored) signal masks of process `pid` (bit n-1 for signal n), from /proc: a C
    library's handler counts as caught, not only Python's. (0, 0) when unreadable."""
    text = _read(f"/proc/{pid}/status", 1 << 16) or ""
    masks = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigCgt", "SigIgn"):
            try:
                masks[key] = int(value.strip(), 16)
            except ValueError:
                masks[key] = 0
    return masks.get("SigCgt", 0), masks.get("SigIgn", 0)
