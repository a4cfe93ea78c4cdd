"""Do all ranks issue the same collectives in the same order? Each rank posts its ledger
(collectives.py) to the store from a daemon thread; the lowest rank of each process group
compares the histories position by position and names the first position where they differ,
live: a collective with a different op, dtype, size or source at the same position
(`collective_mismatch`), or one that only some ranks issued from Python while the others were
in DDP's collectives or elsewhere (`unmatched_collective`). It also names ranks blocked in
different collectives that can never complete. See [Note: comparing histories].
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import torch.distributed as dist

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import Finding, fix_for, format_ranks
from ddpviz.probes import collectives as ledger_mod
from ddpviz.probes.collective_compare import (
    Entry,
    Mark,
    _agree,
    _entry_text,
    _group_label,
    compare_at,
    finding_at,
)
from ddpviz.probes.collectives import GroupLedger
from ddpviz.probes.pulse import ENDING
from ddpviz.probes.rendezvous import background_connection
from ddpviz.units import ordinal

# [Note: comparing histories]
# Every PERIOD_S each rank posts, per group, the entries and marks it added since its last
# post (a numbered chunk) and a head: the last chunk's number and how far it got in the
# group's sequence (its position). A position every rank has passed is final on every rank,
# so the lowest rank of the group compares positions below the least of the posted positions
# (the horizon) and never one a rank may still fill. At each position where some rank has an
# entry: ranks with entries must agree on op and signature; a rank with none issued something
# else there (DDP's collectives, named by the marks, or a call ddpviz does not see). The first
# difference is reported once per group; after it, positions no longer pair, so that group's
# comparison stops. Nothing is read from the user's process group: only the store.
# Blocked ranks: a rank inside a blocking call posts it as open, in its group's head and in a
# key of its own that every group shares (`Blocked`: the group, its ranks, the call, since
# when; set only when it changes). Rank 0 reads every rank's key each tick (one multi_get):
# when every rank of a set is blocked, each in a collective that some peer of its group is not
# in, and those peers are blocked too (in the set), none of them can ever return:
# `collective_mismatch` names each rank's call (different groups or positions), after it
# lasted STUCK_S. One reader of every rank's call: a cycle through groups that no one rank
# belongs to (ranks 0,1 / 1,2 / 0,2, each blocked in one) is named like one inside a group.

# [Note: a new call site is posted first]
# gloo ends a process at once (SIGABRT, no Python runs) when a collective receives more bytes
# than it expected, which is what a collective issued on one rank only, or with other sizes,
# usually does: the poster thread would never post it. So the first collective from each call
# site is posted by the training thread itself, before it runs (two store writes, once per
# site; a site seen before costs nothing), and every rank compares what the store holds when
# it exits (`final`, at exit), so a surviving rank names what its dead peer issued.
# That alone is a race when the mismatch ends the job at once: in an all_gather whose sizes
# differ at step 0, gloo aborts the rank that receives more bytes than it expected (SIGABRT:
# neither its checker nor its atexit runs) and the peer, handed uninitialized memory, trains
# on until its next collective fails; torchrun sees the abort and SIGTERMs that peer (default
# disposition: it dies without atexit), often before its exception is raised. So the rank
# also claims the position with its call, before it runs (one compare_set, once per site;
# See [Note: claiming a position]).

# [Note: claiming a position]
# Each rank, posting a new call site's first collective, compare_sets the key of that
# position in the group with (rank, entry): the first rank there sets it, every later one
# reads the first one's call (the store serves requests one at a time, and each rank posts
# its history before it claims). A call that differs in op or signature is a mismatch at a
# position both ranks issued: the rank that reads it compares at once, on its training
# thread, before it enters its collective (the full comparison of every posted history when
# every rank has posted that far, else the two calls observed), reports it and ships its
# events. The mismatch cannot end a process before that rank's call runs: gloo aborts on the
# data the call sends or receives. A finding on the group is reported by one rank of the job
# (a compare_set on the group's `named` key), whichever compares first; the others say
# nothing more of it. No signal handler: the job dies as it would without ddpviz.

# [Note: an evaluation on some ranks only]
# A forward through the DDP without gradients (torch.no_grad(): an evaluation, a generation)
# still broadcasts its buffers (broadcast_buffers=True) when the forward before it synced, and
# then leaves the next forward's broadcast out (torch's require_forward_param_sync): on the
# ranks that evaluate, its broadcast takes the position of the next training forward's. A
# rank that evaluates alone thus pairs its evaluation's broadcast with the others' training
# forward's (same op, dtype, size and source: nothing else differs), and it has one broadcast
# more than they do until its next training forward; after its last evaluation the job
# hangs or mispairs it with whatever the others issue next. The ledger knows which
# broadcasts are a DDP's (comm.LAUNCH.forward, set by watch() and ddpviz's DDP around their
# buffer sync) and which of them ran for a forward without gradients: a position where some
# ranks' call is such a broadcast and the others' is not (their training forward's, or any
# other call) is an `unmatched_collective` naming the ranks that evaluated, whatever op and
# signature say. A healthy job whose ranks all evaluate pairs evaluation with evaluation.
# An evaluation's first call site is posted and claimed like any new site; otherwise the
# comparison twice a second names it (the mispaired broadcasts carry the same data until the
# last one, so the job is not harmed before then). (Meeting the peers at that position, to
# name it before the broadcast runs, was tried: the same wait at changed call sites hung
# healthy jobs, See docs/collectives.md.)

PERIOD_S = 0.5
STUCK_S = 2.0
KEEP_CHUNKS = 64  # chunks a rank keeps in the store; a checker further behind skips ahead
MAX_CHUNK = 1 << 20  # bytes of one posted chunk read back


class Head(msgspec.Struct, array_like=True):
    chunk: int  # the last chunk posted (-1: none)
    position: int  # the rank's position in the group's sequence (-1: unknown)
    open: Entry | None  # a blocking call it is inside, if any
    open_since: float  # time.time() the open call began (posted by the rank)
    step: int
    since: int  # positions below this were not recorded on the rank


class Blocked(msgspec.Struct, array_like=True):
    """The blocking collective a rank is inside (its own key: See [Note: comparing
    histories])."""

    group: str
    ranks: list[int]  # the group's global ranks
    entry: Entry
    since: float  # time.time() the call began (posted by the rank)


class Chunk(msgspec.Struct, array_like=True):
    first: int  # index of the first entry in `entries` in the rank's ledger
    entries: list[Entry]
    marks: list[Mark]


class Claim(msgspec.Struct, array_like=True):
    rank: int  # the first rank that issued a collective at the position (from a new site)
    entry: Entry  # its call there


_enc = msgspec.msgpack.Encoder()
_dec_head = msgspec.msgpack.Decoder(Head)
_dec_chunk = msgspec.msgpack.Decoder(Chunk)
_dec_claim = msgspec.msgpack.Decoder(Claim)
_dec_blocked = msgspec.msgpack.Decoder(Blocked)
MEET_LOCK_S = 1.0  # the most the training thread waits for the checker's lock, once
FLUSH_S = 1.0  # the most a report waits for its event to be shipped


class _Poster:
    """What this rank posted of one group's ledger."""

    def __init__(self) -> None:
        self.chunk = -1
        self.sent = 0  # entries (by ledger count) posted final
        self.last_mark: Mark | None = None  # the last mark posted (See ledger_mod.new_marks)
        self.open_index = -1
        self.open_since = 0.0
        self.open: Entry | None = None  # the blocking call open at the last post


