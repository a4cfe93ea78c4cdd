"""`ddpviz.DistributedDataParallel`: the twin (engine/ddp.py, torch's DDP in Python) with
ddpviz's probes plugged in (probes/for_twin.py: the hang watchdog, the replica, NaN and
optimizer-step checks). It sits above both rooms so that neither imports the other's way: See
[Note: twin and probes] (engine/observers.py).
"""

from __future__ import annotations

from typing import ClassVar, cast

from ddpviz.engine import ddp as twin
from ddpviz.engine.observers import Observers
from ddpviz.probes.for_twin import PROBES
from ddpviz.probes.replicas import ReplicaCheck


class DistributedDataParallel(twin.DistributedDataParallel):
    """Drop-in for `torch.nn.parallel.DistributedDataParallel` (torch 2.13), in Python.

    Args:
        module ... forward_sync_buffers: exactly torch's arguments, defaults and meaning.
        emitter: receives ddpviz events (`ddpviz.events`); None: the process's default
            emitter (set by ddpviz.launch / ddpviz.connect), else no events at all.
        hang_timeout: seconds a collective may wait before the ranks are compared and
            the missing or lagging ones named (RankHangError); default
            $DDPVIZ_HANG_TIMEOUT, else 0.6 x the process group's timeout (at most 300 s); 0
            turns the watchdog off.
        recording: what is recorded of each backward, a `ddpviz.Recording` (See [Note:
            recording policy] in recording.py): `every=N` (default 100) records a GradReady
            per parameter on steps 0-2, the rebuild step, every N-th step and around this
            rank's findings, and a GradsSummarized per bucket (count, bytes, first and last
            ready time) on the others; `every=1` every step in full, `every=None` summaries
            only. `guard` changes nothing here: this DDP's all-reduce is Python and always
            guarded. Default $DDPVIZ_RECORDING (launched and torchrun ranks), else
            `Recording()`.
        detail: deprecated (one release): the old level names ("sampled", "full", ...),
            mapped to `recording=` with a DeprecationWarning naming it.
    """

    _observers: ClassVar[Observers] = PROBES

    @property
    def replicas(self) -> ReplicaCheck | None:
        """This DDP's replica check, or None when it is off (docs/replicas.md); rank 0's
        `.findings` lists what it reported."""
        return cast("ReplicaCheck | None", self.__dict__.get("_replicas"))
