"""`ddpviz.listen(follow=DIR)`: the live session of a job that `ddpviz record --out DIR` is running.

The job's ranks append their events to `ddpviz-trace-rank{R}.ddpviz` in DIR as they go (a
Sender's thread off the training thread, one frame per batch handed to the OS within ~20 ms,
see transport/sender.py). A `FolderFeed` reads those files from byte 0 (the history), then
tails them: it polls each file's size, reads the frames that are complete through the format's
one reader (`TailReader`, traces/fileformat.py), and delivers them like a collector does, so a
`Session` over it is what `listen()` gives: the same trace, subscribers, iterators and
`session.dashboard()`. The job never knows: nothing is written, nothing signalled, and closing
the session only stops the polling thread. A rank counts as finished (`session.stats.closed`,
the dashboard's status) once its file's end record is read, on any node
(See [Note: a rank's end in its file] in fileformat.py; a record counts only in the rank's own
file: See [Note: whose end record counts] in traces/source.py), or, for a file without one,
once its writing process is seen gone on this machine.

See [Note: following a growing file].
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpviz import limits
from ddpviz.events import Event, EventsDropped
from ddpviz.traces.fileformat import (
    SUFFIX,
    Clock,
    End,
    FileHeader,
    TailReader,
    TraceError,
    wall_offset,
)
from ddpviz.traces.source import job_folder
from ddpviz.traces.trace import gc_paused
from ddpviz.transport.codec import boot_id
from ddpviz.transport.collector import CollectorStats, warn_callback_error
from ddpviz.transport.subscribers import Subscribers

if TYPE_CHECKING:
    from ddpviz.session.live import Session

# [Note: following a growing file]
# A writer appends whole frames but a reader can see any prefix of one (a payload bigger than
# the writer's buffer goes out in several writes; a shared filesystem shows sizes before
# contents). So a frame is taken only once all of it is within the file's current size and
# its CRC matches; a frame cut short by the end is left for the next poll (the torn tail of a
# live writer, or of one that died). A CRC mismatch on the last frame is also waited for (NFS
# can show the new size before the bytes); on a frame with more bytes after it, the file is
# damaged (fileformat.TailReader holds these rules; a frame claiming more than its MAX_FRAME is
# damage too). Reads are `os.pread` on a descriptor opened once, never `mmap`: a mapped file that
# a new job truncates or rewrites kills the reader with SIGBUS. The descriptor keeps the
# inode: a file replaced under its name (a new job in the same folder renames its new file
# over the old one) is noticed by comparing the name's inode with ours; the old file is read
# to its end, then left, with one message. A file that shrinks under us was truncated in
# place: left with one message. Neither changes what was already delivered.

POLL_S = 0.25  # how often the files are polled: new events show within about this
# A file changed less than this long ago may change again without its stamp showing it
# (timestamps are coarse): a bad last frame is read again at every poll until then
# (See [Note: a bad last frame] in fileformat.py).
SETTLE_NS = 2 * 10**9
READ_BUDGET = 64 << 20  # bytes read from one file per poll, so one huge file cannot stall the rest
# Files kept open between polls; the ones beyond are opened for each poll, so a job of
# thousands of ranks stays within the process's descriptor limit (often 1,024).
MAX_OPEN = 256
_NAME = re.compile(r"ddpviz-trace-rank(\d+)" + re.escape(SUFFIX))
_PATTERN = f"ddpviz-trace-rank*{SUFFIX}"
_CHECK = ("\nA rank's file holds only its own events and end record: this one is damaged, "
          "misplaced or planted; check where it came from.")


class FileTail:
    """One per-rank trace file, read frame by frame from where the last poll stopped.

    `poll()` returns the events of the frames completed since; `stopped` says why the file is
    no longer followed (None while it is). Clock records read are also put in `clocks` (the
    feed's, to merge), and no byte at or past `upto` (when set) is read."""

    def __init__(self, path: Path, *, keep_open: bool = True,
                 clocks: dict[int, tuple[int, int]] | None = None) -> None:
        self.path = path
        self.keep_open = keep_open
        self._fd: int | None = None
        fd = self._open()
        st = os.fstat(fd)
        self._ino = (st.st_dev, st.st_ino)
        self._fd = fd
        self.size = st.st_size  # at the last look
        self.upto: int | None = None  # read no further than this (the history: FolderFeed.start)
        self.reader = TailReader(path)  # the frames: where it stopped, events read so far
        self.meta: dict[str, Any] | None = None  # the header's, once read
        self.clock: dict[int, tuple[int, int]] = {}  # from clock frames in the file
        self._clocks = clocks if clocks is not None else {}
        self._said_failed: int | None = None  # the bad last frame said, by offset
        self.end: End | None = None  # the writer's end record, once read: the rank is done
        self.refused = ""  # why an end record read does not count, if it does not
        self.foreign = False  # an event of another rank than the header's was read
        self.stopped: str | None = None
        self.reason = ""  # "truncated" | "replaced" | "damaged" | "unreadable", once stopped
        self._replaced = False
        if not keep_open:
            self.close()

    @property
    def pos(self) -> int:
        """Bytes consumed: every complete frame before it."""
        return self.reader.pos

    @property
    def events(self) -> int:
        """Events read from the file so far."""
        return self.reader.events

    def _open(self) -> int:
        # A link planted under the name fails (O_NOFOLLOW); a FIFO does not block the open
        # (O_NONBLOCK) and, like any file that is not a regular one, is refused.
        flags = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))
        fd = os.open(self.path, flags)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def poll(self, budget: int = READ_BUDGET) -> list[list[Event]]:
        """The event chunks of the frames completed since the last poll (at most about
        `budget` bytes of them). Never raises for the file's content: a damaged, truncated or
        replaced file sets `stopped` (the message) and closes."""
        out: list[list[Event]] = []
        if self.stopped is not None:
            return out
        try:
            if self._fd is None:  # not kept open between polls (see FolderFeed MAX_OPEN)
                try:
                    fd = self._open()
                except FileNotFoundError:
                    return out  # removed for now: a file put back under the name is new
                st = os.fstat(fd)
                self._fd = fd
                if (st.st_dev, st.st_ino) != self._ino:
                    self._replaced = True  # the old file's unread rest is out of reach
                    self._settle()
                    return out
            self._poll(budget, out)
        except (TraceError, OSError) as exc:  # the frames before it are delivered
            self._stop(str(exc) if isinstance(exc, TraceError) else
                       f"ddpviz: cannot read {str(self.path)!r}: {exc.strerror or exc}; it is "
                       "no longer followed.\nCheck the file, then attach again.",
                       "damaged" if isinstance(exc, TraceError) else "unreadable")
        except Exception as exc:
            # Unforeseen (a bug): `pos` is past the frames in `out`, so they are returned, not
            # dropped; the file is left rather than read again from a state not understood.
            self._stop(f"ddpviz: reading {str(self.path)!r} failed at byte {self.pos:,} "
                       f"({type(exc).__name__}: {str(exc)[:200]}); the {self.events:,} events "
                       "before are kept, it is no longer followed.\nPlease report this as a "
                       "ddpviz bug.", "unreadable")
        finally:
            if not self.keep_open:
                self.close()
        return out

    def _poll(self, budget: int, out: list[list[Event]]) -> None:
        fd = self._fd
        assert fd is not None
        if not self._replaced:
            try:
                st = os.stat(self.path, follow_symlinks=False)
                self._replaced = (st.st_dev, st.st_ino) != self._ino
            except FileNotFoundError:
                pass  # removed (cleaned up): what the descriptor holds is still read
        st = os.fstat(fd)
        size = self.size = st.st_size
        if size < self.pos:
            self._stop(f"ddpviz: {str(self.path)!r} was truncated while it was followed (it "
                       f"shrank from {self.pos:,} to {size:,} bytes: a new job rewrote it in "
                       f"place?).\nThe {self.events:,} events read before are kept; it is no "
                       "longer followed. Attach again to follow the new job.", "truncated")
            return
        upto = size if self.upto is None else min(size, self.upto)
        # the file's state, once its last change is old enough for its timestamps to show the
        # next one (See [Note: a bad last frame] in fileformat.py)
        stamp = (None if abs(time.time_ns() - st.st_ctime_ns) < SETTLE_NS else
                 (st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns))
        for record in self.reader.read(fd, upto, budget, stamp):
            if isinstance(record, list):
                if record:
                    out.append(record)
                    self._own_events(record)
            elif isinstance(record, FileHeader):
                _check_rank(self.path, record.meta)
                self.meta = record.meta
            elif isinstance(record, Clock):
                clock = (record.offset_ns, record.error_ns)
                self.clock[record.rank] = self._clocks[record.rank] = clock
            elif self.meta is not None:
                self._take_end(record)
        if self.pos:  # (a file without its magic and first frame header yet is waited for)
            self._settle()
        failed = self.reader.failed
        if failed is not None and failed != self._said_failed:
            self._said_failed = failed
            with contextlib.suppress(Warning):  # (on the polling thread: must not raise)
                warnings.warn(
                    f"ddpviz: {str(self.path)!r}: its last frame, at byte {failed:,}, fails its "
                    "checksum and the file has not changed since; it is read again once the "
                    f"file changes, not at every poll.\nThe {self.events:,} events before it "
                    "are read; if its writer has ended, the file is damaged at that point.",
                    UserWarning, stacklevel=2)

    def _own_events(self, chunk: list[Event]) -> None:
        """After events are read: an end record before them was not the file's end, and an
        event of another rank than the header's keeps the file's record from counting."""
        if not self.foreign:
            rank = self.meta.get("rank") if self.meta is not None else None
            self.foreign = any(e.rank != rank for e in chunk)
        if self.end is not None:
            self.end = None
            self.refused = (f"ddpviz: {str(self.path)!r} has events after its end record: the "
                            f"record is not its end, so it is not counted.{_CHECK}")

    def _take_end(self, end: End) -> None:
        """The file's end record, taken when it counts for the file's rank (See [Note: whose
        end record counts], source.py): the rank the record, the header and the file's name
        say is one, and every event read is that rank's; else `refused` says why not."""
        rank = self.meta.get("rank") if self.meta is not None else None
        named = _NAME.fullmatch(self.path.name)
        why = ("its header names no rank" if type(rank) is not int else
               f"the record is rank {end.rank}'s, the file rank {rank}'s" if end.rank != rank
               else "the file's name is another rank's"
               if named is None or int(named.group(1)) != rank else
               "the file holds events of other ranks" if self.foreign else "")
        self.end = None if why else end
        self.refused = (f"ddpviz: the end record of {str(self.path)!r} is not counted ({why}): "
                        f"no rank is taken to have finished by it.{_CHECK}" if why else "")

    def _settle(self) -> None:
        """After a poll: a replaced file read to its end is done with."""
        if self._replaced and not self.reader.more:
            self._stop(f"ddpviz: {str(self.path)!r} was replaced by a new file (a new job "
                       f"writing to the same folder?).\nThe {self.events:,} events of the "
                       "file followed until then are kept; the new one is not mixed in. "
                       "Attach again to follow the new job.", "replaced")

    def _stop(self, why: str, reason: str) -> None:
        self.stopped, self.reason = why, reason
        self.close()


