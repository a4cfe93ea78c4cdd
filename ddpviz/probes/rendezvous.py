"""Meeting points that never hang: ranks check in through the process group's store (the
TCP key-value store every process group is built on), never through a collective, so a rank
that does not arrive is *named* after a timeout instead of blocking the others forever.

`exchange` / `rendezvous`: every rank posts a value under a key of its own and waits, with a
timeout, for all the others; on timeout every rank that did arrive raises the same
`RankHangError` naming the ranks that never came. `Board`: the per-DDP notice board where each
rank posts where it is (heartbeats, the collective it waits in) and the errors it raised, read
by the watchdog. See [Note: one verdict].
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

import msgspec
import torch.distributed as dist

from ddpviz.errors import RankHangError
from ddpviz.events import Collective, Phase
from ddpviz.findings import Finding, fix_for, format_ranks, group_ranks
from ddpviz.limits import Name, Step

# [Note: one verdict]
# A rank that times out and a rank that arrives at the same moment must not disagree (one
# raising, the other walking into a collective nobody will join). So the outcome of every
# meeting is decided once, in the store, with compare_set on a verdict key: the first rank to
# decide ("ok" when it saw everyone, the list of missing ranks when it timed out) wins, and
# every rank, including one arriving long after the others gave up, acts on that verdict.

_PREFIX = "ddpviz"

# [Note: one background connection]
# ddpviz's background threads (every watch's heartbeat, the replica check) use a connection of
# their own, so a store call of theirs never waits behind the training thread's. One per store
# per process, shared by all of them (the C++ client serializes calls; they make only short,
# non-blocking ones: set, add, check, get of a key known to exist), not one per watch: opening
# a connection costs a round of torch's socket set-up, including a reverse DNS lookup of the
# peer for its logs, which on a machine whose resolver drops queries takes 5 s (glibc's
# timeout); a notebook that watches and closes again and again would pay it every time. The
# entry goes with the store: it never keeps a store (or rank 0's server) alive.
_CLONES: weakref.WeakKeyDictionary[dist.Store, dist.Store] = weakref.WeakKeyDictionary()
_CLONES_LOCK = threading.Lock()


def background_connection(base: dist.Store) -> dist.Store:
    """The process's connection to `base`'s server for ddpviz's background threads (See
    [Note: one background connection])."""
    with _CLONES_LOCK:
        clone = _CLONES.get(base)
        if clone is None:
            clone = _CLONES[base] = base.clone()  # type: ignore[attr-defined]
        return clone


class Scope:
    """A process group's store, this rank and the world size, for store-based meetings.

    Args:
        process_group: the group (the default group if None); ranks are its group ranks.
        store: use this store instead of the group's own (tests, torchrun's store).
        clone: use the background threads' connection (`background_connection`), not the
            training thread's.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None, *,
                 store: dist.Store | None = None, clone: bool = False) -> None:
        group = dist.group.WORLD if process_group is None else process_group
        if group is None:
            raise RuntimeError(
                "ddpviz: no process group to meet in: the default process group is not "
                "initialized.\nCall torch.distributed.init_process_group(...) first, or pass "
                "process_group=.")
        self.group = group
        self.rank = group.rank()
        self.world_size = group.size()
        self._store = store
        self._clone = clone
        self._resolved: dist.Store | None = None

    @property
    def store(self) -> dist.Store:
        """The store (looked up on first use: a group of one never needs it)."""
        if self._resolved is None:
            base = self._store if self._store is not None else _group_store(self.group)
            self._resolved = background_connection(base) if self._clone else base
        return self._resolved

    def generation(self, name: str) -> int:
        """How many meetings named `name` this rank started on this store before. Counted in
        the store itself, so a new process group starts from 0 on every rank; every rank
        meets in the same order, so the numbers agree across ranks."""
        return int(self.store.add(f"{_PREFIX}/gen/{name}/{self.rank}", 1)) - 1


