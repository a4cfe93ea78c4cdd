"""The probes of ddpviz's own DistributedDataParallel: builds the hang watchdog, the replica
check, the NaN check, the optimizer-step tap, the gradient-sync contract and the debugger's safe
points for one twin DDP,
as the twin's `Observers` (engine/observers.py; See [Note: twin and probes] there). watch()
builds the same probes around torch's DDP itself (_watch/base.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch import nn

from ddpviz.debugger import controller as debugger
from ddpviz.engine.observers import DebugObserver, Guard, Observers
from ddpviz.events import Phase, Tap
from ddpviz.probes import collective_check, collectives
from ddpviz.probes.nonfinite import NonfiniteCheck
from ddpviz.probes.optimizer_step import OptimizerStepTap
from ddpviz.probes.replicas import ReplicaCheck, replica_check
from ddpviz.probes.sync_contract import SyncContract
from ddpviz.probes.watchdog import Watchdog, resolve_hang_timeout


class _TwinWatchdog(Watchdog):
    """The twin's watchdog, which also keeps the ledger of the job's collectives (the twin's
    forward heartbeat marks each DDP step in it; See [Note: positions] in collectives.py)."""

    def __init__(self, process_group: dist.ProcessGroup, timeout: float | None, tap: Tap,
                 stack_source: bool) -> None:
        super().__init__(process_group, timeout=timeout, tap=tap, stack_source=stack_source)
        self._ledger = collective_check.start(tap)

    def heartbeat(self, step: int, phase: Phase) -> None:
        if phase == "forward":
            collectives.mark_ddp_step(self.group, step)
        super().heartbeat(step, phase)

    def close(self) -> None:
        if self._ledger:
            self._ledger = False
            collective_check.release()
        super().close()


class TwinProbes:
    """Every probe, for a twin DDP (`DistributedDataParallel._observers` of ddpviz/ddp.py)."""

    def guard(self, process_group: dist.ProcessGroup, hang_timeout: float | None,
              tap: Tap, *, stack_source: bool = True) -> Watchdog:
        # Names ranks that never arrive or stop coming. See [Note: hang protocol]. Built even
        # when off (timeout None): its waits are then plain waits and it meets no one.
        return _TwinWatchdog(process_group, resolve_hang_timeout(hang_timeout, process_group),
                             tap, stack_source)

    def replicas(self, period: int | None, guard: Guard | None,
                 params: Sequence[nn.Parameter], names: Sequence[str], module: nn.Module,
                 ignored: set[str], broadcast_buffers: Callable[[], bool],
                 tap: Tap) -> ReplicaCheck | None:
        # See [Note: replica digests] (replicas.py): the digests meet on the watchdog's board
        board = guard.board if isinstance(guard, Watchdog) else None
        return replica_check(period, board, params, names, module, ignored, broadcast_buffers,
                             tap)

    def nonfinite(self, guard: Guard | None, params: Sequence[nn.Parameter],
                  names: Sequence[str], process_group: dist.ProcessGroup,
                  tap: Tap) -> NonfiniteCheck:
        # See [Note: finding where a NaN starts] (nonfinite.py): the twin's reducer shows it
        # every bucket before its all-reduce ("guarded"); the ranks' records meet on the
        # watchdog's pulse thread, else (one rank, no deadlines) this rank composes its own
        check = NonfiniteCheck(params, names, process_group.rank(), process_group.size(), tap,
                               "guarded")
        check.local = not (isinstance(guard, Watchdog) and guard.add_pulse_task(check.pulse))
        return check

    def optimizer_step(self, params: Sequence[nn.Parameter], tap: Tap) -> OptimizerStepTap:
        # See [Note: optimizer-step tap] (optimizer_step.py): armed on the sampled steps
        return OptimizerStepTap(tap, params)

    def sync_contract(self, ddp: nn.Module, params: Sequence[nn.Parameter],
                      names: Sequence[str], tap: Tap, world_size: int,
                      source: bool) -> SyncContract:
        # See [Note: the gradient-sync contract] (sync_contract.py): canary hooks of its own
        return SyncContract(ddp, params, names, tap, world_size=world_size, source=source)

    def debugger(self, ddp: nn.Module, params: Sequence[nn.Parameter], names: Sequence[str],
                 tap: Tap) -> DebugObserver | None:
        # ddpviz/debugger/controller.py: None unless this rank was launched for the debugger
        return debugger.attach(ddp, params, names, tap, kind="ddpviz", bucket_points=True)


PROBES: Observers = TwinProbes()