def _check_rank(path: Path, meta: dict[str, Any]) -> None:
    """The rank a file's header names keys the session's per-rank state: bounded like an
    event's rank (ddpviz.limits), or the file is damaged."""
    rank = meta.get("rank")
    if type(rank) is int and not 0 <= rank < limits.MAX_WORLD_SIZE:
        raise TraceError(f"ddpviz: {str(path)!r}: its header names rank {str(rank)[:24]}, "
                         f"outside 0..{limits.MAX_WORLD_SIZE - 1}; it is not followed.\nThe "
                         "file is damaged or was not written by ddpviz.")


class FolderFeed:
    """The per-rank trace files in a folder, as a collector: history, then new events.

    What a `Session` needs of a collector (`subscribe`, `stats`, `close`, `address`), fed by
    a thread polling the files every `interval` seconds. Files that appear later (ranks that
    start late) are picked up; after a file was replaced (a new job), no new file is.

    Args:
        folder: the `ddpviz record --out` folder.
        interval: seconds between polls.
    """

    def __init__(self, folder: str | os.PathLike[str], *, interval: float = POLL_S) -> None:
        self.folder = job_folder(folder)  # no folder: refused here, before a thread starts
        self.interval = interval
        self.address = f"folder {self.folder}"
        self.host = ""
        self._tails: dict[Path, FileTail] = {}
        self._subscribers = Subscribers()
        self._lock = threading.Lock()  # stats, the set of tails
        self._poll_lock = threading.Lock()  # one poll at a time (the thread vs start())
        self._polled = threading.Condition()  # notified after every poll
        self._received: dict[int, int] = {}
        self._dropped: dict[int, int] = {}
        self._gaps: dict[int, int] = {}
        self._next_seq: dict[int, int] = {}
        self._clock: dict[int, tuple[int, int]] = {}
        self._new_clocks: dict[int, tuple[int, int]] = {}  # read from files, not merged yet
        self._peers: dict[int, str] = {}
        # ranks done: their file's end record was read, or (a file without one) its writing
        # process is known to have exited (on this machine only)
        self._finished: dict[int, FileTail] = {}
        # the files whose header says they are each rank's: two, and neither finishes the rank
        self._claims: dict[int, list[Path]] = {}
        self._ref: dict[str, Any] | None = None  # the first header: the reference clock
        self._problems: list[str] = []
        self._callback_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._history = False  # start() is reading the history: no new file is picked up
        self.polls = 0

    @property
    def connect_string(self) -> str:
        return ""  # nothing to connect to: the ranks write files

    @property
    def problems(self) -> list[str]:
        """Why files stopped being followed (truncated, replaced, damaged), one message each."""
        with self._lock:
            return list(self._problems)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    @property
    def ended(self) -> dict[int, End]:
        """The ranks whose file ends with its end record (their writer closed it: the rank is
        done, on any node), with what the record says; See [Note: a rank's end in its file]."""
        with self._lock:
            return {r: t.end for r, t in self._finished.items() if t.end is not None}

    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False
                  ) -> Callable[[], None]:
        return self._subscribers.add(callback, batch=batch)

    @property
    def stats(self) -> CollectorStats:
        with self._lock:
            ranks = sorted(self._received)
            return CollectorStats(
                received=dict(self._received), frames={}, rejected=self._rejected(),
                gaps=dict(self._gaps), dropped=dict(self._dropped),
                reordered=dict.fromkeys(ranks, 0), lost_frames=dict.fromkeys(ranks, 0),
                clock=dict(self._clock), peers=dict(self._peers),
                closed={r: (self._received.get(r, 0), self._dropped.get(r, 0))
                        for r in self._finished},
                callback_errors=self._callback_errors)

    def wait(self, predicate: Callable[[CollectorStats], bool], timeout: float = 30.0) -> bool:
        """Block until `predicate(stats)` holds (checked after every poll); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._polled:
            while not predicate(self.stats):
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return predicate(self.stats)
                self._polled.wait(min(left, 0.05))
        return True

    def _rejected(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for tail in self._tails.values():
            if tail.reason:
                counts[tail.reason] = counts.get(tail.reason, 0) + 1
        return counts

    def report_callback_error(self, callback: object, exc: Exception) -> None:
        with self._lock:
            self._callback_errors += 1
            first = self._callback_errors == 1
        if first:
            warn_callback_error(callback, exc, "following goes on")

    # --- reading ------------------------------------------------------------------------------

    def start(self) -> None:
        """Read the history (in this thread): the files there now, each up to the size it has
        now; then follow (a thread polls). A busy job appends all the while, so reading until
        a poll finds nothing new might never return: what comes after arrives live."""
        with gc_paused():  # many small objects, no cycles (see trace.gc_paused)
            self._discover()
            for tail in self._tails.values():
                tail.upto = tail.size
            self._history = True  # (files that appear now are picked up by the thread)
            try:
                while not self._stop.is_set():
                    # Each poll reads at most READ_BUDGET per file: loop until caught up, and
                    # end on a poll that finds nothing (it also looks at the writers).
                    if not self.poll() and not self._behind():
                        break
            finally:
                self._history = False
                for tail in self._tails.values():
                    tail.upto = None
        self._thread = threading.Thread(target=self._run, name="ddpviz-follow", daemon=True)
        self._thread.start()

    def _behind(self) -> bool:
        """Whether a file has whole frames left that the last poll's READ_BUDGET did not
        reach."""
        return any(t.reader.more for t in self._tails.values() if t.stopped is None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
                # Again while a big file is behind; not until a poll finds nothing new, which
                # may never happen while a busy job writes (polls back to back: a core's worth).
                while self._behind() and not self._stop.is_set():
                    self.poll()
            except Exception as exc:  # keep following; a bug here must not go silent
                with contextlib.suppress(Warning):
                    warnings.warn(f"ddpviz: following {str(self.folder)!r} failed on a poll "
                                  f"({type(exc).__name__}: {exc}); it keeps polling.\nPlease "
                                  "report this as a ddpviz bug.", UserWarning, stacklevel=2)

    def poll(self) -> int:
        """One pass over the folder: pick up new files, deliver new frames. Returns the number
        of events delivered."""
        with self._poll_lock:
            self.polls += 1
            self._discover()
            delivered = 0
            for tail in list(self._tails.values()):
                if tail.stopped is not None:
                    continue
                chunks = tail.poll()
                if tail.meta is not None:
                    self._describe(tail)
                rank = tail.meta.get("rank") if tail.meta is not None else None
                if type(rank) is int and self._contested(rank, tail):
                    rank = None  # neither its end record nor its writer's exit finishes it
                if tail.refused:
                    self._problem(tail.refused)
                if tail.end is not None and type(rank) is int:
                    if self._finished.get(rank) is not tail:
                        with self._lock:  # the file says the rank is done: on any node
                            self._finished[rank] = tail
                elif (not chunks and type(rank) is int and rank not in self._finished
                        and tail.meta is not None and _writer_gone(tail.meta)):
                    # Its writer has exited, so the file is whole: read what came after the
                    # last look, then count the rank finished (`stats.closed`, `wait(ranks=)`).
                    chunks = tail.poll()
                    with self._lock:
                        self._finished[rank] = tail
                elif chunks and type(rank) is int and rank in self._finished:
                    with self._lock:  # written after all (another pid namespace?): not finished
                        del self._finished[rank]
                for chunk in chunks:
                    self._count(chunk)
                    self._deliver(chunk)
                    delivered += len(chunk)
                if tail.stopped is not None:
                    self._problem(tail.stopped)
        with self._polled:
            self._polled.notify_all()
        return delivered

    def _contested(self, rank: int, tail: FileTail) -> bool:
        """Whether another file says it is rank `rank`'s too: only one can be, and which
        cannot be told, so neither finishes the rank (See [Note: whose end record counts],
        source.py); said once per file that joins the claim."""
        paths = self._claims.setdefault(rank, [])
        if tail.path not in paths:
            paths.append(tail.path)
            if len(paths) > 1:
                with self._lock:
                    self._finished.pop(rank, None)
                named = ", ".join(repr(str(p)) for p in paths)
                self._problem(
                    f"ddpviz: {len(paths)} files say they are rank {rank}'s: {named}. Only one "
                    f"can be, and which cannot be told: rank {rank} is not counted as finished "
                    "by either's end record or writer.\nRemove the files that are not rank "
                    f"{rank}'s (a copy, another job's, a planted one), then attach again.")
        return len(paths) > 1

    def _discover(self) -> None:
        if self._history:
            return  # start(): the history is the files that were there
        if any(t.reason == "replaced" for t in self._tails.values()):
            return  # the folder holds a new job now: not mixed into this session
        try:
            found = sorted(self.folder.glob(_PATTERN),
                           key=lambda p: (len(p.name), p.name))  # rank order
        except OSError:
            return
        for path in found:
            if path in self._tails or not _NAME.fullmatch(path.name):
                continue
            try:
                tail = FileTail(path, keep_open=len(self._tails) < MAX_OPEN,
                                clocks=self._new_clocks)
            except OSError as exc:
                # a link planted under the name, or unreadable: left out, said once
                tail = _dead(path, exc)
            with self._lock:  # stats() reads the tails from other threads
                self._tails[path] = tail
            if tail.stopped is not None:
                self._problem(tail.stopped)

    def _describe(self, tail: FileTail) -> None:
        meta = tail.meta
        assert meta is not None
        rank = meta.get("rank")
        if type(rank) is not int or rank in self._peers:
            return
        with self._lock:
            if self._ref is None:
                self._ref = meta
            self._peers[rank] = f"{str(meta.get('host'))[:200]} {str(meta.get('pid'))[:20]}"
            self._clock.setdefault(rank, wall_offset(meta, self._ref))

    def _count(self, chunk: list[Event]) -> None:
        first, last = chunk[0], chunk[-1]
        with self._lock:
            r = first.rank
            nxt = self._next_seq.get(r, 0)
            if (first.seq == nxt and last.rank == r
                    and last.seq - first.seq == len(chunk) - 1):
                # One rank's events numbered on from the last: no gap, and no EventsDropped
                # (a marker's count would widen the span). The usual chunk, counted at once.
                self._received[r] = self._received.get(r, 0) + len(chunk)
                self._next_seq[r] = last.seq + 1
                self._gaps.setdefault(r, 0)
                chunk = []
            for e in chunk:  # the collector's accounting (transport/collector.py _accept)
                r, s = e.rank, e.seq
                self._received[r] = self._received.get(r, 0) + 1
                nxt = self._next_seq.get(r, 0)
                if s > nxt:
                    self._gaps[r] = self._gaps.get(r, 0) + s - nxt
                if type(e) is EventsDropped:  # its seq starts the sender's hole: explained
                    self._dropped[r] = self._dropped.get(r, 0) + e.count
                    nxt = max(nxt, s + e.count)
                else:
                    nxt = max(nxt, s + 1)
                self._next_seq[r] = nxt
                self._gaps.setdefault(r, 0)
            if self._new_clocks:  # the files' own clock records win (read last wins)
                # only those read since: merging every file's at every chunk was files x chunks
                self._clock.update(self._new_clocks)
                self._new_clocks.clear()

    def _deliver(self, chunk: list[Event]) -> None:
        self._subscribers.deliver(chunk, self.report_callback_error)

    def _problem(self, message: str) -> None:
        with self._lock:
            if message in self._problems:
                return
            self._problems.append(message)
        with contextlib.suppress(Warning):  # on the polling thread: must not raise
            warnings.warn(message, UserWarning, stacklevel=2)

    def close(self) -> None:
        """Stop following (the job is not touched); idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        with self._poll_lock:
            for tail in self._tails.values():
                tail.close()

    def __repr__(self) -> str:
        return (f"<ddpviz FolderFeed {self.folder}: {len(self._tails)} files, "
                f"{sum(self._received.values())} events>")


