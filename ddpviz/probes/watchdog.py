"""The hang watchdog: DDP's waits (bucket all-reduces, buffer broadcasts, the bucket rebuild)
with a deadline, so that a rank that never arrives is named long before the process group's own
timeout, on every rank that waits for it.

While a collective is pending, the waiting rank polls the DDP's notice board in the store
(rendezvous.Board) for errors other ranks raised; past `hang_timeout` it posts where it is,
reads where the others are and raises `RankHangError` naming the lagging ranks and the
collective, bucket and parameters it waited in. See [Note: hang protocol].
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from ddpviz.engine import failure_texts as texts
from ddpviz.envvars import ENV_HANG_TIMEOUT
from ddpviz.errors import RankHangError, UnusedParametersError
from ddpviz.events import Collective, FindingReported, Phase, Tap
from ddpviz.findings import Finding, fix_for, format_ranks, group_ranks
from ddpviz.probes import collective_check, exit_error, whereabouts
from ddpviz.probes.pulse import Pulse
from ddpviz.probes.quiet import QuietGuard
from ddpviz.probes.rendezvous import (
    Board,
    Position,
    Scope,
    as_text,
    exchange,
    notice_after,
    phase_text,
    store_lost,
)

# [Note: hang protocol]
# Each synced forward posts this rank's position (a heartbeat, handed to a daemon thread that
# also looks for other ranks' alerts twice a second: see pulse.py). A collective that finishes
# before the first poll never touches the store; a wait that lasts longer polls the board's
# alert counter every _POLL_S (one store round trip). Then:
#  - another rank posted an alert (it raised a ddpviz error): raise at once, carrying its
#    findings ("peer_failed"), or its hang verdict verbatim;
#  - the collective failed (gloo: "Connection closed by peer"): post "failed", give the
#    other ranks a short grace to post too, and name the ranks that did not (they exited);
#  - hang_timeout passed: post "waiting" with step, collective, bucket and parameters, give
#    the others a grace to post too, then compare positions: ranks that never got here are
#    lagging (their last heartbeat says where they were), ranks waiting elsewhere run other
#    collectives.
# The first rank to conclude writes the verdict (Board.decide) and posts it as an alert; every
# rank raises that same text, including a laggard that arrives later.

DEFAULT_HANG_TIMEOUT = 300.0  # seconds; gloo's and NCCL's own defaults are 30 and 10 minutes
PG_FRACTION = 0.6  # of the process group's timeout: see default_hang_timeout
_POLL_S = 0.25


def resolve_hang_timeout(value: float | None,
                         process_group: dist.ProcessGroup | None = None) -> float | None:
    """`value`, else $DDPVIZ_HANG_TIMEOUT, else `default_hang_timeout(process_group)`; 0 or
    less turns the watchdog off."""
    if value is None:
        env = os.environ.get(ENV_HANG_TIMEOUT, "").strip()
        if env:
            try:
                value = float(env)
            except ValueError:
                raise ValueError(f"ddpviz: {ENV_HANG_TIMEOUT}={env!r} is not a number of "
                                 "seconds.\nSet it to e.g. 60, or 0 to turn the hang watchdog "
                                 "off.") from None
        else:
            return default_hang_timeout(process_group)  # below the group's timeout
    if value <= 0:
        return None
    _warn_past_group_timeout(value, process_group)
    return float(value)


_warned_past: set[float] = set()


def _warn_past_group_timeout(value: float, process_group: dist.ProcessGroup | None) -> None:
    """Say once when a deadline cannot come first: the group's own timeout would end every
    wait before it, with an error that names no rank."""
    group_timeout = process_group_timeout(process_group)
    if group_timeout is None or value < group_timeout or value in _warned_past:
        return
    _warned_past.add(value)
    print(f"ddpviz: hang_timeout={value:g}s is not below the process group's timeout "
          f"({group_timeout:g}s), so torch's own timeout error comes first; ddpviz then names "
          "the ranks that were behind after it. Set hang_timeout (or $DDPVIZ_HANG_TIMEOUT) "
          "below the group's timeout, or leave it unset (0.6 x the group's timeout).",
          file=sys.stderr)


def default_hang_timeout(process_group: dist.ProcessGroup | None = None) -> float:
    """The hang deadline when none is given: PG_FRACTION of the process group's own timeout,
    at most DEFAULT_HANG_TIMEOUT (300 s; also when the group's timeout cannot be read).

    Why 0.6: past the deadline a waiting rank gives the others a grace of a quarter of it
    (1-5 s) to post where they are before it names the laggards, so the verdict comes at
    about 0.75 x the group's timeout, leaving a quarter for store round trips on a loaded
    machine before the backend's own timeout error (which names no rank) fires.
    """
    timeout = process_group_timeout(process_group)
    if timeout is None:
        return DEFAULT_HANG_TIMEOUT
    return min(DEFAULT_HANG_TIMEOUT, PG_FRACTION * timeout)


def process_group_timeout(process_group: dist.ProcessGroup | None = None) -> float | None:
    """The timeout (seconds) the group's backends were created with (`init_process_group(...,
    timeout=)` / `new_group(..., timeout=)`), the smallest over its CPU and CUDA backends;
    None when no group is initialized or torch does not expose it."""
    group = process_group
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.group.WORLD
    if group is None:
        return None
    found: list[float] = []
    for device in ("cpu", "cuda"):
        try:
            options = group._get_backend(torch.device(device)).options
            found.append(options._timeout.total_seconds())
        except (RuntimeError, AttributeError, ValueError, TypeError):
            continue  # no backend for this device type, or an older/newer torch
    positive = [t for t in found if t > 0]
    return min(positive) if positive else None


def describe(position: Position, now: float | None = None) -> str:
    """One rank's position in words ("waiting in the all-reduce of bucket 0 at step 2 ...")."""
    now = time.time() if now is None else now
    at = "in the constructor" if position.step < 0 else f"at step {position.step}"
    if position.state != "running":
        params = position.params
        shown = ", ".join(repr(p) for p in params[:4]) + (", ..." if len(params) > 4 else "")
        for_ = f" for {shown}" if shown else ""
        if position.state == "failed":
            return f"failed in {collective_name(position)} {at}{for_}: {position.error}"
        return (f"waiting in {collective_name(position)} {at}{for_} "
                f"({now - position.since:.1f}s)")
    return f"last seen {at} ({phase_text(position)}, {now - position.t:.1f}s ago)"


def collective_name(position: Position) -> str:
    collective = position.collective or "?"
    bucket = position.bucket
    return f"the {collective} of bucket {bucket}" if bucket >= 0 else f"the {collective}"


def _here(position: Position) -> tuple[int, Collective | None, int]:
    """The collective a waiting rank is in, comparable across ranks."""
    return position.step, position.collective, position.bucket


def _as_dicts(positions: dict[int, Position]) -> dict[int, dict[str, Any]]:
    """Positions as plain data, as RankHangError carries them (picklable, JSON-able)."""
    return {r: msgspec.to_builtins(p) for r, p in positions.items()}


class Watchdog:
    """Deadlines for one DDP's waits on this rank.

    Args:
        process_group: the DDP's group.
        timeout: seconds a collective may take before the ranks are compared (None: no
            watchdog; waits are plain waits, and no store traffic happens).
        tap: receives a FindingReported for every finding raised.
        store: the store to use (default: the group's).
        stack_source: this rank's stacks in hang findings show source text
            (`Recording.stack_source`; False: file:line and function only).
    """

    def __init__(self, process_group: dist.ProcessGroup, *, timeout: float | None,
                 tap: Tap | None = None, store: dist.Store | None = None,
                 stack_source: bool = True) -> None:
        self.group = process_group
        self.stack_source = stack_source
        self.timeout = timeout
        self.tap = tap if tap is not None else Tap()
        self.rank = process_group.rank()
        self.world_size = process_group.size()
        self._store = store
        self.board: Board | None = None
        self.step = -1
        self.phase: Phase = "constructor"
        self.raised: RankHangError | None = None
        self._pulse: Pulse | None = None
        self._own_alert: tuple[str, tuple[Finding, ...]] | None = None
        # fail() was called: the next heartbeat raises (published for watch()'s plain steps,
        # which read it on every step instead of calling heartbeat())
        self.failing = False
        self.guarding = False  # the training thread is in a wait this watchdog guards
        self._left_seen = 0  # the board's news of ranks that left the loop, looked at
        self._left_warned: set[tuple[int, ...]] = set()
        self.quiet: QuietGuard | None = None
        exit_error.watch(self)  # this rank's uncaught exception, in its own words

    @property
    def enabled(self) -> bool:
        return self.timeout is not None and self.world_size > 1

    @property
    def pulse(self) -> Pulse | None:
        """The heartbeat's thread (None: one rank or no watchdog), made once, by start()."""
        return self._pulse

    # --- meeting points -----------------------------------------------------------------------

    def start(self, what: str = "DistributedDataParallel's constructor") -> None:
        """Every rank must get here (or the missing ones are named, on every rank that did);
        then this DDP's notice board opens."""
        if not self.enabled:
            return
        assert self.timeout is not None
        scope = Scope(self.group, store=self._store)
        try:
            epoch = scope.generation("board")
            exchange("ddp", "", timeout=self.timeout, what=what, scope=scope,
                     on_wait=lambda missing, since: self._arrival_notice(missing, since, what))
        except RankHangError as exc:
            self._report(exc)
            raise
        except RuntimeError as exc:  # the store's host (rank 0) is gone already
            raise self._report(store_lost(scope, what, exc)) from exc
        self.board = Board(scope, epoch)
        self._pulse = Pulse(Board(Scope(self.group, store=self._store, clone=True), epoch),
                            stack_source=self.stack_source)
        # At interpreter exit pulse.py's own handler closes every pulse and waits for its
        # thread: a finalizer run then would close it without waiting, and the thread, woken
        # into a last store call, would still be inside C++ when the interpreter finalizes
        # (pthread_exit through C++ frames: SIGABRT, a changed exit code).
        weakref.finalize(self, self._pulse.close, False).atexit = False

    def close(self) -> None:
        """The DDP is no longer watched: the heartbeat's thread stops within
        pulse.CLOSE_GRACE_S (composing the other ranks' last posts until then), not only when
        this watchdog is collected, so a notebook that watches and closes again and again does
        not pile up threads polling the store."""
        if self._pulse is not None:
            self._pulse.close_soon()

    def exchange(self, name: str, payload: str, what: str) -> list[str]:
        """Every rank's payload via the store (not a collective), with the hang timeout."""
        if not self.enabled or self.board is None:
            return [payload]
        assert self.timeout is not None
        self.guarding = True
        try:
            return exchange(name, payload, timeout=self.timeout, what=what,
                            scope=self.board.scope)
        except RankHangError as exc:
            self._report(exc)
            raise
        finally:
            self.guarding = False

    def add_pulse_task(self, task: Callable[[Board], None]) -> bool:
        """Run `task(board)` on the pulse thread after each post (False: no pulse thread,
        i.e. one rank or the watchdog off)."""
        if self._pulse is None:
            return False
        self._pulse.tasks.append(task)
        return True

    def guard_quiet(self) -> None:
        """Name the ranks a step waits for from the pulse thread, for waits this watchdog does
        not see (watch() without a comm hook). See [Note: the quiet guard] in quiet.py."""
        if self._pulse is None or self.timeout is None:
            return
        self.quiet = QuietGuard(self, process_group_timeout(self.group))
        self._pulse.on_quiet = self.quiet
        self._pulse.on_left = self.quiet.left

    def agree_on_unused(self, step: int, missing: Sequence[int], unreachable: Sequence[int],
                        names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                        unhooked: Sequence[int] = ()) -> tuple[str, tuple[Finding, ...]]:
        """Every rank tells the others which parameters got no gradient in this backward
        (find_unused_parameters=False, first iteration) and why (`unreachable`: not used in
        forward); returns the message and findings every rank raises, or ("", ()) when no rank
        missed any. A store exchange, not a collective.
        """
        mine = {"missing": list(missing), "unreachable": list(unreachable),
                "unhooked": list(unhooked)}
        payloads = self.exchange("unused", json.dumps(mine), f"the end of step {step}'s backward")
        per_rank = {r: json.loads(p) for r, p in enumerate(payloads)}
        union = sorted({i for p in per_rank.values() for i in p["missing"]})
        if not union:
            return "", ()
        findings, lines = [], []
        for i in union:
            states = {r: (texts.UNHOOKED if i in p.get("unhooked", ())
                          else "not used in forward" if i in p["unreachable"]
                          else "no gradient reached it in backward") if i in p["missing"]
                      else "got its gradient" for r, p in per_rank.items()}
            unhooked_only = all(i in p.get("unhooked", ()) for p in per_rank.values()
                                if i in p["missing"])
            ranks = tuple(r for r, p in per_rank.items() if i in p["missing"])
            where = format_ranks(ranks)
            values = group_ranks(states)
            findings.append(Finding(
                kind="unused_parameter", severity="error",
                title=f"parameter {i} '{names[i]}' {tuple(shapes[i])} got no gradient on "
                      f"{where} at step {step} (find_unused_parameters=False)",
                ranks=ranks, param=i, name=names[i], field="unused", step=step,
                values=values, fix=texts.UNHOOKED_FIX if unhooked_only
                else fix_for("unused_parameter"), world_size=self.world_size))
            why = "; ".join(f"{v} on {format_ranks(rs)}" for v, rs in values
                            if v != "got its gradient")
            lines.append(f"  parameter {i} '{names[i]}' {tuple(shapes[i])}: {why}")
        ranks = tuple(sorted({r for f in findings for r in f.ranks}))
        head = (f"ddpviz: {len(union)} of {len(names)} parameters got no gradient on "
                f"{format_ranks(ranks)} at step {step} (find_unused_parameters=False, "
                f"world_size={self.world_size}):")
        tail = ("Their buckets were averaged with zeros from those ranks. "
                + (texts.UNHOOKED_FIX if all(f.fix == texts.UNHOOKED_FIX for f in findings)
                   else fix_for("unused_parameter")))
        return "\n".join([head, *lines, tail]), tuple(findings)

    def heartbeat(self, step: int, phase: Phase) -> None:
        """This rank reached `phase` of `step`: handed to the pulse thread, which posts it
        (~1 us here; see pulse.py). Raises the error another rank posted, or store loss, that
        the pulse saw since, so that this rank stops before its next collective."""
        self.step, self.phase = step, phase
        board, pulse = self.board, self._pulse
        if board is None or pulse is None:
            return
        if self._own_alert is not None:  # this rank failed before: no collective can follow
            message, findings = self._own_alert
            if findings and all(f.kind == "unused_parameter" for f in findings):
                raise UnusedParametersError(message, findings)  # what it is, not a hang
            raise self._report(RankHangError(message, findings, {}))
        if pulse.error is not None:
            raise self._report(store_lost(board.scope, f"step {step}", pulse.error)
                               ) from pulse.error
        if pulse.alerted:
            try:
                raise self._from_alerts(None)
            except RankHangError:
                raise
            except RuntimeError as exc:
                raise self._report(store_lost(board.scope, f"step {step}", exc)) from exc
        pulse.beat(step, phase)
        if step < 3 or not step & 63:  # where the loop that runs the steps is (where.py):
            pulse.tracker.note_caller(sys._getframe(1))  # ~5 us, so every 64th step only

    def _hold_pulse(self) -> None:
        """About to post a position from this thread: no heartbeat may overwrite it."""
        if self._pulse is not None:
            self._pulse.hold()

    def fail(self, message: str, findings: Sequence[Finding]) -> None:
        """This rank is about to raise `message`: tell the others (they stop waiting for it)
        and record the findings."""
        for f in findings:
            if self.tap.enabled:
                self.tap.emit(FindingReported, f)
        board = self.board
        if board is None:
            return
        self._own_alert = (message, tuple(findings))
        self.failing = True
        with contextlib.suppress(RuntimeError):  # the store is gone: they see the socket close
            board.post_alert(message, findings)

    # --- waiting ------------------------------------------------------------------------------

    def wait(self, waitable: Any, *, collective: Collective, bucket: int = -1,
             params: Sequence[str] = ()) -> None:
        """Wait for a collective (`dist.Work` or `torch.futures.Future`) with the deadline.

        Raises:
            RankHangError: another rank failed, the collective failed (a rank exited), or it
                did not complete within the hang timeout; names where every rank was.
        """
        future = waitable.get_future() if hasattr(waitable, "get_future") else waitable
        board = self.board
        if board is None or self.timeout is None or future.done():
            self._plain_wait(waitable, collective, bucket, params)
            return
        self.guarding = True
        try:
            self._wait_guarded(waitable, future, board, collective, bucket, params)
        finally:
            self.guarding = False

    def _wait_guarded(self, waitable: Any, future: Any, board: Board, collective: Collective,
                      bucket: int, params: Sequence[str]) -> None:
        assert self.timeout is not None
        done = threading.Event()
        future.add_done_callback(lambda _f: done.set())
        start, since = time.monotonic(), time.time()
        deadline = start + self.timeout
        position = self._position(collective, bucket, params, since=since)
        notice: float | None = start + notice_after(self.timeout)
        while not done.wait(min(_POLL_S, max(0.0, deadline - time.monotonic()))):
            try:
                news = board.news()
                if news.alerts:
                    raise self._from_alerts(position)
                if news.left > self._left_seen:
                    self._left_seen = news.left
                    self._check_left(board, position)
            except RankHangError:
                raise
            except RuntimeError as exc:
                raise self._report(store_lost(board.scope, collective_name(position), exc)
                                   ) from exc
            if notice is not None and time.monotonic() >= notice and not done.is_set():
                notice = None
                self._wait_notice(board, position)
            if time.monotonic() >= deadline:
                raise self._hang(position)
        try:
            waitable.wait()
        except RuntimeError as exc:
            raise self._failed(position, exc) from exc

    # --- live notices (RankWaiting) -----------------------------------------------------------

    def _arrival_notice(self, missing: list[int], since: float, what: str) -> None:
        """Some ranks have not reached the meeting `what` yet: say so live (no raise)."""
        if not self.tap.enabled:
            return
        assert self.timeout is not None
        states = {r: "not arrived yet" if r in missing else "arrived"
                  for r in range(self.world_size)}
        self.tap.emit(FindingReported, self.waiting_finding(
            tuple(missing), what, since, group_ranks(states), step=-1))

    def _wait_notice(self, board: Board, position: Position) -> None:
        """A collective has waited notice_after(timeout) seconds: post this rank's position
        (so the others see it) and say live which ranks are not known to wait here yet."""
        self._hold_pulse()
        try:
            board.post_position(position)
            positions = {**board.positions(), self.rank: position}
        except RuntimeError:
            return  # the store is gone: the next poll reports it
        if not self.tap.enabled:
            return
        now = time.time()
        here = _here(position)
        missing = tuple(r for r in range(self.world_size)
                        if r not in positions or positions[r].state != "waiting"
                        or _here(positions[r]) != here)
        if not missing:
            return
        values = tuple((describe(positions[r], now) if r in positions
                        else "never reported (no DDP step on this rank yet)", (r,))
                       for r in range(self.world_size))
        what = collective_name(position)
        at = f" at step {position.step}" if position.step >= 0 else ""
        self.tap.emit(FindingReported, self.waiting_finding(
            missing, what + at, position.since, values, step=position.step,
            bucket=position.bucket, field=str(position.collective)))

    def waiting_finding(self, missing: tuple[int, ...], what: str, since: float,
                        values: Any, *, step: int, bucket: int = -1, field: str = "arrival",
                        fix: str | None = None) -> Finding:
        assert self.timeout is not None
        waited = time.time() - since
        clock = time.strftime("%H:%M:%S", time.localtime(since))
        return Finding(
            kind="rank_waiting", severity="warning",
            title=(f"rank {self.rank} has waited {waited:.1f}s (since {clock}) in {what} for "
                   f"{format_ranks(missing)}; they are named at {self.timeout:g}s if they do "
                   "not come"),
            ranks=missing, field=field, bucket=bucket, step=step, values=tuple(values),
            fix=fix if fix is not None else fix_for("rank_waiting"),
            world_size=self.world_size)

    def waiter(self, collective: Collective) -> Callable[[Any], None] | None:
        """`wait` for one kind of collective, as a callable (None without a watchdog)."""
        if self.board is None:
            return None

        def wait(work: Any) -> None:
            self.wait(work, collective=collective)

        return wait

    def failed(self, exc: BaseException, *, collective: Collective, bucket: int = -1,
               params: Sequence[str] = ()) -> BaseException:
        """The error to raise for a collective that failed to launch with `exc` (a peer's
        connection closed): a RankHangError naming who went away, or `exc` itself without a
        watchdog."""
        if self.board is None or isinstance(exc, RankHangError):
            return exc
        return self._failed(self._position(collective, bucket, params), exc)

    def _plain_wait(self, waitable: Any, collective: Collective, bucket: int,
                    params: Sequence[str]) -> None:
        try:
            waitable.wait()
        except RuntimeError as exc:
            if self.board is None:
                raise
            raise self._failed(self._position(collective, bucket, params), exc) from exc

    # --- diagnosis ----------------------------------------------------------------------------

    def _position(self, collective: Collective, bucket: int, params: Sequence[str], *,
                  since: float | None = None) -> Position:
        now = time.time()
        return Position("waiting", self.step, self.phase, now, collective, bucket,
                        tuple(params), now if since is None else since)

    def _report(self, exc: RankHangError) -> RankHangError:
        if self.raised is None:
            self.raised = exc
            for f in exc.findings:
                if self.tap.enabled:
                    self.tap.emit(FindingReported, f)
        return exc

    def _gather(self, board: Board, grace: float) -> dict[int, Position]:
        """Positions once every other rank posted a waiting/failed one, or after `grace`."""
        end = time.monotonic() + grace
        while True:
            positions = board.positions()
            settled = all(r in positions and positions[r].state != "running"
                          for r in range(self.world_size) if r != self.rank)
            if settled or time.monotonic() >= end or board.has_alerts():
                return positions
            time.sleep(0.05)

    def _conclude(self, board: Board, proposal: tuple[str, tuple[Finding, ...]],
                  positions: dict[int, Position]) -> RankHangError:
        message, findings = proposal
        data = json.dumps({"message": message,
                           "findings": [_builtins(f) for f in findings]})
        decided = json.loads(board.decide("hang", data))
        if decided["message"] == message:
            board.post_alert(message, findings)
        return self._adopt(board, decided, positions)

    def _adopt(self, board: Board, decided: dict[str, Any],
               positions: dict[int, Position]) -> RankHangError:
        """Raise the verdict; first give the other waiting ranks up to a second to read it
        (the store lives in one of the ranks, usually rank 0: if it raised and exited at once,
        the others would lose the store before reading the verdict)."""
        store = board.scope.store
        alive = 1 + sum(p.state != "running" for r, p in positions.items() if r != self.rank)
        acks = f"{board.base}/verdict/acks"
        end = time.monotonic() + 1.0
        with contextlib.suppress(RuntimeError):
            count = int(store.add(acks, 1))
            while count < alive and time.monotonic() < end:
                time.sleep(0.02)
                count = int(store.add(acks, 0))
        verdict = tuple(_finding(f) for f in decided["findings"])
        return self._report(RankHangError(decided["message"], verdict, _as_dicts(positions)))

    def _from_alerts(self, position: Position | None) -> RankHangError:
        """The error another rank posted, as this rank's (position None: between collectives,
        at a heartbeat)."""
        board = self.board
        assert board is not None
        alerts = board.alerts()
        positions = board.positions()
        store = board.scope.store
        verdict_key = f"{board.base}/verdict/hang"
        if store.check([verdict_key]):
            return self._adopt(board, json.loads(as_text(store.get(verdict_key))), positions)
        others = [r for r in alerts if r != self.rank]
        first = min(others) if others else self.rank
        alert = alerts[first]
        if first == self.rank:  # only this rank failed before: its own error again
            return self._report(RankHangError(str(alert["message"]), alert["findings"],
                                              _as_dicts(positions)))
        if position is None:
            title = (f"rank {first} failed, so rank {self.rank} stops before the collectives of "
                     f"step {self.step}")
        else:
            title = (f"rank {first} failed while rank {self.rank} was "
                     f"{_strip_waited(describe(position))}")
        finding = Finding(
            kind="peer_failed", severity="error", title=title,
            ranks=(first,), step=self.step,
            detail=tuple(str(alert["message"]).splitlines()),
            fix=fix_for("peer_failed", rank=first),
            world_size=self.world_size)
        return self._report(RankHangError(finding.text(), (finding, *alert["findings"]),
                                          _as_dicts(positions)))

    def _check_left(self, board: Board, position: Position) -> None:
        """A rank posted that it left the loop: raise the verdict now when it cannot come
        back (blocked in a torch.distributed call, or exited), else say it once, live."""
        positions = board.positions()
        wheres = whereabouts.read(board, [r for r in range(self.world_size) if r != self.rank])
        finding = whereabouts.left_finding(
            self.rank, position.step, self.world_size, positions, wheres,
            waiting=f"in {collective_name(position)}", bucket=position.bucket)
        if finding is None:
            return
        if finding.severity == "error":
            self._hold_pulse()
            board.post_position(position)
            raise self._conclude(board, (finding.text(), (finding,)), positions)
        if finding.ranks not in self._left_warned:
            self._left_warned.add(finding.ranks)
            if self.tap.enabled:
                self.tap.emit(FindingReported, finding)

    def _left_exit(self, me: Position, positions: dict[int, Position]) -> Finding | None:
        """The uneven_iterations verdict when the ranks that closed their connection had
        posted, at exit, that they ran fewer steps (whereabouts.py); None otherwise."""
        board = self.board
        assert board is not None
        gone = [r for r in range(self.world_size)
                if r != self.rank and (r not in positions or positions[r].state == "running")]
        wheres = whereabouts.read(board, gone)
        if not gone or any(r not in wheres or wheres[r].left != "exited" for r in gone):
            return None
        finding = whereabouts.left_finding(
            self.rank, me.step, self.world_size, positions, wheres,
            waiting=f"in {collective_name(me)}", bucket=me.bucket)
        return finding if finding is not None and finding.severity == "error" else None

    def _hang(self, position: Position) -> RankHangError:
        board = self.board
        assert board is not None and self.timeout is not None
        self._hold_pulse()
        try:
            board.post_position(position)
            positions = self._gather(board, min(5.0, max(1.0, self.timeout / 4)))
            if board.has_alerts() and not board.scope.store.check(
                    [f"{board.base}/verdict/hang"]):
                return self._from_alerts(position)
            message, findings = self._compose_hang(position, positions)
            behind = tuple(r for r in range(self.world_size)
                           if r not in positions or positions[r].state == "running")
            if findings and behind:  # where each rank is, in code (whereabouts.py)
                tracker = self._pulse.tracker if self._pulse is not None else None
                lines = whereabouts.hang_detail(  # (within the verdict's time budget)
                    board, behind, tracker, position.step,
                    grace=min(whereabouts.ANSWER_S, max(1.0, self.timeout / 8)))
                lines += tuple(line for line in collective_check.hang_lines()
                               if line not in findings[0].detail)
                finding = msgspec.structs.replace(findings[0],
                                                  detail=findings[0].detail + lines)
                message, findings = finding.text(), (finding, *findings[1:])
            return self._conclude(board, (message, findings), positions)
        except RankHangError:
            raise
        except RuntimeError as exc:
            return self._report(store_lost(board.scope, collective_name(position), exc))

    def _failed(self, position: Position, exc: BaseException) -> RankHangError:
        """The wait for `position`'s collective ended with `exc`. A peer that closed its
        connection exited; the backend's own timeout (a hang_timeout at or past it) means the
        ranks that never came are behind, whatever closed the connection afterwards, and the
        verdict says whose timeout it was."""
        board = self.board
        assert board is not None
        cause = short_error(exc)
        if timed_out(exc):  # still waiting, as far as the others can tell
            posted = position
            waited = time.time() - position.since if position.since else None

            def compose(positions: dict[int, Position]) -> tuple[str, tuple[Finding, ...]]:
                return self._compose_hang(position, positions, waited=waited, cause=cause)
        else:
            posted = msgspec.structs.replace(position, state="failed", error=cause)

            def compose(positions: dict[int, Position]) -> tuple[str, tuple[Finding, ...]]:
                left = self._left_exit(posted, positions)  # it exited after its loop
                return (left.text(), (left,)) if left else self._compose_exit(posted, positions)
        self._hold_pulse()
        try:
            board.post_position(posted)
            if board.has_alerts():
                return self._from_alerts(position)
            positions = self._gather(board, 2.0)
            if board.has_alerts():
                return self._from_alerts(position)
            return self._conclude(board, compose(positions), positions)
        except RankHangError as err:
            return err
        except RuntimeError as err:
            return self._report(store_lost(board.scope, collective_name(position), err))

    def _compose_hang(self, me: Position, positions: dict[int, Position], *,
                      waited: float | None = None, cause: str = ""
                      ) -> tuple[str, tuple[Finding, ...]]:
        positions = {**positions, self.rank: me}
        now = time.time()
        waiting = {r: p for r, p in positions.items() if p.state != "running"}
        lagging = tuple(r for r in range(self.world_size) if r not in waiting)
        states = {r: describe(positions[r], now) if r in positions
                  else "never reported (no DDP step on this rank yet)"
                  for r in range(self.world_size)}
        values = tuple((states[r], (r,)) for r in range(self.world_size))
        # Name the place after the lowest waiting rank, so whichever rank concludes first
        # proposes the same verdict.
        me = waiting[min(waiting)]
        where = collective_name(me)
        at = f"step {me.step}" if me.step >= 0 else "construction"
        within = f"{self.timeout:g}s" if waited is None else f"{waited:.1f}s"
        detail: tuple[str, ...] = ()
        if cause:
            detail = (f"the process group's own timeout ended the wait first ({cause}), "
                      f"before ddpviz's hang_timeout of {self.timeout:g}s: set hang_timeout "
                      "(or $DDPVIZ_HANG_TIMEOUT) below the group's timeout, or leave it "
                      "unset (0.6 x the group's timeout), for the verdict to come first",)
        steps = [positions[r].step for r in lagging if r in positions]
        behind = not steps or min(steps) < me.step
        verdict = collective_check.hang_verdict() if lagging and not behind else None
        if verdict is not None and verdict.ranks and set(verdict.ranks) <= set(waiting):
            # the job's collectives named the waiting ranks as issuing what the others did
            # not, and the others ran as many steps: they are not behind, the waiting ranks
            # are ahead (a rank a step behind is named as before, the verdict below it)
            title = (f"{format_ranks(verdict.ranks)} issued collectives that "
                     f"{format_ranks(lagging)} did not: {format_ranks(sorted(waiting))} "
                     f"waited {within} in {where} at {at}, which has no partner on "
                     f"{format_ranks(lagging)}")
            finding = Finding(
                kind="rank_hang", severity="error", title=title, ranks=verdict.ranks,
                param=-1, name=(me.params or ("",))[0], field=str(me.collective),
                bucket=me.bucket, step=me.step, values=values,
                detail=(*verdict.lines, *detail), fix=verdict.fix, world_size=self.world_size)
        elif lagging:
            title = f"{format_ranks(lagging)} did not reach {where} at {at} within {within}"
            finding = Finding(
                kind="rank_hang", severity="error", title=title, ranks=lagging,
                param=-1, name=(me.params or ("",))[0], field=str(me.collective),
                bucket=me.bucket, step=me.step, values=values, detail=detail,
                fix=fix_for("rank_hang", "behind" if behind else ""), world_size=self.world_size)
        else:
            places = {r: _here(p) for r, p in waiting.items()}
            groups = group_ranks({r: json.dumps(v) for r, v in places.items()})
            odd = tuple(sorted(r for _, rs in groups[1:] for r in rs))
            title = ("ranks wait in different collectives" if len(groups) > 1
                     else f"every rank waits in {where} at {at} and it does not complete")
            finding = Finding(
                kind="collective_mismatch" if len(groups) > 1 else "rank_hang",
                severity="error", title=title, ranks=odd, field=str(me.collective),
                bucket=me.bucket, step=me.step, values=values,
                fix=(fix_for("collective_mismatch") if len(groups) > 1 else
                     fix_for("rank_hang", "stuck")),
                world_size=self.world_size)
        return finding.text(), (finding,)

    def _compose_exit(self, me: Position, positions: dict[int, Position]
                      ) -> tuple[str, tuple[Finding, ...]]:
        positions = {**positions, self.rank: me}
        now = time.time()
        alive = {r for r, p in positions.items() if p.state != "running"}
        gone = tuple(r for r in range(self.world_size) if r not in alive)
        states: dict[int, str] = {}
        for r in range(self.world_size):
            if r in alive:
                states[r] = describe(positions[r], now)
            elif r in positions:
                states[r] = f"gone; {describe(positions[r], now)}"
            else:
                states[r] = "gone; never reported a position"
        values = tuple((states[r], (r,)) for r in range(self.world_size))
        first = min(alive)
        me = positions[first]
        at = f"step {me.step}" if me.step >= 0 else "construction"
        title = (f"{format_ranks(gone) if gone else 'a rank'} closed its connection while "
                 f"rank {first} waited in {collective_name(me)} at {at}: it exited or "
                 "crashed")
        finding = Finding(
            kind="rank_exited", severity="error", title=title, ranks=gone,
            name=(me.params or ("",))[0], field=str(me.collective), bucket=me.bucket,
            step=me.step, values=values, fix=fix_for("rank_exited"),
            world_size=self.world_size)
        return finding.text(), (finding,)


_CALLBACK_PREFIX = "Got the following error when running the callback: "


def timed_out(exc: BaseException) -> bool:
    """Is `exc` a backend's own collective timeout? gloo says "Timed out waiting 20000ms for
    send operation to complete" or, on the other side of the pair, "Application timeout
    caused pair closure"; NCCL's watchdog "... collective operation timeout ..."."""
    text = str(exc)
    lower = text.lower()
    return ("Timed out waiting" in text or "Application timeout caused pair closure" in text
            or ("timeout" in lower and "collective operation" in lower))


def short_error(exc: BaseException) -> str:
    """A collective's error in a few words: "Connection closed by peer [127.0.0.1]:4321",
    without gloo's source path, chained-future prefixes and advice."""
    text = str(exc).strip()
    while text.startswith(_CALLBACK_PREFIX):
        text = text[len(_CALLBACK_PREFIX):].split(": ", 1)[-1]
    text = text.splitlines()[0] if text else type(exc).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]  # gloo's "[/path/pair.cc:553] "
    return text.split(". This is typically", 1)[0][:160]


def _strip_waited(text: str) -> str:
    return text.rsplit(" (", 1)[0] if text.endswith("s)") else text


def _builtins(finding: Finding) -> Any:
    return msgspec.to_builtins(finding)


def _finding(data: Any) -> Finding:
    return msgspec.convert(data, Finding)
