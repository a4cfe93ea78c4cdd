"""The debugger of a `%%ddp --debug` pool: a `Debugger` whose resume, step and abort go on with
the cell the ranks are parked in.

A %%ddp cell blocks the kernel until every rank has finished it; under the debugger it also
returns once every rank has parked (pool.py), and the ranks keep the cell's code in their park.
`resume()` and `step()` then let them go on and block, like the cell did, until the ranks finish
it or park again: the rest of the cell's output and its result appear in the cell that resumed.
`abort()` ends the parked cell on every rank (each leaves its park raising `Aborted`, so none is
left in a collective) and stops the pool; the next %%ddp cell starts fresh ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpviz.debugger import protocol as p
from ddpviz.debugger.client import ABORT_TIMEOUT, Debugger, DebuggerError
from ddpviz.debugger.stop import Stop, describe_point

if TYPE_CHECKING:
    from ddpviz.launcher.pool import RankPool


class PoolDebugger(Debugger):
    """Pause, inspect and resume the ranks of a %%ddp pool (`%ddp_debugger` returns it).

    Args:
        pool: the pool started with the debugger on.
    """

    def __init__(self, pool: RankPool) -> None:
        super().__init__(pool.session, world_size=pool.nprocs, finished=lambda: not pool.alive)
        self._pool = pool
        self.sent_to_all = 0  # the last request sent to every rank: a cell starts after it

    def _check_alive(self) -> None:
        if not self._pool.alive:
            raise DebuggerError("ddpviz: the %%ddp ranks this debugger served were stopped.\n"
                                "Run a %%ddp cell to start fresh ones, then take their "
                                "debugger: dbg = %ddp_debugger.")

    def _need_pause(self, what: str) -> tuple[Stop, tuple[int, ...]]:
        self._check_alive()
        return super()._need_pause(what)

    def _send(self, command: p.Command, rank: int | None = None, *, keep: bool = True,
              watch: str = "") -> tuple[int, ...]:
        self._check_alive()
        sent = super()._send(command, rank, keep=keep, watch=watch)
        if rank is None:
            self.sent_to_all = max(self.sent_to_all, command.request)
        return sent

    def wait(self, timeout: float = 30.0) -> Stop:
        """Where every rank is parked (see `Debugger.wait`). In a pool the ranks stop only in a
        running %%ddp cell, and that cell returns once they have: so this says where they
        are, or that no cell is parked.

        Args:
            timeout: the most seconds to wait.

        Returns:
            The `Stop`.

        Raises:
            DebuggerError: no %%ddp cell is parked.
        """
        if self._pool.parked is None:
            raise DebuggerError("ddpviz: no %%ddp cell is parked, so no rank is stopped.\nSet a "
                                "break (dbg.break_at(...)) or dbg.pause(), then run the training "
                                "cell: it returns when every rank has stopped.")
        return super().wait(timeout)

    def resume(self, *, timeout: float | None = None) -> None:
        """Let every rank go on with the parked cell, and block until they finish it or park
        again; the cell's remaining output and its result appear here.

        Args:
            timeout: seconds to wait for every rank to leave its park.

        Raises:
            RankError, LaunchTimeout: as the %%ddp cell itself would.
        """
        self._pool.output_here()  # (before the ranks go on: their next lines come here too)
        super().resume(timeout=timeout)
        self._pool.continue_cell()

    def step(self, to: str = "step", *, timeout: float = 30.0,
             wait: bool = True) -> Stop | None:
        """Go on to the next safe point of a kind (see `Debugger.step`), blocking until the
        ranks park there or finish the cell.

        Args:
            to: "bucket", "step" or "finding".
            timeout: the most seconds to wait for every rank to leave its park.
            wait: kept for `Debugger.step`'s signature: a pool's step always blocks (the cell's
                output comes here).

        Returns:
            The new `Stop`, or None when the cell finished first (the ranks then stop at that
            point of a later cell).
        """
        self._pool.output_here()
        super().step(to, timeout=timeout, wait=False)
        return self._pool.continue_cell().parked

    def abort(self, *, timeout: float = ABORT_TIMEOUT, wait: bool = True) -> tuple[int, ...]:
        """End the parked cell on every rank and stop the pool (`Debugger.abort`): each rank
        leaves its park raising `Aborted`, ships its events, then is stopped. The next %%ddp
        cell starts fresh ranks.

        Args:
            timeout: the most seconds to wait for the ranks to leave the cell.
            wait: False: stop the ranks without waiting for them to leave the cell.

        Returns:
            The ranks the abort went to.
        """
        ranks = super().abort(timeout=timeout, wait=False)
        self._pool.end_aborted(timeout if wait else 0.0)
        return ranks


def parked_text(stop: Stop, cell: str) -> str:
    """What a %%ddp cell says when it returns with every rank parked in it."""
    where = describe_point(stop.step, stop.point, stop.bucket)
    reasons = sorted({s.reason for s in stop.ranks.values()})
    held = f" (bucket {stop.bucket} holds {', '.join(stop.params)})" if stop.params else ""
    return (f"ddpviz: every rank stopped at {where}{held}, by {'; '.join(reasons)}.\n"
            f"The cell {cell} is parked, not finished: the ranks hold its code there. The kernel "
            "is free:\n"
            "  dbg = %ddp_debugger, then dbg.inspect(name, 'grad'), dbg.run(code), dbg.stacks();\n"
            "  dbg.resume() runs the rest of the cell (its output shows where you resume), "
            "dbg.step('bucket') / dbg.step('step') go to the next safe point,\n"
            "  dbg.abort() ends the cell and the ranks. Another %%ddp cell waits until then.\n")


def parked_refusal(stop: Stop | None, cell: str) -> str:
    """Why a new %%ddp cell is not run while the ranks are parked in `cell`."""
    where = "" if stop is None else f" at {describe_point(stop.step, stop.point, stop.bucket)}"
    return (f"ddpviz: the ranks are parked{where} in the cell {cell}, so this cell was not "
            "run (they would run it only after that one).\nFirst resume that cell with "
            "dbg.resume() (dbg = %ddp_debugger; it runs the rest of the parked cell), or end "
            "it with dbg.abort() (stops the ranks; the next %%ddp cell starts fresh ones), or "
            "%ddp_stop.")


def aborted_text(stop: Stop | None, nprocs: int, pids: Any) -> str:
    """What abort() says once the ranks are gone."""
    where = ("no cell was running" if stop is None else
             f"the parked cell ended at {describe_point(stop.step, stop.point, stop.bucket)} "
             "on every rank")
    return (f"ddpviz: aborted: {where}; the {nprocs} ranks were stopped (pids {pids}), none is "
            "left in a collective.\nThe next %%ddp cell starts fresh ranks, with the debugger "
            "(variables from earlier cells are gone); take its debugger again: "
            "dbg = %ddp_debugger.\n")
