"""The notebook side of the debugger: `Debugger`, bound to a live Session (`run.debugger`,
`session.debugger`).

Every call sends protocol Commands (ddpviz/debugger/protocol.py) through the collector's
authenticated control path (`Collector.send_control`) and reads the ranks' answers from the
session's event stream, matched by `request` number. A call that needs answers waits for every
rank it was sent to, at most `timeout` seconds, and then names the ranks that stayed silent; a
rank's refusal (`DebugRefused`) is raised with its reason. Commands that need paused ranks
(inspect, fetch, run, stacks, resume, step) say so, and how to pause, when none is parked.
"""

from __future__ import annotations

import base64
import difflib
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ddpviz import events as ev
from ddpviz.debugger import protocol as p
from ddpviz.debugger.compare import Summary, chunk_range, first_difference
from ddpviz.debugger.rank_texts import CodeResult, CodeResults, RankStacks
from ddpviz.debugger.rank_values import RankValues
from ddpviz.debugger.stop import RankStop, Stop, bucket_params, describe_point
from ddpviz.findings import KINDS, format_ranks

if TYPE_CHECKING:
    from ddpviz.session.live import Session

DEFAULT_TIMEOUT = 10.0  # seconds a call waits for every rank's answer
ABORT_TIMEOUT = 10.0  # seconds abort() waits for every rank to end (the ranks promise 5)
_REPLIES = (ev.DebugArmed, ev.Inspected, ev.Fetched, ev.CodeRan, ev.StacksTaken,
            ev.DebugRefused)
_WHERE = ("forward", "bucket", "after_backward", "optimizer_step")