def _group_store(group: dist.ProcessGroup) -> dist.Store:
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._get_process_group_store(group)
    except (KeyError, AttributeError, RuntimeError):
        return c10d._get_default_store()


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def exchange(name: str, payload: str = "", process_group: dist.ProcessGroup | None = None, *,
             timeout: float, store: dist.Store | None = None, what: str | None = None,
             scope: Scope | None = None,
             on_wait: Callable[[list[int], float], None] | None = None) -> list[str]:
    """Every rank posts `payload`; returns all payloads (index = group rank). Not a
    collective: only the store is used, so ranks can never hang in it.

    Args:
        name: the meeting's name; each call with a name is a new meeting (same order on every
            rank).
        payload: this rank's value (text).
        process_group, store: where to meet (the default group's store by default).
        timeout: seconds to wait for the other ranks.
        what: how to name the place in the error ("DistributedDataParallel's constructor").
        on_wait: called once, after `notice_after(timeout)` seconds, if some ranks have not
            arrived yet: `on_wait(missing_ranks, since)` (since: time.time() of arrival), so
            the wait can be shown live before the deadline.

    Raises:
        RankHangError: on every rank that arrived, with the same message, naming the ranks
            that did not arrive within `timeout` (finding kind "missing_rank").
    """
    scope = scope or Scope(process_group, store=store)
    if scope.world_size == 1:
        return [payload]
    s = scope.store
    start = time.monotonic()
    try:
        base = f"{_PREFIX}/meet/{name}/{scope.generation(name)}"
        verdict_key = f"{base}/verdict"
        s.set(f"{base}/{scope.rank}", payload)
        if s.add(f"{base}/count", 1) >= scope.world_size:
            verdict = as_text(s.compare_set(verdict_key, "", "ok"))
        else:
            verdict = _wait_verdict(scope, base, verdict_key, start + timeout, timeout,
                                    on_wait)
        if verdict == "ok":
            payloads = [as_text(s.get(f"{base}/{r}")) for r in range(scope.world_size)]
            _all_read(scope, f"{base}/read", scope.world_size)
            return payloads
        decided = json.loads(verdict)
        _all_read(scope, f"{base}/read", len(decided["arrived"]))
    except RuntimeError as exc:  # the store itself is gone: its host (rank 0) exited
        raise store_lost(scope, what or name, exc) from exc
    raise missing_error(decided, scope.world_size, what or name)


def _all_read(scope: Scope, key: str, readers: int, limit: float = 1.0) -> None:
    # The store lives in one rank (rank 0 under env:// and torchrun). Had it raised and exited
    # right after reading, a slower rank would lose the store before reading: wait (briefly)
    # until all `readers` have read.
    s = scope.store
    end = time.monotonic() + limit
    count = int(s.add(key, 1))
    if count >= readers:
        time.sleep(0.02)  # the last reader: give the others' next poll time to see the count
        return
    with contextlib.suppress(RuntimeError):  # the store went away: everyone had read
        while count < readers and time.monotonic() < end:
            time.sleep(0.005)
            count = int(s.add(key, 0))


def notice_after(timeout: float) -> float:
    """Seconds a wait lasts before it is reported live (a RankWaiting finding): a quarter of
    the deadline, at most 10 s."""
    return min(10.0, timeout / 4)


def _wait_verdict(scope: Scope, base: str, verdict_key: str, deadline: float,
                  timeout: float, on_wait: Callable[[list[int], float], None] | None) -> str:
    # Polling `check` rather than `store.wait(timeout)`: a timed-out wait makes c10d log socket
    # warnings on stderr, which would show up in the notebook on every rank.
    s = scope.store
    pause = 0.002
    since = time.time()
    notice = time.monotonic() + notice_after(timeout) if on_wait is not None else None
    while time.monotonic() < deadline:
        if s.check([verdict_key]):
            return as_text(s.get(verdict_key))
        if notice is not None and time.monotonic() >= notice:
            notice = None
            missing = [r for r in range(scope.world_size) if not s.check([f"{base}/{r}"])]
            if missing and on_wait is not None:
                on_wait(missing, since)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    arrived = [r for r in range(scope.world_size) if s.check([f"{base}/{r}"])]
    missing = [r for r in range(scope.world_size) if r not in arrived]
    proposal = "ok" if not missing else json.dumps(
        {"missing": missing, "arrived": arrived, "timeout": timeout, "by": scope.rank})
    return as_text(s.compare_set(verdict_key, "", proposal))


