"""Every rank's whereabouts on the DDP's notice board: its stack when a waiting rank asks, and
the news that it left the loop that calls the DDP (or exited) while its peers may go on.

Keys under the board (rendezvous.Board): `where/<rank>`, one JSON `Where` per rank, overwritten.
A waiting rank asks with `request` (the STACK_REQUEST field of the board's counter: See [Note: one
counter] in rendezvous.py); every rank's pulse thread answers at its next look (`Tracker.tick`,
at most CHECK_S later) with the stack of its training thread (where.py). A rank whose training
thread has left its loop posts that once, with the LEFT_NEWS field, and the waiting ranks compare
step counts (`left_finding`). See [Note: stacks from the pulse thread] and [Note: has it left the
loop?] in where.py.
"""

from __future__ import annotations

import sys
import threading
import time
from types import FrameType

import msgspec

from ddpviz.findings import Finding, fix_for, format_ranks
from ddpviz.limits import Lines, Name, Step, Text
from ddpviz.probes import stack_text as st
from ddpviz.probes import stuck_stack
from ddpviz.probes import where as wh
from ddpviz.probes.rendezvous import LEFT_NEWS, STACK_REQUEST, Board, News, Position

MAX_POSTED = 64 << 10  # bytes of one rank's posted whereabouts read back
ANSWER_S = 2.0  # how long a waiting rank waits for the stacks it asked for


