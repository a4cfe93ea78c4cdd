"""A rank's Python stack when none of its Python threads can run: its training thread holds the
GIL in C code, so its pulse thread cannot answer a stack request (whereabouts.py). A peer on
the same host signals that pulse thread, faulthandler dumps every thread without the GIL, and
the peer reads the dump. See [Note: stacks without the GIL].

[Note: stacks without the GIL]
Each rank's pulse thread (pulse.py) posts a `Contact` on the DDP's notice board once: its host,
pid, the real-time signal faulthandler is registered on in this process (`arm`, once per
process, on the training thread), the dump file, its own native thread id and the training
thread's ids. It also stamps the time into a small mapped file at each wake (every 0.05-0.5 s;
0.2-0.4 us). A waiting rank that got no answer (whereabouts.hang_detail) reads the contact and, on
the same host and pid namespace, checks that the pid is still that process (its start time)
and that the signal is still caught there (/proc/PID/status), then sends the signal to the
*pulse thread* with tgkill: a signal sent to the process would go to its main thread, and a C
call that sleeps there (`sleep()`, `poll()`) would return early with EINTR, changing the job.
faulthandler's handler writes every thread's Python stack to the file (async-signal-safe, no
GIL); the waiting rank picks the training thread's by its thread id, folds it as every stack
(stack_text.py) and adds what the kernel says about the thread (thread_state.py: See [Note:
native frames]), sampled while the dump is written. The stamp's age says how long ddpviz's
thread there has not run; with that thread asleep on futexes only (or runnable but using next
to no CPU: a thread waiting for the GIL wakes every 5 ms to ask for it) and the training thread
never on one, the training thread is the one holding the GIL in C code (`Rescue.holds_gil`).

Why not `faulthandler.dump_traceback_later` re-armed by the pulse thread (a dead man's switch
needing no peer)? There is one such timer per process and no way to ask whether the job armed
one (pytest's faulthandler_timeout, a framework's hang dump): arming ddpviz's would cancel
the job's. Each re-arm also joins and starts a C thread (27 us, twice a second), and a rank
merely starved of CPU would dump. The signal costs nothing until a hang, and only a rank that
did not answer gets one.

Never changing the job: the signal is the highest real-time signal that nothing in the process
catches, ignores or blocks (a C library's handler counts: /proc's SigCgt, not only Python's
table); `chain=False`, as there is no previous handler to chain to (chaining to the default
action of a real-time signal would end the process), which also keeps SA_RESTART, so a system
call the signal interrupts restarts. faulthandler.enable(), the job's own registrations and its
dump_traceback_later are left alone. faulthandler allocates its alternate signal stack on the
thread that registers first; ddpviz registers only from the main thread, or when the job's
faulthandler is enabled already, so the job's own enable() finds that stack where it would
have put it (else ddpviz steps aside and says so once). If the job installs a Python handler
on that signal later, the pulse thread sees it at its next look and withdraws the contact.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import mmap
import os
import platform
import signal
import stat
import struct
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Annotated, Any, NamedTuple

import msgspec

from ddpviz.limits import Name, Pid, Text
from ddpviz.private_dir import PrivateDir
from ddpviz.probes import stack_text as st
from ddpviz.probes import thread_state as ts

if TYPE_CHECKING:
    from ddpviz.probes.rendezvous import Board

SETTLE_S = 1.0  # longest wait for faulthandler's dumps to be written
_QUIET_S = 0.05  # a dump is complete once its file stopped growing this long
STALE_S = 1.5  # the pulse thread wakes every 0.5 s: a stamp this old means it could not
MAX_DUMP = 1 << 20  # bytes of a dump read back (faulthandler: 100 threads of 100 frames at most)
MAX_CONTACT = 8192  # bytes of a posted contact read back
_SAMPLES = 32  # states of each thread read while its dump is written
_WINDOW_S = 0.2  # ... for at least this long, unless the pulse thread was seen asleep
_IDLE_CPU = 0.2  # a thread using less of a CPU than this does not run Python
KEY = "stuck"  # the board's key of each rank's contact
_EXITED = "its process (pid {pid}) has exited"
_STAMP = struct.Struct("<d")

Signal = Annotated[int, msgspec.Meta(ge=0, le=128)]
ThreadId = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]


class Contact(msgspec.Struct, frozen=True, omit_defaults=True):
    """How a peer on the same host gets this rank's stacks without its GIL (posted once)."""

    host: Name  # thread_state.host_key(): the same host and pid namespace
    pid: Pid
    start: Name  # the process's start time: a recycled pid is another process
    signal: Signal = 0  # faulthandler's signal (0: none; `why` says why)
    why: Text = ""  # why ddpviz stepped aside, or withdrew
    dump: Text = ""  # faulthandler's file
    stamp: Text = ""  # the pulse thread's stamp file (time.time() when it last woke)
    thread: ThreadId = 0  # the training thread's threading.get_ident() (faulthandler's id)
    tid: Pid = 0  # the training thread's native id
    pulse_tid: Pid = 0  # the pulse thread's native id: the signal goes there
    source: bool = True  # the stack may show source text (Recording.stack_source)