def rendezvous(name: str, process_group: dist.ProcessGroup | None = None, *, timeout: float,
               store: dist.Store | None = None, what: str | None = None) -> None:
    """Wait until every rank of the group got here, or raise `RankHangError` on every rank
    that did, naming those that did not (within `timeout` seconds). See `exchange`."""
    exchange(name, "", process_group, timeout=timeout, store=store, what=what)


def missing_error(verdict: dict[str, Any], world_size: int, what: str) -> RankHangError:
    """The error for a meeting some ranks never reached (the same on every rank)."""
    missing = tuple(int(r) for r in verdict["missing"])
    timeout = float(verdict["timeout"])
    states = {r: "never arrived" if r in missing else "arrived" for r in range(world_size)}
    values = group_ranks(states)
    finding = Finding(
        kind="missing_rank", severity="error",
        title=f"{format_ranks(missing)} never reached {what} within {timeout:g}s",
        ranks=missing, field="arrival", values=values,
        fix=fix_for("missing_rank", ranks=format_ranks(missing)), world_size=world_size)
    return RankHangError(finding.text(), (finding,), {})


def store_lost(scope: Scope, what: str, exc: BaseException) -> RankHangError:
    """The store became unreachable: the rank hosting it (rank 0 under env:// and torchrun)
    exited or crashed."""
    finding = Finding(
        kind="rank_exited", severity="error",
        title=f"rank {scope.rank} lost the process group's store at {what}: the rank hosting it "
              "(usually rank 0) exited or crashed",
        ranks=(0,), field="store", detail=(f"{type(exc).__name__}: {str(exc).splitlines()[0]}",),
        fix=fix_for("rank_exited", "store"),
        world_size=scope.world_size)
    return RankHangError(finding.text(), (finding,), {})


