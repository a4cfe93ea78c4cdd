"""The quiet guard: names the ranks a DDP step waits for when the wait itself is invisible.

[Note: the quiet guard]
watch() without the guard (`Recording(guard=False)`: no comm hook) leaves torch's C++ reducer
alone, so the training thread waits for the bucket all-reduces inside C++, where no Python
deadline can run and nothing can interrupt it before the process group's own timeout (30 minutes
by default). What stays visible is each rank's heartbeat: the step whose forward it ran last
(pulse.py posts it). So the rank's pulse thread, which already wakes every CHECK_S, looks at how
long ago this rank's last beat was. A rank whose backward waits for a peer is quiet from that
forward on; once it has been quiet for notice_after(hang_timeout), and again at hang_timeout, it
reads the other ranks' positions (one store round trip each time, never in a step that keeps
moving) and names those that have not reached its step or not returned from its forward
(See [Note: a rank still in its forward]): a live `rank_waiting` finding first,
then a `rank_hang` error finding, each emitted (the dashboard, a trace file) and warned on
stderr. It also posts this rank as waiting in the step's all-reduce, so that a verdict another
rank reaches in a wait it guards (a buffer broadcast the laggard never came to) counts this rank
as waiting, not as lagging. Nothing is raised (the training thread is inside torch) and no alert
is posted: a peer that turns up late, before the process group's timeout, finishes the step as
torch would have, and a peer that does not is left to torch's own timeout error, now with its
name already on record. A rank quiet because the job moved on (evaluation, the end of training)
finds every peer at its step or past it and reports nothing. A rank quiet in a wait the watchdog
guards itself (the buffer broadcast, the rebuild's meeting point) is skipped: that wait reports
and raises on its own.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import TYPE_CHECKING

import msgspec

from ddpviz.events import FindingReported
from ddpviz.findings import Finding, fix_for, format_ranks, recording_advice, warning_of
from ddpviz.probes import collective_check
from ddpviz.probes.pulse import ENDING, Beat
from ddpviz.probes.rendezvous import Board, Position, notice_after, phase_text
from ddpviz.probes.whereabouts import hang_detail, left_finding, read

if TYPE_CHECKING:
    from ddpviz.probes.watchdog import Watchdog


class QuietGuard:
    """Called by the pulse thread with the latest beat while the training thread is away (see
    the Note). `findings` keeps what it reported, in order."""

    def __init__(self, dog: Watchdog, pg_timeout: float | None) -> None:
        assert dog.timeout is not None
        self.dog = dog
        self.timeout = dog.timeout
        self.notice = notice_after(dog.timeout)
        self.pg_timeout = pg_timeout
        self.findings: list[Finding] = []
        self._done: tuple[int, int] = (-1, 0)  # (step, stage) last looked at
        self._posted = -1  # the step this rank was last posted waiting in
        self._left_named: set[tuple[tuple[int, ...], int, str]] = set()

    def __call__(self, board: Board, beat: Beat) -> None:
        step, phase, since = beat
        if step < 0 or self.dog.guarding or _exiting():
            return
        waited = time.time() - since
        stage = 2 if waited >= self.timeout else 1 if waited >= self.notice else 0
        if stage == 0 or (step, stage) <= self._done:
            return
        self._done = (step, stage)
        try:
            positions = board.positions()
        except RuntimeError:
            return  # the store is gone (rank 0 exited): torch's collective reports that
        behind = _behind(positions, self.dog.rank, self.dog.world_size, step, phase)
        if not behind:
            return
        if self._posted != step:  # this rank waits in backward: say so on the board, so
            self._posted = step  # that a verdict elsewhere counts it as waiting, not lagging
            try:
                board.post_position(Position("waiting", step, "backward", time.time(),
                                             "all-reduce", since=since))
            except RuntimeError:
                return
        finding = self._finding(stage, step, since, behind, positions)
        pulse = getattr(self.dog, "_pulse", None)  # where each rank is, in code
        lines = hang_detail(board, behind, pulse.tracker if pulse else None, step)
        lines += collective_check.hang_lines()  # the collectives the ranks issued differently
        self._report(msgspec.structs.replace(finding, detail=finding.detail + lines))

    def left(self, board: Board, beat: Beat) -> bool:
        """A rank posted that it left the loop (pulse thread): name it if this rank ran a
        later step (whereabouts.left_finding), once per rank and step. Returns whether some
        rank left at this rank's step or later (to look again when this rank moves on)."""
        step = beat[0]
        if _exiting():
            return False
        try:
            positions = board.positions()
            wheres = read(board, [r for r in range(self.dog.world_size) if r != self.dog.rank])
        except RuntimeError:
            return False
        finding = left_finding(self.dog.rank, step, self.dog.world_size, positions, wheres)
        if finding is not None:
            key = (finding.ranks, finding.step, finding.severity)
            if key not in self._left_named:
                self._left_named.add(key)
                self._report(finding)
        return any(w.left and w.left != "crashed" and w.step >= step
                   and (r not in positions or positions[r].step <= w.step)
                   for r, w in wheres.items())

    def _finding(self, stage: int, step: int, since: float, behind: tuple[int, ...],
                 positions: dict[int, Position]) -> Finding:
        dog, now = self.dog, time.time()
        states = {r: _where(positions.get(r), step, now, r in behind)
                  for r in range(dog.world_size)}
        states[dog.rank] = f"quiet since its forward of step {step} ({now - since:.0f}s)"
        values = tuple((states[r], (r,)) for r in range(dog.world_size))
        what = f"step {step} (after its forward: the backward's all-reduces need every rank)"
        if stage == 1:
            return dog.waiting_finding(
                behind, what, since, values, step=step, field="all-reduce",
                fix="Nothing to do yet: if they do not come, a rank_hang finding names where "
                    "they are (torch's own error follows at the process group's timeout).")
        after = (f"torch's reducer waits in C++ until the process group's timeout "
                 f"({self.pg_timeout:g}s), which then raises torch's own error"
                 if self.pg_timeout is not None else
                 "torch's reducer waits in C++ until the process group's timeout")
        title = f"{_lag(behind, positions, step)} within {self.timeout:g}s; rank {dog.rank} " \
                "has waited since its forward"
        ranks, fix = behind, fix_for("rank_hang", "behind")
        lines: tuple[str, ...] = ()  # the collectives' verdict, first, when there is one
        verdict = collective_check.hang_verdict()  # See [Note: the quiet guard's verdict]
        if verdict is not None and verdict.ranks:
            others = tuple(r for r in range(dog.world_size) if r not in verdict.ranks)
            waited = (f"rank {dog.rank} has waited {now - since:.0f}s since its forward of "
                      f"step {step}")
            if set(verdict.ranks) & set(behind):
                title = (f"{_lag(behind, positions, step)} after "
                         f"{format_ranks(verdict.ranks)} issued collectives that "
                         f"{format_ranks(others)} did not; {waited}")
            else:
                title = (f"{format_ranks(verdict.ranks)} issued collectives that "
                         f"{format_ranks(others)} did not: {waited}, and "
                         f"{format_ranks(behind)} did not get as far")
                ranks = verdict.ranks
            fix = verdict.fix
            lines = tuple(verdict.lines)
        return Finding(
            kind="rank_hang", severity="error", title=title,
            ranks=ranks, field="all-reduce", step=step, values=values,
            detail=(*lines, f"named by rank {dog.rank}'s watcher thread: {after}; "
                    f"{recording_advice('guard')} raises this as RankHangError from "
                    "backward() instead"),
            fix=fix, world_size=dog.world_size)

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.dog.tap.enabled:
            self.dog.tap.emit_as(finding.step, time.monotonic_ns(), FindingReported, finding)
        warnings.warn(warning_of(finding), stacklevel=1)