class Where(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where one rank's training thread is (posted by its pulse thread)."""

    step: Step  # the last step whose forward it ran (-1: none yet)
    t: float  # time.time() when taken
    summary: Text = ""  # one line: user frames innermost first (stack_text.summary)
    stack: Lines = ()  # folded, bounded traceback lines (stack_text.stack_lines)
    answers: int = 0  # the stack request this answers (News.requests)
    left: Name = ""  # "returned", "after" (left the loop), "exited", "crashed"; "" in it
    loop: Text = ""  # the loop it left, described
    blocked: Name = ""  # the torch.distributed call it is blocked in ("barrier"), or ""

    def gone_for_good(self) -> bool:
        """It left and cannot come back to the DDP without its peers."""
        return self.left in ("exited", "crashed") or (bool(self.left) and bool(self.blocked))


_decode = msgspec.json.Decoder(Where).decode


def post(board: Board, where: Where) -> None:
    board.post("where", msgspec.json.encode(where).decode())


def read(board: Board, ranks: list[int] | tuple[int, ...]) -> dict[int, Where]:
    """The whereabouts `ranks` posted (absent: never posted, or not a valid post)."""
    return board.posts("where", _decode, ranks, max_bytes=MAX_POSTED)


def request(board: Board) -> int:
    """Ask every rank for its stack; returns the request's number."""
    return board.news(STACK_REQUEST).requests


def collect(board: Board, ranks: list[int] | tuple[int, ...], *, grace: float = ANSWER_S
            ) -> dict[int, Where]:
    """Ask `ranks` for their stacks and wait up to `grace` seconds for the answers; returns what
    came (a rank that did not answer is absent). Raises RuntimeError when the store is gone."""
    if not ranks:
        return {}
    asked = request(board)
    end = time.monotonic() + grace
    got: dict[int, Where] = {}
    while True:
        got = {r: w for r, w in read(board, ranks).items() if w.answers >= asked}
        if len(got) == len(ranks) or time.monotonic() >= end:
            return got
        time.sleep(0.05)


class Tracker:
    """On the pulse thread: answers stack requests and tells when the training thread has left
    its loop. `note_caller` is called by the training thread at its first forwards. `source`:
    the stacks it takes show each user frame's source text (`Recording.stack_source`)."""

    def __init__(self, thread_id: int, *, source: bool = True) -> None:
        self.thread_id = thread_id
        self.source = source
        self._chain: list[tuple[object, int]] | None = None
        self._loop: wh.Loop | None = None
        self._answered = 0
        self._left: tuple[str, str] = ("", "")

    def note_caller(self, frame: FrameType | None) -> None:
        """The training thread calls the DDP from `frame`'s callers (steps 0-2; the loop is
        read later, on the pulse thread)."""
        loop = self._loop
        if loop is not None and wh.in_loop(loop, frame):
            return  # the same loop (most calls): nothing to read again
        self._chain = wh.caller_chain(frame)  # type: ignore[assignment]
        self._loop = None

    @property
    def loop(self) -> wh.Loop | None:
        if self._loop is None and self._chain:
            self._loop = wh.find_loop(self._chain)  # type: ignore[arg-type]
            self._chain = None if self._loop is not None else []
        return self._loop

    def take(self, step: int, **fields: object) -> Where:
        frame = wh.thread_frame(self.thread_id)
        stack = wh.frames(frame)
        return Where(step, time.time(), st.summary(stack),
                     tuple(st.stack_lines(stack, source=self.source)),
                     blocked=wh.blocked_in(stack), **fields)  # type: ignore[arg-type]

    def tick(self, board: Board, news: News, step: int, quiet: bool) -> None:
        """One look (pulse thread): answer a pending request; post once when the training
        thread, quiet, has left its loop (or moved, having left, into a blocking call)."""
        if news.requests > self._answered:
            self._answered = news.requests
            post(board, self.take(step, answers=news.requests, **self._left_fields()))
        if not quiet or step < 0:
            return
        loop = self.loop
        if loop is None:
            return
        frame = wh.thread_frame(self.thread_id)
        left = wh.left_loop(loop, frame)
        if left and getattr(threading, "_SHUTTING_DOWN", False):
            # the interpreter is exiting (atexit handlers run, ddpviz's own among them): it
            # cannot come back, whatever frame its handlers show; an uncaught exception ended
            # it: a crash, which exit_error.py names, not a rank that left the loop
            left = _how_it_ends()
        blocked = wh.blocked_in(wh.frames(frame)) if left else ""
        if (left, blocked) != self._left and (left or self._left[0]):
            self._left = (left, blocked)
            post(board, self.take(step, answers=self._answered, **self._left_fields()))
            board.news(LEFT_NEWS)

    def _left_fields(self) -> dict[str, object]:
        left = self._left[0]
        loop = self._loop
        return {"left": left, "loop": loop.describe() if left and loop is not None else ""}

    def exiting(self, board: Board, step: int) -> None:
        """The process is exiting (atexit): say so, and whether an exception ended it."""
        if step < 0:
            return
        loop = self._loop
        post(board, Where(step, time.time(), "exiting", answers=self._answered,
                          left=_how_it_ends(),
                          loop=loop.describe() if loop is not None else ""))
        board.news(LEFT_NEWS)


def _how_it_ends() -> str:
    """At exit: "crashed" when an uncaught exception ends the process, else "exited"."""
    return "crashed" if getattr(sys, "last_value", None) is not None else "exited"


def left_finding(rank: int, step: int, world_size: int, positions: dict[int, Position],
                 wheres: dict[int, Where], *, waiting: str = "", bucket: int = -1,
                 field: str = "left_loop") -> Finding | None:
    """The ranks that left the loop (or exited) before `step`, which `rank` runs: an
    uneven_iterations finding (an error when they cannot come back: blocked in a
    torch.distributed call or exited; a warning otherwise), or None. `waiting`: where `rank`
    waits ("in the all-reduce of bucket 0"), when known."""
    left = {}
    for r, w in wheres.items():
        if r == rank or not w.left or w.left == "crashed" or w.step >= step:
            continue  # (a crash is no exit from the loop: rank_exited says what it is)
        p = positions.get(r)
        if p is not None and p.step > w.step:
            continue  # it ran a later step since: it came back
        left[r] = w
    if not left:
        return None
    ranks = tuple(sorted(left))
    certain = all(w.gone_for_good() for w in left.values())
    states: dict[int, str] = {}
    for r in range(world_size):
        gone = left.get(r)
        p = positions.get(r)
        if gone is not None:
            what = {"exited": "then its process exited", "crashed": "then its process crashed",
                    }.get(gone.left, f"then left {gone.loop or 'its loop'}")
            at = f": it is at {gone.summary}" if gone.left in ("returned", "after") else ""
            states[r] = f"ran {gone.step + 1} steps (0-{gone.step}), {what}{at}"
        elif r == rank:
            states[r] = f"runs step {step}" + (f", waiting {waiting}" if waiting else "")
        elif p is not None:
            states[r] = f"at step {p.step} ({p.state})"
        else:
            states[r] = "never reported"
    values = tuple((states[r], (r,)) for r in range(world_size))
    first = left[ranks[0]]
    counts = sorted({w.step + 1 for w in left.values()})
    after = " or ".join(map(str, counts))
    why = ("it is blocked in torch.distributed's " + first.blocked if first.blocked else
           "its process " + ("exited" if first.left == "exited" else "crashed")
           if first.left in ("exited", "crashed") else "it may come back, so ddpviz waits")
    detail: list[str] = []
    for r in ranks:
        w = left[r]
        if w.stack:
            detail.append(f"rank {r}'s stack (most recent call last):")
            detail += [f"  {line}" for line in w.stack]
    return Finding(
        kind="uneven_iterations", severity="error" if certain else "warning",
        title=(f"{format_ranks(ranks)} left the training loop after {after} steps while rank "
               f"{rank} went on to step {step}: {why}"
               + ("; this step can never complete" if certain else "")),
        ranks=ranks, field=field, bucket=bucket, step=step, values=values,
        detail=tuple(detail),
        fix=fix_for("uneven_iterations", "left_loop"), world_size=world_size)


def stack_detail(wheres: dict[int, Where], behind: tuple[int, ...] | list[int], rank: int,
                 own: Where | None, world_size: int,
                 rescued: dict[int, stuck_stack.Rescue] | None = None) -> tuple[str, ...]:
    """A hang finding's lines on where each rank is in code: the full (folded) stack of each
    rank that is behind, one summary line for the others (this rank's from `own`). A rank
    that did not answer shows the stack faulthandler dumped of it, if `rescued` has one
    (stuck_stack.py), else why it has none."""
    lines: list[str] = []
    for r in behind:
        w = wheres.get(r)
        if w is None:
            got = (rescued or {}).get(r)
            if got is not None and got.stack:
                lines += stuck_stack.lines(r, got, ANSWER_S)
                continue
            why = got.not_dumped() if got is not None else "busy in C code holding the GIL, or gone"
            lines.append(f"rank {r} did not post its stack within {ANSWER_S:g}s ({why})")
            continue
        lines.append(f"rank {r} is at {w.summary}")
        lines += [f"  {line}" for line in w.stack]
    for r in range(world_size):
        waiting = own if r == rank else wheres.get(r)
        if r not in behind and waiting is not None:
            lines.append(f"rank {r} (waiting) is at {waiting.summary}")
    return tuple(lines)


def hang_detail(board: Board, behind: tuple[int, ...] | list[int], tracker: Tracker | None,
                step: int, *, shown: int = 8, grace: float = ANSWER_S) -> tuple[str, ...]:
    """Ask every rank for its stack, wait for those `behind` (up to ANSWER_S), have those that
    did not answer dumped by faulthandler where they run on this host (stuck_stack.rescue: up
    to SETTLE_S more), and format `stack_detail` with this rank's own stack from `tracker` and
    up to `shown` waiting ranks' summaries. () when the store is gone."""
    try:
        wheres = collect(board, list(behind), grace=grace)
        missing = [r for r in behind if r not in wheres]
        rescued = stuck_stack.rescue(board, missing) if missing else {}
        others = [r for r in range(board.world_size) if r != board.rank and r not in behind]
        asked = board.news().requests
        wheres.update({r: w for r, w in read(board, others[:shown]).items()
                       if w.answers >= asked})
    except RuntimeError:
        return ()
    own = tracker.take(step) if tracker is not None else None
    return stack_detail(wheres, behind, board.rank, own, board.world_size, rescued)
