"""The optimizer-step tap: OptimizerStepStarted/OptimizerStepFinished around the `step()` of
an optimizer that holds a DDP's parameters, on the steps the recording samples only. Shared by
watch() (ddpviz/_watch/) and ddpviz's DistributedDataParallel (ddp.py). See
[Note: optimizer-step tap].
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from ddpviz.events import Event, OptimizerStepFinished, OptimizerStepStarted, Tap
from ddpviz.probes import step_aside

# [Note: optimizer-step tap]
# Between a backward and the next forward a rank runs its optimizer step and loads the next
# batch; a rank late at the forward is late in one of the two, and the straggler verdict
# (ddpviz/_diagnose/straggler.py) tells them apart from these events. torch's global optimizer-step
# hooks see every `Optimizer.step()` in the process, with the optimizer instance: an optimizer
# is this DDP's when one of its parameters is (decided once per optimizer, kept weakly), so
# several DDPs and optimizers in one process each time their own. Global hooks run on every
# optimizer step while registered, so they are registered only on the sampled steps (where
# the per-parameter hooks are armed: `arm()`), and removed at the next unsampled forward
# (`disarm()`, with the per-parameter hooks; under watch() that forward is never a plain one:
# See [Note: plain steps] in _watch/base.py): the usual step runs no Python of this tap.
# They are not removed from inside the hooks: torch iterates its hook dicts while calling
# them, and removing an entry then raises "OrderedDict mutated during iteration" for the
# hooks after it.
# The tap never raises into the job: an error in a hook (the emitter, say) removes the hooks
# for good and says so once on stderr.


class OptimizerStepTap:
    """Times the optimizer step of the DDP whose parameters are `params`, on armed steps."""

    __slots__ = ("_handles", "_mine", "_params", "error", "tap")

    def __init__(self, tap: Tap, params: Iterable[torch.Tensor]) -> None:
        self.tap = tap
        self._params = frozenset(id(p) for p in params)
        self._mine: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._handles: tuple[Any, ...] = ()
        self.error: BaseException | None = None  # what stopped the tap, if anything

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        """Register the hooks (a sampled step): a no-op when armed, stopped or events are off."""
        if self._handles or self.error is not None or not self.tap.enabled:
            return
        try:
            self._handles = (register_optimizer_step_pre_hook(self._pre),
                             register_optimizer_step_post_hook(self._post))
        except Exception as exc:  # (never into the job)
            self._stop(exc)

    def disarm(self) -> None:
        """Remove the hooks (the next unsampled forward, close())."""
        handles, self._handles = self._handles, ()
        for h in handles:
            h.remove()

    def set(self, on: bool) -> None:
        """Arm or disarm, as the step's recording says (`on`: it is sampled)."""
        if on:
            self.arm()
        elif self._handles:
            self.disarm()

    def _owns(self, optimizer: Any) -> bool:
        mine = self._mine.get(optimizer)
        if mine is None:
            ids = self._params
            mine = any(id(p) in ids for group in optimizer.param_groups
                       for p in group["params"])
            self._mine[optimizer] = mine
        return mine

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._emit(optimizer, OptimizerStepStarted)

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._emit(optimizer, OptimizerStepFinished)

    def _emit(self, optimizer: Any, kind: type[Event]) -> None:
        if self.error is not None:
            return
        try:
            if self._owns(optimizer):
                self.tap.emit(kind)
        except Exception as exc:
            self._stop(exc)

    def _stop(self, exc: BaseException) -> None:
        """Step aside for good, saying so once; the job goes on."""
        if self.error is not None:
            return
        self.error = exc
        # (removed later, at the next disarm: the hook dicts may be being iterated now)
        step_aside.say(self.tap.rank, "timing the optimizer step", exc,
                       "the straggler verdict cannot tell the optimizer step from data loading")