# [Note: the quiet guard's verdict]
# The job's collectives may already have named ranks that issued collectives the others did
# not (collective_check's Verdict, in the store): the hang's lines then carry its words, and
# the title says the same, with what this rank saw itself (how long it has waited, which
# ranks last reported an earlier step), as the watchdog's verdict does. When the ranks it
# names are the ones behind, they are named both ways; when they are the waiting ones, the
# others are not called late (they may have run every collective they were given): the
# finding names the ranks the verdict names, with its fix.


def _exiting() -> bool:
    """The job is ending on this rank: its main thread ran to the end of the script
    (threading's shutdown marks it stopped before the atexit handlers run, ddpviz's final
    comparisons among them), or ddpviz's exit handlers or destroy_process_group began (pulse.
    ENDING: a script may run the exit handlers itself, as launch()'s ranks do). This rank then
    waits for nothing in DDP, and what its peers do meanwhile is not named from here (a rank
    joined by `ddp.join()` and its peer both ending, say)."""
    return ENDING.is_set() or not threading.main_thread().is_alive()


# [Note: a rank still in its forward]
# Each rank beats twice a step on its pulse: when its forward starts (phase "forward") and when
# it returns (phase "backward": the backward's all-reduces come next). A rank quiet after its
# forward of step S waits in S's all-reduces for every rank that has not returned from S's
# forward: those at an earlier step, and those whose last beat is S's "forward". The latter
# matters where the user's code runs inside DDP's forward (Lightning calls training_step
# there): a rank stuck in it has reached step S, and was never named when only the step was
# compared. They are named only when no rank is at an earlier step: a forward also holds the
# buffer broadcast, where a rank waits for one that never reached the step (the watchdog
# guards that wait and names the late rank itself). A rank whose last beat is a "forward"
# while this one's is too (a watch driven by replicate(), which beats no return) is not
# behind.


def _behind(positions: dict[int, Position], rank: int, world_size: int, step: int,
            phase: str) -> tuple[int, ...]:
    """The ranks that have not returned from `step`'s forward, as `rank` (at `phase` of
    `step`) has: those at an earlier step, or else those still in that forward. See [Note: a
    rank still in its forward]."""
    others = [r for r in range(world_size) if r != rank]
    before = tuple(r for r in others if r not in positions or positions[r].step < step)
    if before or phase != "backward":
        return before
    return tuple(r for r in others if positions[r].step == step
                 and positions[r].phase == "forward")


def _lag(behind: tuple[int, ...], positions: dict[int, Position], step: int) -> str:
    """What the ranks behind did not do: reach step `step`, or return from its forward."""
    inside = tuple(r for r in behind if r in positions and positions[r].step == step)
    before = tuple(r for r in behind if r not in inside)
    parts = [f"{format_ranks(before)} did not reach step {step}"] if before else []
    if inside:
        parts.append(f"{format_ranks(inside)} did not return from step {step}'s forward")
    return " and ".join(parts)


def _where(position: Position | None, step: int, now: float, behind: bool = False) -> str:
    if position is None:
        return "never reported (no DDP step on this rank yet)"
    ago = now - position.t
    if position.step == step and behind:
        return f"at step {step} (in its forward since {ago:.0f}s ago): behind"
    if position.step < step:
        return f"at step {position.step} ({phase_text(position)}, {ago:.0f}s ago): behind"
    return f"at step {position.step} ({phase_text(position)}, {ago:.0f}s ago)"