class _History:
    """One rank's history of one group, as the checker read it."""

    def __init__(self) -> None:
        self.next_chunk = 0
        self.by_pos: dict[int, Entry] = {}
        self.marks: list[Mark] = []
        self.head: Head | None = None
        self.gap = False


class _Compare:
    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self.histories = {r: _History() for r in ranks}
        self.verified = 0  # positions below this were compared
        self.done = False


class CollectiveCheck:
    """The process's poster and checker thread (one per process, started by `start`)."""

    def __init__(self, tap: Tap, store: dist.Store, rank: int, epoch: int = 0) -> None:
        self.tap = tap
        self.store = store
        self.rank = rank
        self.epoch = epoch  # how many checkers this process started before (keys of its own)
        self.posters: dict[str, _Poster] = {}
        self.compares: dict[str, _Compare] = {}
        self.stuck_reported = False
        self.findings: list[Finding] = []
        self._blocked_posted: bytes | None = None  # this rank's Blocked key as last set
        # (read now: the thread's ticks may come after destroy_process_group)
        self.world = dist.get_world_size() if dist.is_initialized() else 0
        self._stop = threading.Event()
        self._post_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ddpviz-collectives",
                                        daemon=True)
        self._thread.start()
        ledger_mod.on_new_site = self._post_first
        atexit.register(self.final)
        _hook_exceptions()

    def _post_first(self, g: GroupLedger) -> None:
        """See [Note: a new call site is posted first] (training thread)."""
        if len(g.ranks) > 1 and g.comparable:
            with contextlib.suppress(Exception):
                call = g.entries[-1]  # the call about to run (just appended by this thread)
                self._post(g, issuing=True)
                self._claim(g, call.entry())  # (its text made once per call site)

    def _claim(self, g: GroupLedger, entry: Entry) -> None:
        """See [Note: claiming a position] (training thread, before the call runs)."""
        if self._stop.is_set() or entry.asym:
            return
        key = f"ddpviz/coll/{self.epoch}/{g.name}/at{entry.pos}"
        raw = self.store.compare_set(key, "", _enc.encode(Claim(self.rank, entry)))  # type: ignore[arg-type]
        if len(raw) > MAX_CHUNK:
            return
        first = _dec_claim.decode(raw)
        if (first.rank == self.rank or first.rank not in g.ranks
                or _agree(first.entry) == _agree(entry)):
            return
        if not self._tick_lock.acquire(timeout=MEET_LOCK_S):
            return  # the checker is busy past the bound: the ticks and `final` compare
        try:
            c = self.compares.get(g.name)
            if self._stop.is_set() or (c is not None and c.done):
                return
            self._check(g)  # every posted history, when every rank has posted this far
            c = self.compares[g.name]
            if not c.done:  # some rank has not: the two calls observed
                c.done = True
                mine = {first.rank: first.entry, self.rank: entry}
                self._report_once(g, self._finding(g, entry.pos, mine, {}))
        finally:
            self._tick_lock.release()

    def final(self) -> None:
        """At exit: post, then compare every group from this rank (See the Note)."""
        ENDING.set()  # (the quiet guard names no wait while the job ends: quiet.py)
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            with self._tick_lock:
                self._final()
        except Exception:  # the store went with its host: nothing more to say
            return

    def _final(self) -> None:
        ledgers = [g for g in ledger_mod.groups() if g.comparable and len(g.ranks) > 1]
        for g in ledgers:
            self._post(g)
        for g in ledgers:
            self._check(g)

    def stop(self) -> None:
        self._stop.set()
        if ledger_mod.on_new_site == self._post_first:
            ledger_mod.on_new_site = None
        atexit.unregister(self.final)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * PERIOD_S)

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                self.tick()
            except RuntimeError:  # the store is gone (rank 0 exited): nothing more to compare
                return
            except Exception as exc:  # never let the check touch the job
                print(f"ddpviz: the check of the job's collectives stopped ({exc!r}); the "
                      "job runs on.", file=sys.stderr)
                return

    # --- posting ----------------------------------------------------------------------------

    def tick(self) -> None:
        with self._tick_lock:
            ledgers = [g for g in ledger_mod.groups() if g.comparable and len(g.ranks) > 1]
            for g in ledgers:
                self._post(g)
            self._post_blocked(ledgers)
            for g in ledgers:
                if g.ranks[0] == self.rank:
                    self._check(g)
            if self.rank == 0:
                self._check_blocked()

    def _key(self, g: GroupLedger, rank: int, what: str) -> str:
        return f"ddpviz/coll/{self.epoch}/{g.name}/{rank}/{what}"

    def _post(self, g: GroupLedger, issuing: bool = False) -> None:
        """Post `g`'s new entries and head (`issuing`: the last entry is about to run, so the
        position counts it)."""
        with self._post_lock:
            self._post_locked(g, issuing)

    def _post_locked(self, g: GroupLedger, issuing: bool) -> None:
        p = self.posters.setdefault(g.name, _Poster())
        position = g.position()  # read before the entries: See [Note: comparing histories]
        if issuing and position is not None:
            position += 1
        with ledger_mod._lock:
            count = g.count
            entries = list(g.entries)  # a span set after this is posted next time
            marks = list(g.marks)
        first_kept = count - len(entries)
        start = max(p.sent, first_kept)
        new = entries[start - first_kept:]
        # an entry still open is posted again once it is final
        final = next((i for i, e in enumerate(new) if e.span < 0), len(new))
        if issuing:  # the training thread, before the call: a rank's exit ends it as issued
            final = 0
        new_marks = ledger_mod.new_marks(marks, p.last_mark)
        if new or new_marks:
            p.chunk += 1
            chunk = Chunk(start, [c.entry() for c in new], new_marks)  # (text made here)
            self.store.set(self._key(g, self.rank, f"c{p.chunk}"),
                           _enc.encode(chunk))  # type: ignore[arg-type]
            if p.chunk >= KEEP_CHUNKS:
                with contextlib.suppress(Exception):
                    self.store.delete_key(self._key(g, self.rank, f"c{p.chunk - KEEP_CHUNKS}"))
        p.sent = start + final
        if new_marks:
            p.last_mark = new_marks[-1]
        opened = None if issuing else next((e for e in reversed(entries) if e.span < 0), None)
        if opened is None:
            p.open_index, p.open_since = -1, 0.0
        else:
            index = count - 1 - next(i for i, e in enumerate(reversed(entries)) if e is opened)
            if index != p.open_index:
                p.open_index, p.open_since = index, time.time()
        p.open = None if opened is None else opened.entry()
        head = Head(p.chunk, -1 if position is None else position, p.open, p.open_since,
                    ledger_mod._step, g.since)
        self.store.set(self._key(g, self.rank, "h"), _enc.encode(head))  # type: ignore[arg-type]

    # --- comparing ----------------------------------------------------------------------------

    def _read(self, g: GroupLedger, c: _Compare) -> bool:
        keys = [self._key(g, r, "h") for r in c.ranks]
        if not all(self.store.check([k]) for k in keys):
            return False
        for r, key in zip(c.ranks, keys, strict=True):
            raw = self.store.get(key)
            if len(raw) > MAX_CHUNK:
                return False
            h = c.histories[r]
            h.head = _dec_head.decode(raw)
            if h.head.chunk - h.next_chunk >= KEEP_CHUNKS:  # fell behind: skip, say nothing
                h.gap = True
                h.next_chunk = h.head.chunk - KEEP_CHUNKS + 1
            while h.next_chunk <= h.head.chunk:
                data = self.store.get(self._key(g, r, f"c{h.next_chunk}"))
                h.next_chunk += 1
                if len(data) > MAX_CHUNK:
                    h.gap = True
                    continue
                chunk = _dec_chunk.decode(data)
                for e in chunk.entries:
                    h.by_pos[e.pos] = e
                h.marks.extend(chunk.marks)
        return True

    def _check(self, g: GroupLedger) -> None:
        c = self.compares.get(g.name)
        if c is None:
            c = self.compares[g.name] = _Compare(g.ranks)
        if c.done or not self._read(g, c):
            return
        heads = {r: c.histories[r].head for r in c.ranks}
        if any(h is None or h.position < 0 for h in heads.values()):
            return
        horizon = min(h.position for h in heads.values() if h is not None)
        c.verified = max(c.verified, max(h.since for h in heads.values() if h is not None))
        positions = sorted({p for r in c.ranks for p in c.histories[r].by_pos
                            if c.verified <= p < horizon})
        for pos in positions:
            finding = self._compare_at(g, c, pos)
            if finding is not None:
                c.done = True
                self._report_once(g, finding)
                return
        c.verified = max(c.verified, horizon)
        for r in c.ranks:  # what was compared is not needed again
            h = c.histories[r]
            for p in [p for p in h.by_pos if p < c.verified - ledger_mod.MAX_ENTRIES]:
                del h.by_pos[p]


    def _compare_at(self, g: GroupLedger, c: _Compare, pos: int) -> Finding | None:
        return compare_at(g.name, g.ranks, c.histories, pos)

    def _finding(self, g: GroupLedger, pos: int, mine: dict[int, Entry],
                 other: dict[int, str]) -> Finding:
        return finding_at(g.name, g.ranks, pos, mine, other)

    # --- blocked ranks ---------------------------------------------------------------------

    def _blocked_key(self, rank: int) -> str:
        return f"ddpviz/coll/{self.epoch}/blocked/{rank}"

    def _post_blocked(self, ledgers: Sequence[GroupLedger]) -> None:
        """Post the blocking call this rank is inside, if any (See the Note); b"": none."""
        mine = b""
        for g in ledgers:
            p = self.posters.get(g.name)
            if p is not None and p.open is not None and not p.open.asym:
                mine = _enc.encode(Blocked(g.name, list(g.ranks), p.open, p.open_since))
                break
        if mine != self._blocked_posted:
            self.store.set(self._blocked_key(self.rank), mine)  # type: ignore[arg-type]
            self._blocked_posted = mine

    def _check_blocked(self) -> None:
        """Rank 0: ranks blocked in collectives that can never complete, whatever their
        groups (See the Note)."""
        if self.stuck_reported:
            return
        keys = [self._blocked_key(r) for r in range(self.world)]
        if not keys or not self.store.check(keys):  # (a rank not posting yet: none stuck)
            return
        now = time.time()
        blocked: dict[int, Blocked] = {}
        for r, raw in enumerate(self.store.multi_get(keys)):
            if not raw or len(raw) > MAX_CHUNK:
                continue
            try:
                b = _dec_blocked.decode(raw)
            except msgspec.DecodeError:
                continue
            if now - b.since >= STUCK_S:
                blocked[r] = b
        stuck = _stuck(blocked)
        if len(stuck) < 2 or len({(blocked[r].group, blocked[r].entry.pos) for r in stuck}) < 2:
            return
        self.stuck_reported = True
        by_text: dict[str, list[int]] = {}
        for r in sorted(stuck):
            b = blocked[r]
            members = ",".join(str(m) for m in b.ranks)
            by_text.setdefault(f"waits in {_entry_text(b.entry)}, the "
                               f"{ordinal(b.entry.pos + 1)} collective on "
                               f"{_group_label(b.group)} (ranks {members}), for "
                               f"{now - b.since:.0f}s", []).append(r)
        values = tuple((t, tuple(rs)) for t, rs in by_text.items())
        title = ("ranks are blocked in different collectives that cannot complete (different "
                 "process groups or positions)")
        step = max(blocked[r].entry.step for r in stuck)
        self._report(Finding(kind="collective_mismatch", severity="error", title=title,
                             ranks=tuple(sorted(stuck)), step=step, values=values,
                             fix=fix_for("collective_mismatch", "job"), world_size=self.world))

    def _report_once(self, g: GroupLedger, finding: Finding) -> None:
        """Report `g`'s first difference unless another rank did (See [Note: claiming a
        position]); a store that cannot say lets this rank report."""
        mine = str(self.rank)
        try:
            named = self.store.compare_set(f"ddpviz/coll/{self.epoch}/{g.name}/named", "", mine)
        except Exception:
            named = mine.encode()
        if named == mine.encode():
            self._report(finding)

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        with contextlib.suppress(Exception):  # for the hang findings of every rank
            verdict = Verdict(finding.ranks, finding.fix, _verdict_lines(finding))
            self.store.compare_set(VERDICT_KEY, "", _enc.encode(verdict))  # type: ignore[arg-type]
        print(finding.text(), file=sys.stderr, flush=True)
        self.tap.emit_as(finding.step, time.monotonic_ns(), FindingReported, finding)
        self.tap.flush(FLUSH_S)  # before a collective or a signal can end this process


