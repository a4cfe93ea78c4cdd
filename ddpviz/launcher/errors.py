"""What the launcher raises when ranks fail, hang or are stopped.

The rank's own traceback is the useful part, so `RankError` carries it, and in IPython
`_render_traceback_` shows it (prefixed by rank) instead of the launcher's frames in the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankFailure:
    """One rank's exception, as text (the exception object itself stays in the rank)."""

    rank: int
    phase: str  # "unpickle" | "init" | "call" | "result" | "cell" | "exit"
    exc_type: str
    message: str
    traceback: str

    def headline(self) -> str:
        where = {"unpickle": " while loading the function", "init": " while joining the group",
                 "result": " while sending its return value back"}.get(self.phase, "")
        if self.phase == "exit":
            return f"rank {self.rank} {self.message}"
        return f"rank {self.rank} raised {self.exc_type}{where}: {self.message}"

    def prefixed(self) -> list[str]:
        if not self.traceback.strip():
            return []
        return [f"[rank {self.rank}] {line}" for line in self.traceback.rstrip("\n").split("\n")]


class LaunchError(RuntimeError):
    """ddpviz could not run the function on every rank."""


class RankError(LaunchError):
    """A rank raised (or died); `failures` holds every failed rank, the first one first."""

    def __init__(self, failures: list[RankFailure], world_size: int, hint: str,
                 notes: Sequence[str] = ()) -> None:
        self.failures = failures
        self.world_size = world_size
        # what else ddpviz found after the failure, as text: the ranks' rings of last
        # collectives (probes/ledger_ring.py) when they issued different collectives and no
        # rank named it live
        self.notes = list(notes)
        first = failures[0]
        self.rank = first.rank
        self.traceback = first.traceback
        self._hint = hint
        super().__init__(self._text(with_traceback=True))

    def _summary(self) -> list[str]:
        first = self.failures[0]
        lines = [f"ddpviz: {first.headline()} (world_size={self.world_size})"]
        lines += [f"  then {f.headline()}" for f in self.failures[1:]]
        lines += self.notes
        return lines

    def _text(self, *, with_traceback: bool) -> str:
        lines = self._summary()
        if with_traceback:
            for failure in self.failures:
                if failure.prefixed():
                    lines += [f"--- rank {failure.rank} traceback:", *failure.prefixed()]
        lines.append(self._hint)
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the kernel-side frames, which say nothing useful."""
        lines: list[str] = []
        for failure in self.failures:
            lines += failure.prefixed()
        return [*lines, f"{type(self).__name__}: " + "\n".join(self._summary()), self._hint]


class LaunchTimeout(LaunchError, TimeoutError):
    """Ranks were still running when the launch timeout ran out; they were stopped."""

    def __init__(self, ranks: list[int], timeout: float, world_size: int,
                 finished: list[int], stacks: dict[int, list[str]]) -> None:
        self.ranks = ranks
        self.timeout = timeout
        self.stacks = stacks  # rank -> its Python stack when stopped, formatted, "[rank r]" lines
        done = f"; {_ranks(finished)} had returned" if finished else ""
        lines = [f"ddpviz: {_ranks(ranks)} still running after timeout={timeout:g}s "
                 f"(world_size={world_size}){done}; they were stopped."]
        if stacks:
            lines.append("Where each was when stopped:")
            for rank in sorted(stacks):
                lines += stacks[rank]
        lines.append("A rank that never returns usually waits in a collective that another "
                     "rank skipped; if the work is just slow, raise the timeout.")
        super().__init__("\n".join(lines))

    def _render_traceback_(self) -> list[str]:
        """IPython shows the ranks' stacks, not the kernel-side frames."""
        return f"{type(self).__name__}: {self}".split("\n")


class CellParked(LaunchError):
    """A %%ddp cell was run while the ranks are parked in an earlier one (by its debugger);
    nothing was sent to them."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows the message and the way out, not the kernel-side frames."""
        return f"{type(self).__name__}: {self}".split("\n")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)
