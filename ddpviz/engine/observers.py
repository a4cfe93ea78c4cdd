"""What the twin calls on the observers that watch it on its rank (the hang watchdog; the
replica, NaN and optimizer-step checks; the gradient-sync contract; the debugger's safe
points), written from the twin's
side as protocols, and NO_OBSERVERS, the bare twin's: plain waits and no checks.
ddpviz/probes/for_twin.py implements them for ddpviz.DistributedDataParallel.
See [Note: twin and probes].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ddpviz.events import Collective, Phase, Tap
from ddpviz.findings import Finding

# [Note: twin and probes]
# The twin (engine/) is torch's DDP and nothing else. What ddpviz watches on each rank beside
# a DDP (probes/: deadlines on waits and heartbeats through the store, replica digests, where a
# NaN began, the optimizer step's timing) serves torch's own DDP as well (watch()), and is the
# heavier half: threads, store traffic, numpy. So the twin never imports probes/. It calls them
# through the protocols below, which list exactly what it calls, and builds them through the
# `Observers` on its class (`DistributedDataParallel._observers`). Its default, NO_OBSERVERS,
# builds nothing: every observer is None, which the twin reads as a plain wait or no check (one
# `is None` test where it would call one), so the twin alone costs nothing extra.
# ddpviz.DistributedDataParallel (ddpviz/ddp.py) is the twin with the probes' Observers
# (probes/for_twin.py) plugged in; watch() (_watch/) runs the same probes on torch's DDP.
# tests/test_layers.py holds the direction: engine/ never imports probes/, probes/ may import
# engine/ (these protocols, the failure texts).


class Guard(Protocol):
    """The hang watchdog, as the twin calls it: its meeting point, heartbeats and the waits of
    its collectives (probes/watchdog.py's Watchdog)."""

    phase: Phase  # where this rank is: set before each wait of the reducer

    @property
    def enabled(self) -> bool:
        """Deadlines are on: the first backward's missing gradients are agreed across ranks."""
        ...

    def start(self) -> None:
        """The constructor's meeting point, before its first collective."""

    def heartbeat(self, step: int, phase: Phase) -> None:
        """This rank reached `phase` of `step`; raises what another rank failed with since."""

    def waiter(self, collective: Collective) -> Callable[[Any], None] | None:
        """A wait for one kind of collective's work (None: a plain `work.wait()`)."""

    def wait(self, waitable: Any, *, collective: Collective, bucket: int = -1,
             params: Sequence[str] = ()) -> None:
        """Wait for a collective's `Work` or future, naming the ranks that never come."""

    def failed(self, exc: BaseException, *, collective: Collective, bucket: int = -1,
               params: Sequence[str] = ()) -> BaseException:
        """The error to raise for a collective that failed to launch with `exc`."""
        ...

    def fail(self, message: str, findings: Sequence[Finding]) -> None:
        """This rank is about to raise `message`: record the findings, tell the others."""

    def agree_on_unused(self, step: int, missing: Sequence[int], unreachable: Sequence[int],
                        names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                        unhooked: Sequence[int] = ()) -> tuple[str, tuple[Finding, ...]]:
        """Every rank's missing gradients of the first synced backward: the message and
        findings every rank raises, or ("", ()) when no rank missed any."""
        ...


class ReplicaObserver(Protocol):
    """Checks that every rank holds the same bytes (probes/replicas.py's ReplicaCheck)."""

    def before_forward(self, step: int, broadcasts: Callable[[], bool]) -> None:
        """Forward `step` starts; `broadcasts()`: whether it syncs buffers first."""

    def unsynced(self, step: int) -> None:
        """Forward `step` runs under no_sync(): its backward will not all-reduce."""

    def after_buffer_sync(self) -> None:
        """The forward's buffer broadcast is done."""

    def after_backward(self, step: int, synced: bool) -> None:
        """The backward of `step` finished, its reduction included."""


class NonfiniteObserver(Protocol):
    """Finds where a NaN/Inf began (probes/nonfinite.py's NonfiniteCheck)."""

    def forward(self, step: int, output: Any) -> object:
        """After the forward of `step`: its output (the answer is not read here)."""
        ...

    def checking(self, step: int) -> None:
        """Every local gradient of `step` passes through bucket() (a synced backward)."""

    def bucket(self, step: int, indices: Callable[[], list[int]], buffer: torch.Tensor,
               views: Callable[[], Sequence[torch.Tensor]]) -> None:
        """A dense bucket's local buffer, before its all-reduce."""

    def backward_done(self, step: int) -> None:
        """The backward of `step` is over."""


class OptimizerStepObserver(Protocol):
    """Times the optimizer step (probes/optimizer_step.py's OptimizerStepTap)."""

    def set(self, on: bool) -> None:
        """At each grad-enabled forward: on when the step is recorded in full."""

    def disarm(self) -> None:
        """The DDP is gone: stop."""


class SyncContractObserver(Protocol):
    """Checks that optimizer steps use all-reduced gradients (probes/sync_contract.py's
    SyncContract; it sees the backward and the optimizer step through hooks of its own)."""

    def forward(self, synced: bool) -> None:
        """A grad-enabled forward begins; `synced`: require_backward_grad_sync (False under
        no_sync())."""

    def close(self) -> None:
        """The DDP is gone: stop."""


class DebugObserver(Protocol):
    """The debugger's safe points (ddpviz/debugger/controller.py's Attachment): a rank may park
    in any of them until the notebook resumes it (none is inside a collective)."""

    def forward(self, step: int) -> None:
        """A grad-enabled forward `step` begins, before any collective of it."""

    def after_forward(self, step: int, output: Any) -> None:
        """The forward of `step` returned `output` (break predicates are evaluated here)."""

    def bucket(self, step: int, bucket: int, buffer: torch.Tensor,
               indices: Callable[[], Sequence[int]]) -> None:
        """Bucket `bucket`'s flat buffer (local gradients), before its all-reduce is launched;
        `indices()`: its parameters (reducer indices)."""

    def after_backward(self, step: int) -> None:
        """The synced backward of `step` is finalized: every bucket's all-reduce is complete
        and its result written to .grad (each bucket's buffer now holds the averaged
        gradients)."""


class Observers(Protocol):
    """Builds what watches one DDP on its rank, in the constructor's order; a builder that
    returns None leaves that part unwatched."""

    def guard(self, process_group: dist.ProcessGroup, hang_timeout: float | None,
              tap: Tap, *, stack_source: bool = True) -> Guard | None:
        """Before any collective; `hang_timeout` as DDP's argument (None: the default, 0: no
        deadlines); `stack_source` the recording's (source text in this rank's stacks)."""
        ...

    def replicas(self, period: int | None, guard: Guard | None,
                 params: Sequence[nn.Parameter], names: Sequence[str], module: nn.Module,
                 ignored: set[str], broadcast_buffers: Callable[[], bool],
                 tap: Tap) -> ReplicaObserver | None:
        """After the initial broadcast; `period` is the recording's `replicas`."""
        ...

    def nonfinite(self, guard: Guard | None, params: Sequence[nn.Parameter],
                  names: Sequence[str], process_group: dist.ProcessGroup,
                  tap: Tap) -> NonfiniteObserver | None:
        """With each reducer (the constructor's, and the one rebuilt on unpickling)."""
        ...

    def optimizer_step(self, params: Sequence[nn.Parameter],
                       tap: Tap) -> OptimizerStepObserver | None:
        """With each reducer, as nonfinite()."""
        ...

    def sync_contract(self, ddp: nn.Module, params: Sequence[nn.Parameter],
                      names: Sequence[str], tap: Tap, world_size: int,
                      source: bool) -> SyncContractObserver | None:
        """With each reducer, as nonfinite(); `source`: the recording's stack_source."""
        ...

    def debugger(self, ddp: nn.Module, params: Sequence[nn.Parameter], names: Sequence[str],
                 tap: Tap) -> DebugObserver | None:
        """With each reducer, as nonfinite(): the debugger's safe points (None: no debugger)."""
        ...


class NoObservers:
    """The bare twin's observers: none (plain waits, no checks)."""

    def guard(self, process_group: dist.ProcessGroup, hang_timeout: float | None,
              tap: Tap, *, stack_source: bool = True) -> None:
        return None

    def replicas(self, period: int | None, guard: Guard | None,
                 params: Sequence[nn.Parameter], names: Sequence[str], module: nn.Module,
                 ignored: set[str], broadcast_buffers: Callable[[], bool], tap: Tap) -> None:
        return None

    def nonfinite(self, guard: Guard | None, params: Sequence[nn.Parameter],
                  names: Sequence[str], process_group: dist.ProcessGroup, tap: Tap) -> None:
        return None

    def optimizer_step(self, params: Sequence[nn.Parameter], tap: Tap) -> None:
        return None

    def sync_contract(self, ddp: nn.Module, params: Sequence[nn.Parameter],
                      names: Sequence[str], tap: Tap, world_size: int,
                      source: bool) -> None:
        return None

    def debugger(self, ddp: nn.Module, params: Sequence[nn.Parameter], names: Sequence[str],
                 tap: Tap) -> None:
        return None


NO_OBSERVERS: Observers = NoObservers()