VERDICT_KEY = "ddpviz/coll/verdict"
MAX_VERDICT = 4096  # bytes of the posted verdict read back


def _verdict_lines(finding: Finding) -> list[str]:
    lines = [f"the job's collectives: {finding.title}"]
    lines += [f"  {format_ranks(ranks)}: {text}" for text, ranks in finding.values]
    return lines


MAX_VERDICT_LINES = 12


class Verdict(msgspec.Struct, array_like=True):
    """The first collective mismatch any rank named, as the store holds it for hang findings."""

    ranks: tuple[int, ...]  # the ranks it names (those that issued what the others did not)
    fix: str
    lines: list[str]  # its title and values, as lines of a hang finding's detail


_dec_verdict = msgspec.msgpack.Decoder(Verdict)


def hang_verdict() -> Verdict | None:
    """The first collective mismatch any rank named (posted in the store): a hang caused by
    collectives that ranks issued differently then says so. None when none was named, no
    check runs in this process or what the store holds is not one."""
    check = _check
    if check is None:
        return None
    try:
        if not check.store.check([VERDICT_KEY]):
            return None
        raw = check.store.get(VERDICT_KEY)
        if not raw or len(raw) > MAX_VERDICT:
            return None
        verdict = _dec_verdict.decode(raw)
    except Exception:
        return None
    verdict.lines = verdict.lines[:MAX_VERDICT_LINES]
    return verdict