_BOOT = boot_id()


def _writer_gone(meta: dict[str, Any]) -> bool:
    """Whether the process that wrote a file (its header's boot id and pid) has exited: known
    only on this machine (the same kernel); elsewhere, or when unsure, False. Only a hint
    (the file is still followed), so a pid seen from another pid namespace does no harm."""
    pid = meta.get("pid")
    if not _BOOT or meta.get("boot") != _BOOT or type(pid) is not int or not 1 < pid < 1 << 22:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists (not ours), or cannot tell
    return False


def _dead(path: Path, exc: OSError) -> FileTail:
    tail = FileTail.__new__(FileTail)
    tail.path, tail._fd, tail.meta, tail.clock = path, None, None, {}
    tail._clocks, tail.size, tail.upto, tail._said_failed = {}, 0, None, None
    tail.reader, tail.end = TailReader(path), None
    tail.refused, tail.foreign = "", False
    tail._replaced, tail._ino = False, (0, 0)
    tail.keep_open, tail.reason = False, "unreadable"
    tail.stopped = (f"ddpviz: cannot follow {str(path)!r}: {exc.strerror or exc}. Only "
                    "regular files are followed (a link or anything else planted under a "
                    "trace's name never is).\nIt is left out; check the folder.")
    return tail


def follow_folder(folder: str | os.PathLike[str], *, interval: float = POLL_S, show: bool = True,
           record: str | os.PathLike[str] | None = None) -> Session:
    """The live session of the job recording into `folder` (`ddpviz record --out DIR`);
    `ddpviz.listen(follow=DIR)` calls it.

    Reads the per-rank trace files written so far (the history: what they hold when this is
    called, so it returns while a busy job writes), then follows them as they grow (what the job
    wrote meanwhile first): `session.dashboard()` shows the job live, like a `listen()` session.
    The job is not touched: it only writes files, and `session.close()` stops reading them.
    Attach as often as you like; every attach reads the files from their start.

    Args:
        folder: the job's `--out` folder (on a shared filesystem for a multi-node job).
        interval: seconds between polls of the files (new events show within about this).
        show: print what was found.
        record: also stream every event into this `.ddpviz` file (see Session).
    Returns:
        A Session (`session.trace`, `session.dashboard()`, `session.close()`).
    """
    from ddpviz.session.live import Session

    feed = FolderFeed(folder, interval=interval)
    session = Session(feed, record=record)
    session._trace.meta.update(source="attach", address=feed.address)
    feed.start()
    if show:
        s = feed.stats
        print(f"ddpviz: attached to {feed.folder}: {sum(s.received.values()):,} events from "
              f"{len(s.received)} ranks so far, following every {interval:g} s.\n"
              "session.dashboard() shows them live; session.close() detaches (the job "
              "is not affected).")
    return session