class Position(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where one rank is, as posted on its DDP's notice board (the hang protocol's unit):
    "running" (a heartbeat: `phase` of `step` reached at wall time `t`), "waiting" in a
    collective since `since`, or "failed" in one with `error`. Validated when read back."""

    state: Literal["running", "waiting", "failed"]
    step: Step
    phase: Phase
    t: float  # time.time() when posted
    collective: Collective | None = None  # waiting/failed: where
    bucket: int = -1  # the all-reduce's bucket (-1: not a bucket all-reduce)
    params: tuple[Name, ...] = ()  # the bucket's parameter names (the first ones)
    since: float = 0.0  # time.time() when the wait began
    error: Name = ""  # failed: the collective's error, in a few words


def phase_text(position: Position) -> str:
    """A running position's phase in words: watch() beats "forward" when a forward starts and
    "backward" when it returns (See [Note: a rank still in its forward] in quiet.py)."""
    return "forward returned" if position.phase == "backward" else position.phase


_decode_position = msgspec.json.Decoder(Position).decode
_T = TypeVar("_T")


# [Note: one counter]
# The pulse thread looks at the board twice a second, one store round trip per look: the
# `alerts` counter. Two rarer kinds of news share it, each counted in its own 20-bit field, so
# that the look stays one round trip: a rank that left the DDP's loop (whereabouts.py) and a
# rank asking for every rank's stack. Alerts are the low field, as before.
_FIELD = 1 << 20


class News(NamedTuple):
    alerts: int  # ranks' alerts posted (errors raised)
    left: int  # reports of a rank that left the loop or exited
    requests: int  # requests for every rank's stack

    @staticmethod
    def of(count: int) -> News:
        return News(count % _FIELD, count // _FIELD % _FIELD, count // (_FIELD * _FIELD))


LEFT_NEWS = _FIELD  # add to the counter: a rank left the loop
STACK_REQUEST = _FIELD * _FIELD  # add to the counter: ranks, post your stacks


class Board:
    """Where the ranks of one DDP post where they are and what went wrong (store keys under
    `ddpviz/board/<epoch>/`). Every method is a few store round trips; none blocks long.

    Args:
        scope: the store and ranks (use a cloned Scope when called from another thread).
        epoch: separates DDP instances built on one process group (from `exchange`'s
            generation), so an old DDP's alerts never reach a new one.
    """

    def __init__(self, scope: Scope, epoch: int) -> None:
        self.scope = scope
        self.epoch = epoch
        self.base = f"{_PREFIX}/board/{epoch}"
        self._alerts_seen = 0

    @property
    def rank(self) -> int:
        return self.scope.rank

    @property
    def world_size(self) -> int:
        return self.scope.world_size

    def post(self, name: str, data: str) -> None:
        """Publish this rank's latest `name` (it replaces the one before)."""
        self.scope.store.set(f"{self.base}/{name}/{self.rank}", data)

    def posts(self, name: str, decode: Callable[[bytes], _T], ranks: Iterable[int] | None = None,
              *, max_bytes: int | None = None) -> dict[int, _T]:
        """The latest `name` of every rank in `ranks` (default: all), decoded; ranks that never
        posted are absent, and so are posts that do not validate (written by something else
        than this protocol) or are longer than `max_bytes`."""
        s = self.scope.store
        out: dict[int, _T] = {}
        for r in range(self.world_size) if ranks is None else ranks:
            key = f"{self.base}/{name}/{r}"
            if s.check([key]):
                raw = s.get(key)
                if max_bytes is None or len(raw) <= max_bytes:
                    with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                        out[r] = decode(raw)
        return out

    def post_position(self, position: Position) -> None:
        """Publish where this rank is."""
        self.post("pos", msgspec.json.encode(position).decode())

    def positions(self) -> dict[int, Position]:
        """Every rank's latest position (See `posts`)."""
        return self.posts("pos", _decode_position)

    def post_alert(self, message: str, findings: Sequence[Finding]) -> None:
        """Tell the other ranks this rank raised `message` (they stop waiting for it)."""
        s = self.scope.store
        data = {"rank": self.rank, "message": message,
                "findings": [msgspec.to_builtins(f) for f in findings]}
        s.set(f"{self.base}/alert/{self.rank}", json.dumps(data))
        s.add(f"{self.base}/alerts", 1)

    def has_alerts(self) -> bool:
        """True when some rank posted an alert (one store round trip)."""
        return self.news().alerts > 0

    def news(self, add: int = 0) -> News:
        """What was posted so far, in one store round trip (the pulse thread's look twice a
        second): alerts, ranks that left the loop, stack requests. See [Note: one counter]."""
        return News.of(int(self.scope.store.add(f"{self.base}/alerts", add)))

    def alerts(self) -> dict[int, dict[str, Any]]:
        """{rank: {"message", "findings"}} of every rank that posted one (findings decoded)."""
        s = self.scope.store
        out: dict[int, dict[str, Any]] = {}
        for r in range(self.world_size):
            key = f"{self.base}/alert/{r}"
            if s.check([key]):
                data = json.loads(as_text(s.get(key)))
                data["findings"] = tuple(msgspec.convert(f, Finding) for f in data["findings"])
                out[r] = data
        return out

    def decide(self, name: str, proposal: str) -> str:
        """The first proposal made under `name` by any rank (see [Note: one verdict])."""
        return as_text(self.scope.store.compare_set(f"{self.base}/verdict/{name}", "", proposal))
