"""Backward marks: one BackwardComputed a synced step, from one gradient hook that stays on for
the watch's life. What the straggler verdict reads on the steps that record no per-bucket
events (watch's default samples steps 0-2 and every 100th). See [Note: backward marks].
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ddpviz import events as ev
from ddpviz.events import Tap
from ddpviz.probes import step_aside
from ddpviz.probes.cpu_wait import CpuWait

# [Note: backward marks]
# Every rank leaves a synced backward together (its last all-reduce waits for the last rank),
# and a rank slow in its backward is not late at the next forward: the forwards of every step
# cannot name it, only the sampled steps' per-bucket launches could. Two times a step can:
#   - the gradient of the parameter that is ready first (a tensor hook on it: the first of
#     bucket 0, whose order after the rebuild is the ready order), where the backward begins
#     its first gradient;
#   - the end of the rank's own autograd pass (a callback queued from that hook: the engine
#     runs callbacks in queue order when the pass ends, and torch's reducer queues its
#     finalize_backward, which waits for the all-reduces, when the last bucket is ready, so
#     after this one): every gradient computed and every bucket launched, before the wait.
# One BackwardComputed (t_ns: the end; param, first_t_ns: the first gradient) is emitted from
# that callback, once per step and only when the backward all-reduces (not under no_sync).
# That callback queues one more, which the engine runs after the reducer's finalize_backward
# (queued after it): the time the rank left the backward, its all-reduces waited for (on CPU;
# a CUDA backend's finalize does not wait on the host). It is carried by the next step's
# BackwardComputed (`left_prev_ns`, when that step is the next one): a rank late at a forward
# was either late already when it left the last all-reduce (not its own doing: See [Note:
# lateness it did not add] in _diagnose/straggler.py) or became late after it.
# The hook stays registered (one Python call and one queued callback a backward, ~2-4 us with
# the emit; benchmarks/bench_watch.py measures it apart), not armed per step: a removed
# tensor hook's dict would stay installed anyway (hookless.py's `_arm`). It returns None: the
# gradient is untouched. It moves to the new first parameter when the buckets are rebuilt and
# is removed at close(); an error in it removes it for good, said once on stderr.


class BackwardMarks:
    """The backward marks of one watched DDP on this rank (See [Note: backward marks])."""

    __slots__ = ("_cpu_wait", "_created", "_first_ns", "_handle", "_left", "_param", "_step",
                 "_sync", "_tensor", "error", "tap")

    def __init__(self, tap: Tap, sync: Callable[[], bool]) -> None:
        """`sync`: whether this backward all-reduces (the DDP's require_backward_grad_sync)."""
        self.tap = tap
        self._sync = sync
        self._handle: Any = None
        self._tensor: torch.Tensor | None = None
        self._created = False  # the hook dict of `_tensor` is this object's
        self._param = -1
        self._step = -1
        self._first_ns = 0
        self._left = (-1, -1)  # (step, monotonic ns) the rank last left a synced backward
        self._cpu_wait = CpuWait()
        self.error: BaseException | None = None

    @property
    def param(self) -> int:
        """The parameter whose gradient is hooked (-1: none)."""
        return self._param if self._handle is not None else -1

    def place(self, params: Sequence[torch.Tensor], buckets: Sequence[Sequence[int]], *,
              rebuilt: bool) -> None:
        """Hook the parameter ready first: after the rebuild, bucket 0's first that requires a
        gradient (its order is the ready order); before, bucket 0's last parameter (the
        constructor's map holds the parameters in reverse, bucket 0 the last ones) or, with
        no map, the last parameter."""
        if self.error is not None or not self.tap.enabled:
            return
        first = [i for b in buckets[:1] for i in b]
        order = first if rebuilt else sorted(first, reverse=True) or \
            list(range(len(params)))[::-1]
        index = next((i for i in order if params[i].requires_grad), -1)
        if index == self._param and self._handle is not None:
            return
        self.remove()
        if index < 0:
            return
        p = params[index]
        try:
            self._created = p._backward_hooks is None
            self._handle = p.register_hook(self._first)
        except Exception as exc:  # (never into the job)
            self._stop(exc)
            return
        self._tensor, self._param = p, index

    def remove(self) -> None:
        """Remove the hook (close(), or before it moves), and the hook dict it created."""
        handle, self._handle = self._handle, None
        p, self._tensor = self._tensor, None
        self._cpu_wait.close()
        if handle is None or p is None:
            return
        handle.remove()
        if self._created and not p._backward_hooks:
            p._backward_hooks = None  # uninstalls the dict from C++ (See hookless.py's _arm)
        self._created = False

    def _first(self, _grad: torch.Tensor) -> None:
        try:
            step = self.tap.step
            if step == self._step or not self._sync():
                return
            self._step = step
            self._first_ns = time.monotonic_ns()
            torch.autograd.Variable._execution_engine.queue_callback(self._end)
        except Exception as exc:
            self._stop(exc)

    def _end(self) -> None:
        try:
            if self.tap.enabled:
                step, left = self._left
                self.tap.emit(ev.BackwardComputed, self._param, self._first_ns,
                              self._cpu_wait.read(), left if step == self._step - 1 else -1)
            torch.autograd.Variable._execution_engine.queue_callback(self._leave)
        except Exception as exc:
            self._stop(exc)

    def _leave(self) -> None:
        self._left = (self._step, time.monotonic_ns())

    def _stop(self, exc: BaseException) -> None:
        """Step aside for good, saying so once; the job goes on."""
        if self.error is not None:
            return
        self.error = exc
        # (the handle is removed at the next place() or close(): torch may be iterating the
        # hook dict now)
        step_aside.say(self.tap.rank, "marking the backward", exc,
                       "a rank slow in its backward is then named from the sampled steps only")