def hang_lines() -> tuple[str, ...]:
    """`hang_verdict()`'s lines, for a hang finding's detail (() when there is none)."""
    verdict = hang_verdict()
    return () if verdict is None else tuple(verdict.lines)




_check: CollectiveCheck | None = None
_check_lock = threading.Lock()
_epoch = 0
_hooked = False


def _hook_exceptions() -> None:
    """An uncaught exception (a peer's abort ends this rank's collective with one) runs
    sys.excepthook before the traceback prints, well before atexit and before torchrun stops
    the rank for its peer's failure: compare there first, then hand on (once per process)."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    previous = sys.excepthook

    def excepthook(*args: Any) -> None:
        check = _check
        if check is not None:
            check.final()
        previous(*args)

    sys.excepthook = excepthook


def _stuck(blocked: dict[int, Blocked]) -> set[int]:
    """The ranks of `blocked` that can never return: each waits, in its call, on peers of
    its group that are not in the same call, and every such peer is stuck too."""
    stuck = set(blocked)
    changed = True
    while changed:
        changed = False
        for r in list(stuck):
            b = blocked[r]
            waiting_on = [s for s in b.ranks if s != r and not (
                s in blocked and blocked[s].group == b.group and
                blocked[s].entry.pos == b.entry.pos)]
            if not waiting_on or any(s not in stuck for s in waiting_on):
                stuck.discard(r)
                changed = True
    return stuck


def start(tap: Tap) -> bool:
    """Turn on the ledger (one `release()` per True returned) and this process's
    checker (once per process; the first tap given is where its findings go)."""
    global _check, _epoch
    if not ledger_mod.install():
        return False
    with _check_lock:
        if _check is not None:
            return True
        from torch.distributed import distributed_c10d as c10d

        try:
            if dist.get_world_size() < 2:
                return True
            store = background_connection(c10d._get_default_store())
        except Exception:  # no default group or store: the ledger records, nothing compares
            return True
        _check = CollectiveCheck(tap, store, dist.get_rank(), _epoch)
        _epoch += 1
        return True


def release() -> None:
    """A watch or twin that `start`ed closes: once none uses the ledger, the checker stops
    (a later `start` begins anew; the positions before it are not compared)."""
    ledger_mod.release()
    if not ledger_mod.enabled():
        stop()


def stop() -> None:
    """Stop the checker."""
    global _check
    with _check_lock:
        if _check is not None:
            _check.stop()
            _check = None