class DebuggerError(RuntimeError):
    """A debugger call could not do what it was asked; the message says why and what to do.
    `ranks`: the ranks concerned (silent, refusing, or not parked)."""

    def __init__(self, message: str, ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(sorted(ranks))


class DebuggerTimeout(DebuggerError, TimeoutError):
    """Some ranks did not answer in time; `ranks` names them."""


class NotPaused(DebuggerError):
    """The call needs every rank parked, and they are not."""


class Debugger:
    """Pause, inspect and resume every rank of a live session, in DDP's terms.

    Args:
        session: the live `Session` the ranks stream into (a `ddpviz.listen()` session, or a
            launch's `run.session`); its collector carries the commands.
        world_size: how many ranks to expect (a launch knows); None: the ranks that connected.
        finished: a function telling whether the job has ended (a launch's `run.done`).
        timeout: default seconds a call waits for every rank's answer.
    """

    def __init__(self, session: Session, *, world_size: int | None = None,
                 finished: Callable[[], bool] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if not hasattr(session.collector, "send_control"):
            raise DebuggerError(
                "ddpviz: this session reads a recording job's files (listen(follow=DIR)) and "
                "cannot send anything to the ranks.\nStart the job with `ddpviz record --debug "
                "--connect` and attach with ddpviz.listen() to debug it.")
        self.session = session
        self._collector: Any = session.collector  # a Collector: send_control
        self.world_size = world_size
        self.timeout = timeout
        self._finished = finished
        self._cv = threading.Condition()
        self._replies: dict[int, dict[int, list[ev.Event]]] = {}  # request -> rank -> events
        self._asked: set[int] = set()  # requests whose replies are kept
        self._watched: dict[int, str] = {}  # requests sent without waiting: name, for refusals
        self._refusals: list[tuple[int, int, str]] = []  # (rank, request, reason) of those
        self._parked: dict[int, RankStop] = {}
        self._left: dict[int, int] = {}  # rank -> Unparked events seen
        self._armed: dict[int, ev.DebugArmed] = {}
        self._params: dict[int, ev.ParamsBuilt] = {}
        self._maps: dict[int, list[ev.BucketAssigned]] = {}
        self._last_step: dict[int, int] = {}
        self._breaks: list[p.ANY_BREAK] = []
        self._unset: dict[int, list[p.ANY_BREAK]] = {}  # SetBreaks request -> the set before
        self._listeners: list[Callable[[], None]] = []
        self._unsubscribe = session.subscribe(self._receive, batch=True, replay=True)

    # --- what the ranks said --------------------------------------------------------------

    def _receive(self, batch: list[ev.Event]) -> None:
        changed = False
        with self._cv:
            for e in batch:
                self._last_step[e.rank] = max(self._last_step.get(e.rank, -1), e.step)
                if isinstance(e, ev.Parked):
                    self._parked[e.rank] = RankStop.of(e)
                    if e.reason.startswith("finding "):
                        # a finding break stops once: the ranks dropped it at this stop, so
                        # the break set says so and break_on(kind) sets it again
                        kind = e.reason.split()[1]
                        self._breaks = [b for b in self._breaks if b != p.BreakOn(kind=kind)]
                    changed = True
                elif isinstance(e, ev.Unparked):
                    self._parked.pop(e.rank, None)
                    self._left[e.rank] = self._left.get(e.rank, 0) + 1
                    changed = True
                elif isinstance(e, _REPLIES):
                    if isinstance(e, ev.DebugArmed):
                        self._armed[e.rank] = e
                    request = e.request
                    if request in self._asked:
                        self._replies.setdefault(request, {}).setdefault(e.rank, []).append(e)
                    if isinstance(e, ev.DebugRefused) and (request in self._watched
                                                            or request == 0):
                        self._refusals.append((e.rank, request, e.reason))
                        changed = True
                elif isinstance(e, ev.ParamsBuilt):
                    self._params[e.rank] = e
                elif isinstance(e, ev.BucketAssigned):
                    self._maps.setdefault(e.rank, []).append(e)
            self._cv.notify_all()
            listeners = list(self._listeners)
        if changed:
            for fn in listeners:
                fn()

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` whenever a rank parks, leaves its park or refuses a break (the
        dashboard's panel redraws so).

        Args:
            callback: called with no argument on the collector's thread; it must not block.

        Returns:
            The function that stops the calls (calling it again does nothing).
        """
        with self._cv:
            self._listeners.append(callback)

        def remove() -> None:
            with self._cv:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

    def _ranks(self) -> tuple[int, ...]:
        """The ranks expected to answer: every rank that connected and has not ended (all of
        0..world_size-1 when the world size is known)."""
        stats = self.session.collector.stats
        if self.world_size is not None:
            return tuple(r for r in range(self.world_size) if r not in stats.closed)
        return tuple(sorted(r for r in stats.received if r not in stats.closed))

    @property
    def parked(self) -> dict[int, RankStop]:
        """Where each rank parked now is (rank -> RankStop); ranks running are absent."""
        with self._cv:
            return dict(self._parked)

    def next_step(self) -> int:
        """The first step no rank has begun yet. While the ranks run, a break set now is agreed
        at their next forward and applies from the step after it: `next_step() + 1` is the
        first step it surely stops (parked ranks apply a break set at once).

        Returns:
            One past the latest step any rank reported (0 before any step).
        """
        with self._cv:
            return max(self._last_step.values(), default=-1) + 1

    @property
    def breaks(self) -> tuple[p.ANY_BREAK, ...]:
        """The break set the ranks were last sent."""
        return tuple(self._breaks)

    @property
    def stop(self) -> Stop | None:
        """Where the ranks are parked now (a `Stop`), or None when no rank is."""
        with self._cv:
            return self._stop_now()

    def _stop_now(self) -> Stop | None:
        if not self._parked:
            return None
        first = min(self._parked)
        s = self._parked[first]
        params = bucket_params(self._params.get(first), self._maps.get(first, ()), s.step,
                               s.bucket) if s.point == "bucket" else ()
        return Stop(self._parked, params)

    def status(self) -> str:
        """Where the ranks are, in one line.

        Returns:
            "running (ranks ...)", "paused at step s, before bucket k's all-reduce on ranks
            ...", or which ranks are parked where and which run.
        """
        with self._cv:
            ranks = self._ranks()
            parked = {r: s for r, s in self._parked.items() if r in ranks or not ranks}
            if not ranks and not parked:
                return "no rank connected" if not self.session.collector.stats.closed \
                    else "the ranks have ended"
            if not parked:
                return f"running ({format_ranks(ranks)})"
            stop = self._stop_now()
            assert stop is not None
            missing = [r for r in ranks if r not in parked]
            if stop.agreed and not missing:
                return f"paused at {stop.where} on {format_ranks(tuple(parked))}"
            text = "; ".join(f"{format_ranks(g.ranks)} parked at {describe_point(*g.value)}"
                             for g in stop.groups)
            if missing:
                text += f"; {format_ranks(missing)} running"
            return text

    def __repr__(self) -> str:
        return f"<ddpviz Debugger: {self.status()}>"

    # --- sending ------------------------------------------------------------------------------

    def _send(self, command: p.Command, rank: int | None = None, *, keep: bool = True,
              watch: str = "") -> tuple[int, ...]:
        with self._cv:
            if keep:
                self._asked.add(command.request)
            if watch:
                self._watched[command.request] = watch
        try:
            sent = self._collector.send_control(rank, [command])
        except ValueError as exc:
            raise DebuggerError(str(exc), () if rank is None else (rank,)) from exc
        if not sent:
            raise DebuggerError("ddpviz: no rank is connected to this session, so there is "
                                "nobody to debug.\nStart the ranks (ddpviz.launch(..., "
                                "debug=True), or `ddpviz record --debug`) and try again.")
        return sent

    def _collect(self, command: p.Command, ranks: tuple[int, ...], timeout: float | None,
                 done: Callable[[list[ev.Event]], bool] | None = None
                 ) -> dict[int, list[ev.Event]]:
        """Wait for every rank's answer to `command` (`done(events)` says when a rank's answer
        is complete: one event unless told); raise for a refusal or silence."""
        complete = done or (lambda events: bool(events))
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        request = command.request
        with self._cv:
            try:
                while True:
                    got = self._replies.get(request, {})
                    refused = {r: e.reason for r, es in got.items() for e in es
                               if isinstance(e, ev.DebugRefused)}
                    if refused:
                        raise DebuggerError(
                            f"ddpviz: {_name(command)} was refused: " + "; ".join(
                                f"rank {r}: {why}" for r, why in sorted(refused.items())),
                            refused)
                    waiting = [r for r in ranks if not complete(got.get(r, []))]
                    if not waiting:
                        return {r: got[r] for r in ranks}
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DebuggerTimeout(
                            f"ddpviz: {format_ranks(waiting)} did not answer {_name(command)} "
                            f"within {limit:g} s ({self._whereabouts(waiting)}).\nA rank busy "
                            "in a long step answers when it reaches a safe point; pass a "
                            "longer timeout=, or see dbg.status().", waiting)
                    self._cv.wait(min(left, 0.1))
            finally:
                self._asked.discard(request)
                self._replies.pop(request, None)

    def _whereabouts(self, ranks: Iterable[int]) -> str:
        closed = self.session.collector.stats.closed
        out = []
        for r in ranks:
            if r in closed:
                out.append(f"rank {r} has ended")
            elif r in self._parked:
                out.append(f"rank {r} parked at {describe_point(*self._parked[r].where)}")
            elif r in self._last_step:
                out.append(f"rank {r} last reported step {self._last_step[r]}")
            else:
                out.append(f"rank {r} never reported")
        return "; ".join(out)

    def _need_pause(self, what: str) -> tuple[Stop, tuple[int, ...]]:
        with self._cv:
            stop = self._stop_now()
            ranks = self._ranks()
            missing = [r for r in ranks if r not in self._parked]
        if stop is None:
            raise NotPaused(f"ddpviz: {what} needs the ranks paused, and none is.\nPause them "
                            "first: dbg.pause() then dbg.wait() (or set a break with "
                            "dbg.break_at(step=..., bucket=...) and dbg.wait()).", ranks)
        if missing:
            raise NotPaused(f"ddpviz: {what} needs every rank paused; {format_ranks(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not ({self.status()}).\n"
                            "Wait for them: dbg.wait().", missing)
        return stop, tuple(sorted(stop.ranks))

    # --- breaks -------------------------------------------------------------------------------

    def break_at(self, step: int, bucket: int | None = None, *,
                 where: str | None = None) -> p.BreakAt:
        """Stop every rank at one safe point of step `step`. Adds to the break set; the ranks
        apply it from a step boundary they all agree on.

        Args:
            step: the DDP iteration (0 first); not one every rank has passed.
            bucket: stop before this bucket's all-reduce (buckets in launch order, 0 first).
            where: "bucket" (the default with `bucket`), "forward" (before DDP's forward),
                "after_backward" (every bucket's all-reduce complete, before the optimizer
                step: each bucket's buffer holds its all-reduced values) or "optimizer_step"
                (after the optimizer step).

        Returns:
            The break as sent (a protocol BreakAt).

        Raises:
            ValueError: a bad step, bucket or point, or a step every rank has passed.
            DebuggerError: the ranks' DDP has no safe points around a bucket's all-reduce
                (bucket, after_backward: the hook-less watch()).
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"ddpviz: break_at(step=) takes a step number >= 0, got {step!r}.")
        if where is None:
            where = "bucket" if bucket is not None else ""
        if where not in _WHERE:
            raise ValueError(f"ddpviz: break_at needs a bucket or a point; got bucket={bucket!r}, "
                             f"where={where!r}.\nPass bucket=K (before bucket K's all-reduce) "
                             "or where='forward' / 'after_backward' / 'optimizer_step'.")
        if where != "bucket" and bucket is not None:
            raise ValueError(f"ddpviz: bucket= goes with where='bucket' only, not "
                             f"where={where!r}.")
        if where == "bucket" and (isinstance(bucket, bool) or not isinstance(bucket, int)
                                  or bucket < 0):
            raise ValueError(f"ddpviz: break_at(bucket=) takes a bucket index >= 0 "
                             f"(0 is all-reduced first), got {bucket!r}.")
        if where in ("bucket", "after_backward"):
            armed = self._arm()  # a rank says whether its DDP has bucket safe points
            no_points = sorted(r for r, a in armed.items() if a.ddp and not a.bucket_points)
            if no_points:
                raise DebuggerError(
                    f"ddpviz: {format_ranks(no_points)} watch torch's DDP without a comm hook "
                    "(the default hook-less watch()), which has no safe point "
                    + ("before a bucket's all-reduce" if where == "bucket" else
                       "where every bucket's all-reduce is complete")
                    + ".\nBreak at where='forward' or where='optimizer_step', or watch with "
                    "ddpviz.watch(ddp, guard=True).", no_points)
        with self._cv:
            ranks = self._ranks()
            now = min((self._last_step.get(r, -1) for r in ranks), default=-1)
        if step < now:
            raise ValueError(f"ddpviz: every rank is past step {step} already (they are at "
                             f"step {now} or later), so the break would never stop them.\n"
                             f"Break at step {now + 2} or later (dbg.next_step() + 1).")
        brk = p.BreakAt(step=step, where=where, bucket=-1 if bucket is None else bucket)  # type: ignore[arg-type]
        self._add_break(brk)
        return brk

    def break_on(self, kind: str) -> p.BreakOn:
        """Stop every rank at the next forward after any rank says a finding of `kind`.

        Args:
            kind: a finding kind of `ddpviz.findings.KINDS`, e.g. "nonfinite_gradient",
                "replicas_diverged".

        Returns:
            The break as sent (a protocol BreakOn).
        """
        if kind not in KINDS:
            close = difflib.get_close_matches(str(kind), list(KINDS), n=3)
            raise ValueError(f"ddpviz: {kind!r} is not a finding kind"
                             + (f"; did you mean {', '.join(map(repr, close))}?" if close else ".")
                             + "\nThe kinds are listed in ddpviz.findings.KINDS.")
        brk = p.BreakOn(kind=kind)
        self._add_break(brk)
        return brk

    def break_when(self, predicate: str) -> p.BreakWhen:
        """Stop every rank at a forward soon after `predicate` is true on any rank.

        Args:
            predicate: a Python expression over the training loop's own local names (`loss`,
                the batch, the loop variable: those of the first frame outside torch and
                ddpviz, read and never written) and ddpviz's (`output`, `step`, `rank`,
                `world_size`, `model`, `ddp`, `optimizer`, `torch`), evaluated on every rank
                after each forward and after each optimizer step. True after the forward of
                step s: every rank stops before the forward of s + 1; true after the optimizer
                step of s (where the loop's `loss` is step s's): before the forward of s + 2
                (another rank may already be in step s + 1's forward).

        Returns:
            The break as sent (a protocol BreakWhen).
        """
        if not isinstance(predicate, str) or not predicate.strip():
            raise ValueError(f"ddpviz: break_when takes an expression as a string, e.g. "
                             f"'loss > 10'; got {predicate!r}.")
        try:
            compile(predicate, "<break_when>", "eval")
        except SyntaxError as exc:
            raise ValueError(f"ddpviz: break_when({predicate!r}) is not a Python expression: "
                             f"{exc.msg}.\nPass one expression, e.g. 'loss.item() > 10'.") from exc
        brk = p.BreakWhen(predicate=predicate)
        self._add_break(brk)
        return brk

    def _arm(self, wait: float = 1.0) -> dict[int, ev.DebugArmed]:
        """Arm the ranks not yet armed (`Arm`; a rank answers `DebugArmed`, which DDP it
        watches and whether it has bucket safe points, at its next safe point) and wait up to
        `wait` s for their answers. Returns the DebugArmed known by rank (a rank not training
        yet answers later: its refusal of a break then comes through `wait()`)."""
        ranks = self._ranks()
        with self._cv:
            missing = [r for r in ranks if r not in self._armed]
        if missing:
            self._send(p.Arm(request=p.next_request()), keep=False)
            deadline = time.monotonic() + wait
            with self._cv:
                while any(r not in self._armed for r in missing):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(min(left, 0.05))
        with self._cv:
            return {r: self._armed[r] for r in ranks if r in self._armed}

    def _add_break(self, brk: p.ANY_BREAK) -> None:
        if brk not in self._breaks:
            self._send_breaks([*self._breaks, brk])

    def clear(self) -> None:
        """Remove every break (the ranks drop them from an agreed boundary on)."""
        self._send_breaks([])

    def _send_breaks(self, breaks: list[p.ANY_BREAK]) -> None:
        cmd = p.SetBreaks(request=p.next_request(), breaks=tuple(breaks))
        self._unset[cmd.request] = list(self._breaks)  # what stands if a rank refuses it
        self._send(cmd, keep=False, watch="the break set")
        self._breaks = list(breaks)

    # --- pause and wait -----------------------------------------------------------------------

    def pause(self) -> None:
        """Ask every rank to stop at the next forward every rank can reach; `wait()` for it."""
        self._send(p.Pause(request=p.next_request()), keep=False, watch="pause")

    def wait(self, timeout: float = 30.0) -> Stop:
        """Block until every rank is parked at the same safe point, and say where.

        Args:
            timeout: the most seconds to wait.

        Returns:
            Where every rank parked and why, with the bucket's parameters by name.

        Raises:
            DebuggerTimeout: not every rank parked within `timeout` s (names those that did not,
                and where they were).
            DebuggerError: a rank refused the break set or the pause (its reason), or the ranks
                ended first.
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                if self._refusals:
                    rank, request, reason = self._refusals.pop(0)
                    if request in self._unset:  # the ranks keep the set before it
                        self._breaks = self._unset.pop(request)
                    what = self._watched.get(request, "a break")
                    raise DebuggerError(f"ddpviz: rank {rank} refused {what}: {reason}",
                                        (rank,))
                ranks = self._ranks()
                stop = self._stop_now()
                if ranks and stop is not None and stop.agreed and all(
                        r in self._parked for r in ranks):
                    return stop
                # (a launched run says when it is over; a recorded job's ranks have ended
                # when every one that connected closed its link: none yet is a job starting)
                ended = self._finished() or not ranks if self._finished is not None else \
                    not ranks and bool(self.session.collector.stats.closed)
                if ended:
                    raise DebuggerError("ddpviz: the ranks ended before every one stopped ("
                                        f"{self.status()}); nothing is paused.")
                left = deadline - time.monotonic()
                if left <= 0 and not ranks:  # (a job just started: its ranks connect later)
                    raise DebuggerTimeout(
                        f"ddpviz: no rank connected within {timeout:g} s.\nStart the job with "
                        "`ddpviz record --debug --connect` and this session's connect string "
                        "(or launch(..., debug=True)), then wait again.", ())
                if left <= 0:
                    waiting = [r for r in ranks if r not in self._parked] or list(ranks)
                    raise DebuggerTimeout(
                        f"ddpviz: not every rank stopped within {timeout:g} s: "
                        f"{self._whereabouts(waiting)}.\nA break that is never reached never "
                        "stops: check dbg.breaks, or dbg.pause() to stop at the next step.",
                        waiting)
                self._cv.wait(min(left, 0.1))

    # --- while paused: look -------------------------------------------------------------------

    def param_names(self) -> list[str]:
        """The parameters the ranks' DDP reduces.

        Returns:
            Their dotted names, sorted (from the ranks' ParamsBuilt; empty before it came).
        """
        with self._cv:
            return sorted({q.name for b in self._params.values() for q in b.params})

    def _check_name(self, name: str) -> int | None:
        """The bucket holding parameter `name` at the stop (None: unknown); raises for a name
        no rank reported, with the closest ones."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"ddpviz: name a parameter by its dotted name (as in "
                             f"model.named_parameters()), got {name!r}.")
        names = set(self.param_names())
        if names and name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=3)
            raise ValueError(f"ddpviz: no parameter {name!r} in the run's DDP"
                             + (f"; did you mean {', '.join(map(repr, close))}?" if close
                                else f" ({len(names)} parameters)") + "\nUse a name from "
                             "model.named_parameters(), without the 'module.' prefix.")
        rank = min(self._params) if self._params else None
        if rank is None or not self._maps.get(rank):
            return None
        index = next((q.index for q in self._params[rank].params if q.name == name), None)
        step = self._last_step.get(rank, 0)
        maps = [m for m in self._maps[rank] if m.step <= step] or self._maps[rank][:1]
        return next((b for b, held in enumerate(maps[-1].buckets) if index in held), None)

    def inspect(self, name: str, what: str = "value", *, bucket: int = -1, state_key: str = "",
                locate: bool = True, timeout: float | None = None) -> RankValues:
        """A parameter (or bucket tensor) on every paused rank, summarised and compared: norms,
        NaN/Inf counts and positions, finiteness maps, bitwise groups (digests) and, with
        `locate`, the first differing element (one chunk fetched from two ranks per group).

        Args:
            name: the parameter's dotted name ("" with a bucket `what`).
            what: "value", "grad", "grad_before_allreduce", "bucket_buffer", "bucket_grads" or
                "optimizer_state".
            bucket: the bucket, for "bucket_buffer" / "bucket_grads".
            state_key: the optimizer state's key (e.g. "exp_avg"), for "optimizer_state".
            locate: where ranks differ, fetch one chunk from two ranks to name the first
                differing element (bounded: 1/256 of the tensor).
            timeout: seconds to wait for every rank's answer (default: the Debugger's).

        Returns:
            Each rank's summary side by side, compared, as `RankValues`.

        Raises:
            NotPaused: not every rank is parked.
            DebuggerTimeout: a rank did not answer (named).
        """
        if what not in p.What.__args__:  # type: ignore[attr-defined]
            raise ValueError(f"ddpviz: what={what!r} is not a tensor the ranks can inspect; "
                             f"use one of {', '.join(p.What.__args__)}.")  # type: ignore[attr-defined]
        bucket_what = what in ("bucket_buffer", "bucket_grads")
        if bucket_what:
            if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
                raise ValueError(f"ddpviz: inspecting a {what} needs bucket=K (K >= 0), got "
                                 f"{bucket!r}: dbg.inspect_bucket(K).")
            held = None
        else:
            held = self._check_name(name)
        stop, ranks = self._need_pause("inspect")
        cmd = p.Inspect(request=p.next_request(), name=name if not bucket_what else "",
                        what=what, bucket=bucket if bucket_what else -1,  # type: ignore[arg-type]
                        state_key=state_key)
        self._send(cmd)
        replies = self._collect(cmd, ranks, timeout)
        summaries: dict[int, Summary] = {}
        errors: dict[int, str] = {}
        for r, es in replies.items():
            e = es[0]
            assert isinstance(e, ev.Inspected)
            if e.error:
                errors[r] = e.error
            else:
                summaries[r] = Summary.of(e)
        values = RankValues(name, what, summaries, errors=errors, stop=stop, bucket=bucket,
                            bucket_of_param=held)
        diffs = values.comparison.differences
        if locate and diffs:
            d = diffs[0]
            pair = (d.against[0], d.ranks[0])
            ref = summaries[pair[0]]
            data = self._fetch_raw(p.Fetch(request=p.next_request(), name=cmd.name, what=what,  # type: ignore[arg-type]
                                           bucket=cmd.bucket, state_key=state_key,
                                           chunk=d.chunk), pair, timeout)
            start, _ = chunk_range(ref, d.chunk)
            values.difference = first_difference({r: b for r, (b, _, _) in data.items()},
                                                 ref.dtype, start, ref.shape)
        return values

    def inspect_bucket(self, bucket: int, what: str = "bucket_buffer", *,
                       timeout: float | None = None) -> RankValues:
        """A bucket's tensor on every paused rank, compared (see `inspect`).

        Args:
            bucket: the bucket (launch order, 0 first).
            what: "bucket_buffer" (its flat buffer) or "bucket_grads" (its parameters'
                gradients concatenated).
            timeout: seconds to wait for every rank's answer.

        Returns:
            The `RankValues`.
        """
        if what not in ("bucket_buffer", "bucket_grads"):
            raise ValueError(f"ddpviz: inspect_bucket(what=) is 'bucket_buffer' or "
                             f"'bucket_grads', got {what!r}.")
        return self.inspect("", what, bucket=bucket, timeout=timeout)

    def optimizer_state(self, name: str, key: str = "", *,
                        timeout: float | None = None) -> RankValues:
        """An optimizer state tensor of one parameter on every paused rank (see `inspect`).

        Args:
            name: the parameter's dotted name.
            key: the state's key, e.g. "exp_avg" ("": the first tensor it holds).
            timeout: seconds to wait for every rank's answer.

        Returns:
            The `RankValues`.
        """
        return self.inspect(name, "optimizer_state", state_key=key, timeout=timeout)

    def fetch(self, name: str, what: str = "value", *, bucket: int = -1, state_key: str = "",
              start: int = 0, stop: int = 0, max_elements: int = p.DEFAULT_FETCH_ELEMENTS,
              ranks: Iterable[int] | None = None, timeout: float | None = None
              ) -> dict[int, Any]:
        """The tensor itself from every paused rank, bounded.

        Args:
            name: the parameter's dotted name ("" for a bucket's tensor).
            what: as for `inspect`.
            bucket: the bucket, for "bucket_buffer" / "bucket_grads".
            state_key: the optimizer state's key, for "optimizer_state".
            start: first flat element of a slice (with `stop`; both 0: the whole tensor).
            stop: one past the slice's last flat element.
            max_elements: the most elements a rank sends; above it the rank refuses and
                says which slice to ask for instead.
            ranks: only these ranks (default: every paused rank).
            timeout: seconds to wait for every rank's answer.

        Returns:
            Each rank's tensor by rank, a torch tensor when torch is installed here (else a
            numpy array), shaped as on the rank when whole, flat for a slice.
        """
        if not what.startswith("bucket"):
            self._check_name(name)
        _, paused = self._need_pause("fetch")
        targets = tuple(sorted(ranks)) if ranks is not None else paused
        cmd = p.Fetch(request=p.next_request(), name=name, what=what, bucket=bucket,  # type: ignore[arg-type]
                      state_key=state_key, start=start, stop=stop, max_elements=max_elements)
        out = {}
        for r, (data, dtype, shape) in self._fetch_raw(cmd, targets, timeout).items():
            out[r] = _tensor(data, dtype, shape if not (start or stop) else (-1,))
        return out

    def _fetch_raw(self, cmd: p.Fetch, ranks: tuple[int, ...], timeout: float | None
                   ) -> dict[int, tuple[bytes, str, tuple[int, ...]]]:
        """{rank: (bytes, dtype, shape)} of one Fetch, its parts joined in order."""
        def done(events: list[ev.Event]) -> bool:
            parts = [e for e in events if isinstance(e, ev.Fetched)]
            return bool(parts) and (bool(parts[0].error) or len(parts) >= parts[0].parts)

        with self._cv:
            self._asked.add(cmd.request)
        for r in ranks:
            self._send(cmd, r)
        replies = self._collect(cmd, ranks, timeout, done)
        out = {}
        for r, es in replies.items():
            parts = sorted((e for e in es if isinstance(e, ev.Fetched)), key=lambda e: e.part)
            if parts[0].error:
                raise DebuggerError(f"ddpviz: rank {r} did not send {cmd.name or 'the bucket'}'s "
                                    f"{cmd.what}: {parts[0].error}", (r,))
            out[r] = (b"".join(base64.b64decode(e.data) for e in parts), parts[0].dtype,
                      tuple(parts[0].shape))
        return out

    def stacks(self, *, timeout: float | None = None) -> RankStacks:
        """Every thread's stack on every paused rank.

        Args:
            timeout: seconds to wait for every rank's answer.

        Returns:
            Each rank's (thread name, stack text) pairs by rank, as `RankStacks` (shown
            grouped).
        """
        _, ranks = self._need_pause("stacks")
        cmd = p.Stacks(request=p.next_request())
        self._send(cmd)
        out = RankStacks()
        for r, es in self._collect(cmd, ranks, timeout).items():
            e = es[0]
            assert isinstance(e, ev.StacksTaken)
            out[r] = tuple(zip(e.threads, e.stacks, strict=False))
        return out

    def run(self, code: str, *, timeout: float | None = None) -> CodeResults:
        """Run code on every paused rank's training thread; what it changes stays changed.

        Args:
            code: Python statements; the namespace holds `model`, `ddp`, `step`, `rank`,
                `loss`, `optimizer`, `torch`, ... and persists within one park.
            timeout: seconds to wait for every rank's answer.

        Returns:
            What each rank printed, its last expression's repr and its error, by rank, as
            `CodeResults` (shown grouped).
        """
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"ddpviz: run() takes Python code as a string, got {code!r}.")
        try:
            compile(code, "<dbg.run>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"ddpviz: the code does not parse: {exc.msg} (line {exc.lineno})."
                             "\nNothing was sent to the ranks.") from exc
        _, ranks = self._need_pause("run")
        cmd = p.RunCode(request=p.next_request(), code=code)
        self._send(cmd)
        results = {}
        for r, es in self._collect(cmd, ranks, timeout).items():
            results[r] = CodeResult.of(es[0])
        return CodeResults(code, results)

    # --- go on --------------------------------------------------------------------------------

    def _leave(self, command: p.Command, what: str, timeout: float | None) -> None:
        """Send `command` to the parked ranks and wait until each has left its park."""
        _, ranks = self._need_pause(what)
        with self._cv:
            before = {r: self._left.get(r, 0) for r in ranks}
        self._send(command, watch=what)
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cv:
            try:
                while True:
                    refused = [(r, why) for r, es in self._replies.get(
                        command.request, {}).items() for e in es
                        if isinstance(e, ev.DebugRefused) for why in (e.reason,)]
                    if refused:
                        raise DebuggerError(f"ddpviz: {what} was refused: " + "; ".join(
                            f"rank {r}: {why}" for r, why in refused), [r for r, _ in refused])
                    # a rank has left once its Unparked arrived
                    still = [r for r in ranks if self._left.get(r, 0) <= before[r]]
                    if not still:
                        return
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DebuggerTimeout(f"ddpviz: {format_ranks(still)} did not leave "
                                              f"the park within {limit:g} s after {what}.",
                                              still)
                    self._cv.wait(min(left, 0.1))
            finally:
                self._asked.discard(command.request)
                self._replies.pop(command.request, None)

    def resume(self, *, timeout: float | None = None) -> None:
        """Let every rank go on; the run continues exactly as if it had never stopped. Breaks
        stay set (`clear()` removes them).

        Args:
            timeout: seconds to wait for every rank to leave its park.
        """
        self._leave(p.Resume(request=p.next_request()), "resume", timeout)

    def step(self, to: str = "step", *, timeout: float = 30.0, wait: bool = True) -> Stop | None:
        """Go on to the next safe point of a kind and stop there.

        Args:
            to: "bucket" (before the next bucket's all-reduce), "step" (before the next
                forward) or "finding" (the end of the step where the next finding is said).
            timeout: the most seconds to wait for the new stop.
            wait: wait for the new stop; False: return once every rank has left its park.

        Returns:
            The new `Stop` (None with `wait=False`).
        """
        if to not in p.StepTo.__args__:  # type: ignore[attr-defined]
            raise ValueError(f"ddpviz: step(to={to!r}): use 'bucket', 'step' or 'finding'.")
        self._leave(p.Step(request=p.next_request(), to=to), f"step to the next {to}",  # type: ignore[arg-type]
                    None)
        return self.wait(timeout) if wait else None

    def abort(self, *, timeout: float = ABORT_TIMEOUT, wait: bool = True) -> tuple[int, ...]:
        """End every rank: parked ranks raise `ddpviz.debugger.Aborted` out of their park,
        others are ended by their control thread; events are flushed and traces saved first.

        Args:
            timeout: the most seconds to wait for every rank to end.
            wait: wait for them; False: return once the command is sent.

        Returns:
            The ranks that ended (with `wait=False`, those the command went to).

        Raises:
            DebuggerTimeout: ranks still running after `timeout` (named).
        """
        ranks = self._ranks()
        sent = self._send(p.Abort(request=p.next_request()), keep=False, watch="abort")
        if not wait:
            return sent
        deadline = time.monotonic() + timeout
        while True:
            if self._finished is not None and self._finished():
                return ranks
            closed = self.session.collector.stats.closed
            left_running = [r for r in ranks if r not in closed]
            if not left_running and self._finished is None:
                return ranks
            if time.monotonic() >= deadline:
                raise DebuggerTimeout(f"ddpviz: {format_ranks(left_running or list(ranks))} "
                                      f"still running {timeout:g} s after abort.",
                                      left_running or ranks)
            time.sleep(0.05)

    def close(self) -> None:
        """Stop reading the session's events (the ranks are left as they are)."""
        self._unsubscribe()


def _name(command: p.Command) -> str:
    return type(command).__name__


def _tensor(data: bytes, dtype: str, shape: tuple[int, ...]) -> Any:
    """Fetched bytes as a torch tensor when torch is installed here, else a numpy array."""
    try:
        import torch
    except ImportError:
        from ddpviz.debugger.compare import decode

        return decode(data, dtype).reshape(shape)
    tdtype = getattr(torch, dtype.removeprefix("torch."))
    if not data:
        return torch.empty(shape if -1 not in shape else (0,), dtype=tdtype)
    return torch.frombuffer(bytearray(data), dtype=tdtype).reshape(shape)
