"""What a launched run holds in the kernel besides its processes: the 0700 folder (rendezvous
store, stack files) and the event stream, made all together or not at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpviz.interrupts import interrupts_deferred
from ddpviz.launcher.stacks import StackFiles
from ddpviz.launcher.stream import EventStream
from ddpviz.private_dir import PrivateDir

if TYPE_CHECKING:
    from ddpviz.session.live import Session


def run_resources(nprocs: int, session: Session | None
                  ) -> tuple[PrivateDir, StackFiles, EventStream]:
    """The folder, the stack files of `nprocs` ranks and the event stream (into `session`, or a
    private one). A kernel interrupt waits until all three exist (or none does), so it never
    leaves a folder or a listening socket nobody will close: one held back while they were
    made is raised once they are, and they are closed again first (they were never handed
    out, so nothing else would close them, and a collector dropped with its thread still
    polling is closed by a later garbage collection under that poll: a segfault)."""
    made: tuple[PrivateDir, StackFiles, EventStream] | None = None
    try:
        with interrupts_deferred():
            folder = PrivateDir()
            try:
                made = folder, StackFiles(nprocs, folder.path), EventStream(session)
            except BaseException:
                folder.remove()
                raise
    except BaseException:
        if made is not None:  # the interrupt held back above: undo all three
            with interrupts_deferred():
                made[2].close()
                made[0].remove()
        raise
    assert made is not None
    return made