_decode = msgspec.json.Decoder(Contact).decode


# --- the stuck rank's side -----------------------------------------------------------------------


class _Armed(NamedTuple):
    signal: int
    dir: PrivateDir
    dump: IO[Any]  # kept open: faulthandler writes to its descriptor
    before: Any  # signal.getsignal() when armed: a change means the job took the signal


_armed: _Armed | None = None
_why = ""  # why this process stepped aside ("" armed, or not tried yet)
_lock = threading.Lock()


class _StepAside(Exception):
    pass


def arm() -> tuple[_Armed | None, str]:
    """Register faulthandler on a free real-time signal, once per process (call it on the
    training thread); returns (what was armed, or None with why not). Steps aside, saying so
    once on stderr, where it cannot do that without changing the job."""
    global _armed, _why
    with _lock:
        if _armed is None and not _why:
            try:
                _armed = _arm()
            except _StepAside as exc:
                _why = str(exc)
                print(f"ddpviz: rank stacks: {_why}; a rank whose training thread holds the GIL "
                      "in C code will be shown as not answering, without its stack.",
                      file=sys.stderr)
    return _armed, _why


def _arm() -> _Armed:
    if not sys.platform.startswith("linux") or not hasattr(faulthandler, "register"):
        raise _StepAside("not on Linux, so no faulthandler dump is taken from a peer")
    if threading.current_thread() is not threading.main_thread() \
            and not faulthandler.is_enabled():
        raise _StepAside("the training thread is not the main thread: registering faulthandler "
                         "from it would move the alternate stack the job's own "
                         "faulthandler.enable() puts on the main thread")
    sig = free_signal()
    if sig is None:
        raise _StepAside("every real-time signal is caught, ignored or blocked in this process, "
                         "and ddpviz takes none the job may use")
    try:
        where = PrivateDir()
        fd = os.open(where.file("faulthandler.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o600)
        dump = os.fdopen(fd, "a")
        before = signal.getsignal(sig)
        faulthandler.register(sig, file=dump, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as exc:
        raise _StepAside(f"faulthandler could not be registered ({exc})") from None
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # (not in a forked child)
            where.remove()

    atexit.register(remove)
    return _Armed(sig, where, dump, before)


def free_signal() -> int | None:
    """The highest real-time signal nothing in this process catches, ignores or blocks."""
    caught, ignored = ts.signal_masks(os.getpid())
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    for sig in range(signal.SIGRTMAX, signal.SIGRTMIN - 1, -1):
        bit = 1 << (sig - 1)
        if (caught | ignored) & bit or sig in blocked:
            continue
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            continue
        return sig
    return None


class Beacon:
    """One pulse thread's side: its contact, posted when the thread starts, and the stamp it
    writes at each wake. Made on the training thread (`thread_id` is its ident)."""

    def __init__(self, thread_id: int, *, source: bool = True) -> None:
        self.armed, why = arm()
        self.contact = Contact(
            ts.host_key(), os.getpid(), ts.start_time(os.getpid()),
            signal=self.armed.signal if self.armed else 0, why=why,
            dump=str(self.armed.dir.file("faulthandler.txt")) if self.armed else "",
            thread=thread_id, tid=threading.get_native_id(), source=source)
        self._stamp: mmap.mmap | None = None
        self._withdrawn = False

    def started(self, board: Board) -> None:
        """On the pulse thread, once: make the stamp, post the contact (a store error
        propagates, as any of the pulse thread's)."""
        tid = threading.get_native_id()
        contact = msgspec.structs.replace(self.contact, pulse_tid=tid)
        if self.armed is not None:
            path = self.armed.dir.file(f"pulse-{tid}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.ftruncate(fd, _STAMP.size)
                    self._stamp = mmap.mmap(fd, _STAMP.size)
                finally:
                    os.close(fd)
                contact = msgspec.structs.replace(contact, stamp=str(path))
            except OSError:
                self._stamp = None
            self.stamp()
        self.contact = contact
        board.post(KEY, msgspec.json.encode(contact).decode())

    def stamp(self) -> None:
        """The pulse thread woke (each loop; 0.4 us)."""
        stamp = self._stamp
        if stamp is not None:
            _STAMP.pack_into(stamp, 0, time.time())

    def check(self, board: Board) -> None:
        """Every CHECK_S: has the job installed a handler of its own on the signal since? Then
        withdraw the contact (a peer's signal would run the job's handler), saying so once."""
        armed = self.armed
        if armed is None or self._withdrawn or signal.getsignal(armed.signal) == armed.before:
            return
        self._withdrawn = True
        why = (f"the job installed its own handler for signal {armed.signal}, which ddpviz "
               "had registered faulthandler on")
        print(f"ddpviz: rank stacks: {why}; ddpviz no longer signals this rank.",
              file=sys.stderr)
        self.contact = msgspec.structs.replace(self.contact, signal=0, why=why)
        board.post(KEY, msgspec.json.encode(self.contact).decode())

    def close(self) -> None:
        stamp, self._stamp = self._stamp, None
        if stamp is not None:
            with contextlib.suppress(OSError, ValueError):
                stamp.close()
                os.unlink(self.contact.stamp)


# --- the waiting rank's side ---------------------------------------------------------------------


class Rescue(NamedTuple):
    """What a peer got of a rank that did not answer."""

    stack: tuple[st.Frame, ...]  # its training thread's Python stack, innermost first; ()
    why: str  # why there is no stack ("" when there is)
    quiet_s: float | None  # how long its pulse thread has not run (None: unknown)
    pulse: tuple[ts.ThreadState, ...]  # the kernel's view of its pulse thread, sampled
    training: tuple[ts.ThreadState, ...]  # ... and of its training thread
    source: bool  # the stack may show source text
    pulse_cpu: float | None = None  # the share of a CPU its pulse thread used meanwhile
    gone: bool = False  # its process has exited (`why` says so)

    def not_dumped(self) -> str:
        """Why there is no stack, for "rank 1 did not post its stack within 2s (...)"."""
        guess = "busy in C code holding the GIL, or gone"
        if not self.why:
            return guess
        return self.why if self.gone else f"{guess}; {self.why}"

    def starved(self) -> bool:
        """No Python thread of it has run for long: its pulse thread, which wakes every 0.5 s,
        has not, and it is waiting for a lock (the GIL): asleep only on futexes, and seen so or
        (under load, where a thread waiting for the GIL, woken every 5 ms to ask for it, is
        mostly runnable) using next to no CPU."""
        if self.quiet_s is None or self.quiet_s < STALE_S or not self.pulse:
            return False
        if any(s.state not in ("R", "S", "D") or s.asleep_elsewhere for s in self.pulse):
            return False  # asleep on something else (the store, a sleep), or stopped
        return any(s.waits_on_futex for s in self.pulse) or (
            self.pulse_cpu is not None and self.pulse_cpu < _IDLE_CPU)

    def holds_gil(self) -> bool:
        """Starved, and its training thread never waits on a lock (as a thread waiting for the
        GIL would): the training thread holds the GIL."""
        return (self.starved() and bool(self.training)
                and not any(s.waits_on_futex or s.state in ("T", "t", "Z", "X")
                            for s in self.training))

    def training_now(self) -> ts.ThreadState | None:
        """The training thread's state to show: the last sample asleep, else the last one."""
        asleep = [s for s in self.training if s.state in ("S", "D")]
        return asleep[-1] if asleep else self.training[-1] if self.training else None


def _none(why: str, *, gone: bool = False) -> Rescue:
    return Rescue((), why, None, (), (), True, gone=gone)


def rescue(board: Board, ranks: list[int]) -> dict[int, Rescue]:
    """Dump the stacks of `ranks` (which did not answer) through their faulthandler, where they
    run on this host. Raises RuntimeError when the store is gone; any other failure is said in
    each rank's `why`, never raised into the verdict."""
    contacts = board.posts(KEY, _decode, ranks, max_bytes=MAX_CONTACT)
    try:
        return rescue_contacts({r: contacts.get(r) for r in ranks})
    except Exception as exc:  # (a bug, or an unusual system): the verdict goes on without it
        return {r: _none(f"ddpviz's dump failed ({type(exc).__name__}: {exc})") for r in ranks}


def rescue_contacts(contacts: dict[int, Contact | None], *, settle: float = SETTLE_S
                    ) -> dict[int, Rescue]:
    """`rescue` for contacts already read (None: the rank posted none)."""
    here = ts.host_key()
    out: dict[int, Rescue] = {}
    sent: dict[int, _Sent] = {}
    for r, c in contacts.items():
        if c is None or not (c.signal and c.pulse_tid and c.dump):
            out[r] = _none(f"ddpviz could not dump it there: {c.why}" if c and c.why else "")
            continue
        why = _unreachable(c, here)
        if why:
            out[r] = _none(why, gone=why == _EXITED.format(pid=c.pid))
            continue
        offset = _size(c.dump)
        if offset is None:
            out[r] = _none(f"its faulthandler file cannot be read here ({c.dump})")
            continue
        one = _Sent(c, offset, _stamp_age(c.stamp))
        one.sample()
        error = _signal_thread(c.pid, c.pulse_tid, c.signal)
        if error:
            out[r] = _none(error)
            continue
        sent[r] = one
    texts = _settle(sent, settle)
    for r, one in sent.items():
        c = one.contact
        frames = next((f for ident, f in st.faulthandler_threads(texts.get(r, ""))
                       if ident == c.thread), None)
        why = ("" if frames is not None else
               f"faulthandler wrote no stack within {settle:g}s" if not texts.get(r) else
               "its training thread is not in faulthandler's dump (it has ended)")
        out[r] = Rescue(tuple(frames or ()), why, one.quiet, tuple(one.pulse),
                        tuple(one.training), c.source, one.pulse_cpu())
    return out


class _Sent:
    """A rank that was signalled: where its dump starts, and its threads' states, sampled
    while the dump is written."""

    def __init__(self, contact: Contact, offset: int, quiet: float | None) -> None:
        self.contact, self.offset, self.quiet = contact, offset, quiet
        self.pulse: list[ts.ThreadState] = []
        self.training: list[ts.ThreadState] = []
        self.cpu: list[tuple[float, int]] = []  # (monotonic time, the pulse thread's CPU ns)

    def sample(self) -> None:
        if len(self.pulse) >= _SAMPLES:
            return
        c = self.contact
        for samples, tid in ((self.pulse, c.pulse_tid), (self.training, c.tid)):
            state = ts.thread_state(c.pid, tid)
            if state is not None:
                samples.append(state)
        used = ts.cpu_ns(c.pid, c.pulse_tid)
        if used is not None:
            self.cpu.append((time.monotonic(), used))

    def seen_asleep(self) -> bool:
        """The pulse thread was read asleep, and on what: a state read as asleep with neither a
        kernel function nor a system call is not conclusive (it woke between the reads, as a
        thread waiting for the GIL does every 5 ms), and must not end the sampling before its
        CPU use can be measured."""
        return any(s.waits_on_futex or s.asleep_elsewhere for s in self.pulse)

    def pulse_cpu(self) -> float | None:
        """The share of a CPU the pulse thread used while sampled (None: too short to say)."""
        if len(self.cpu) < 2 or self.cpu[-1][0] - self.cpu[0][0] < _WINDOW_S / 2:
            return None
        (t0, c0), (t1, c1) = self.cpu[0], self.cpu[-1]
        return (c1 - c0) / 1e9 / (t1 - t0)


def _unreachable(c: Contact, here: str) -> str:
    """Why the rank of contact `c` (armed) cannot be dumped from here ("": it can)."""
    if not signal.SIGRTMIN <= c.signal <= signal.SIGRTMAX:  # (only ever one of these)
        return f"its contact names signal {c.signal}, which ddpviz never uses"
    if c.host != here:
        return ("it runs on another host (or pid namespace): its stack is dumped only from the "
                f"same one ({c.host.split(' ', 1)[0]})")
    if ts.start_time(c.pid) != c.start:
        return _EXITED.format(pid=c.pid)
    caught, ignored = ts.signal_masks(c.pid)
    if not caught & (1 << (c.signal - 1)) or ignored & (1 << (c.signal - 1)):
        return f"its faulthandler signal ({c.signal}) is no longer caught there"
    if ts.thread_state(c.pid, c.pulse_tid) is None:
        return "ddpviz's thread there has ended"
    return ""


def _open(path: str) -> int | None:
    """A read-only descriptor of `path` if it is this user's regular file (never a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd


def _size(path: str) -> int | None:
    fd = _open(path)
    if fd is None:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _stamp_age(path: str) -> float | None:
    fd = _open(path) if path else None
    if fd is None:
        return None
    try:
        raw = os.pread(fd, _STAMP.size, 0)
    finally:
        os.close(fd)
    if len(raw) != _STAMP.size:
        return None
    (t,) = _STAMP.unpack(raw)
    return max(0.0, time.time() - t) if t > 0 else None


_tgkill: Any = None
_TGKILL = {"x86_64": 234, "aarch64": 131}  # the syscall, where libc has no tgkill() (< 2.30)


def _signal_thread(pid: int, tid: int, sig: int) -> str:
    """Send `sig` to thread `tid` of process `pid` only; "" done, else why not."""
    global _tgkill
    if _tgkill is None:
        libc = ctypes.CDLL(None, use_errno=True)
        own = getattr(libc, "tgkill", None)
        number = _TGKILL.get(platform.machine())
        if own is not None:
            _tgkill = own
        elif number is not None:
            _tgkill = lambda *a: libc.syscall(number, *a)  # noqa: E731
        else:
            _tgkill = False
    if _tgkill is False:
        return "ddpviz cannot signal one thread on this machine"
    if _tgkill(ctypes.c_int(pid), ctypes.c_int(tid), ctypes.c_int(sig)) != 0:
        error = ctypes.get_errno()
        return f"ddpviz may not signal it ({os.strerror(error)})"
    return ""


def _settle(sent: dict[int, _Sent], settle: float) -> dict[int, str]:
    """What each dump file got past its offset once all stopped growing, sampling the threads'
    states meanwhile (for _WINDOW_S, or until each pulse thread was seen asleep; at most
    `settle` s in all)."""
    if not sent:
        return {}
    start = time.monotonic()
    deadline = start + settle
    last: dict[int, str] = {}
    stable_since = start
    while True:
        texts = {r: _read_from(one.contact.dump, one.offset) for r, one in sent.items()}
        for one in sent.values():
            one.sample()
        now = time.monotonic()
        if texts != last:
            last, stable_since = texts, now
        elif all(texts.values()) and now - stable_since >= _QUIET_S and (
                now - start >= _WINDOW_S or all(one.seen_asleep() for one in sent.values())):
            return texts
        if now >= deadline:
            return texts
        time.sleep(0.01)


def _read_from(path: str, offset: int) -> str:
    fd = _open(path)
    if fd is None:
        return ""
    try:
        return os.pread(fd, MAX_DUMP, offset).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def lines(rank: int, got: Rescue, answer_s: float) -> list[str]:
    """A hang finding's lines for a rank whose stack faulthandler dumped: why it came this way,
    where the training thread is (folded as every stack), and what the kernel says of it."""
    stack = list(got.stack)
    if got.holds_gil():
        head = (f"rank {rank}'s training thread has held the GIL in C code for about "
                f"{got.quiet_s:.0f}s (no other Python thread there ran, ddpviz's included); "
                "its Python stack, dumped by faulthandler:")
    elif got.starved():
        head = (f"no Python thread of rank {rank} has run for about {got.quiet_s:.0f}s (a "
                "thread holds the GIL in C code); its training thread's Python stack, dumped by "
                "faulthandler:")
    elif got.quiet_s is not None and got.quiet_s >= STALE_S:
        head = (f"ddpviz's thread on rank {rank} has not run for about {got.quiet_s:.0f}s; its "
                "training thread's Python stack, dumped by faulthandler:")
    else:
        head = (f"rank {rank} did not post its stack within {answer_s:g}s; its training "
                "thread's Python stack, dumped by faulthandler:")
    out = [head, f"rank {rank} is at {st.summary(stack)}"]
    out += [f"  {line}" for line in st.stack_lines(stack, source=got.source)]
    now = got.training_now()
    if now is not None:
        out.append(f"  its training thread, per /proc: {now.describe()} (its C frames would "
                   "need ptrace)")
    return out
