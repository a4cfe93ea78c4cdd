"""watch() without the guard (`Recording(guard=False)`): no comm hook, so torch's C++ reduction
runs untouched. `HooklessWatch` arms per-parameter tensor hooks on the steps the recording
samples only (`every=N`); `ForwardsOnlyWatch` (`every=None`) none: its steps record the forward
only. A hang in the backward's all-reduces is named by the pulse thread (See [Note: the quiet
guard] in probes/quiet.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ddpviz import events as ev
from ddpviz._watch.base import Watch, _graph_task
from ddpviz.probes.backward_marks import BackwardMarks
from ddpviz.probes.nonfinite_buckets import BucketCheck
from ddpviz.recording import NEVER


class HooklessWatch(Watch):
    """No comm hook; per-parameter hooks on the sampled steps only."""

    _plain_steps = True  # See [Note: plain steps] (base.py)

    def _init_strategy(self) -> None:
        self._armed: list[Any] = []  # this step's per-parameter hooks
        self._fresh: list[torch.Tensor] = []  # parameters whose hook dict _arm made
        self._sync = True  # the backward all-reduces (not under no_sync)
        self._left: list[int] = []  # per bucket, gradients not ready yet (0: ready)
        self._next_launch = 0
        self._order: list[int] = []  # this (armed) backward's ready order
        # every synced step's backward, split from its wait: See [Note: backward marks]
        self._marks = BackwardMarks(self.tap, lambda: bool(self.ddp.require_backward_grad_sync))

    def _hook_params(self) -> None:
        # every step's local gradients, one hook a bucket: See [Note: every step, one hook a
        # bucket] (probes/nonfinite_buckets.py)
        # (installed once an armed step's hooks have shown the ready order: steps 0-2 are)
        self._buckets_nf = BucketCheck(
            self._nf, self.params, self, bool(self.ddp.gradient_as_bucket_view),
            [i for i, sparse in enumerate(self._sparse) if sparse])
        self._marks.place(self.params, self.buckets, rebuilt=False)

    def _take_hook(self, hook: Callable[..., torch.futures.Future] | None, state: Any,
                   existing: list[Any]) -> None:
        if hook is not None:  # torch's own registration: watch adds no comm hook
            self.ddp.register_comm_hook(state if state is not None else self.group, hook)

    def _guard(self) -> None:
        self.watchdog.guard_quiet()  # See [Note: the quiet guard] (probes/quiet.py)

    def _arm_step(self, step: int) -> None:
        # a replica check's step needs the end of its backward (the reduced gradients) in
        # the every-step modes only: the periodic one digests them where a step is armed anyway
        self._arm(self._summary.policy.full(step) or self._nf.precise(step) or (
            self._replicas is not None and self._replicas.grads_due(step)))

    def _arm_plain_until(self, step: int) -> int:
        return self._summary.policy.plain_until(step)

    def _nf_arm(self, step: int, now: bool) -> None:
        if now and not self._armed:
            self._arm(True)
        if self._armed:
            self._nf.checking(step)

    def _on_rebuild(self) -> None:
        self._marks.place(self.params, self.buckets, rebuilt=True)  # (ready order now)
        self._arm(True)

    def close(self) -> None:
        super().close()
        marks = self.__dict__.get("_marks")
        if marks is not None:
            marks.remove()

    def _backward_begins(self) -> None:
        self._sync = bool(self.ddp.require_backward_grad_sync)
        self._left = [len(members) for members in self.buckets]
        self._next_launch = 0
        self._order = []

    def _backward_done(self) -> None:
        self._nf.backward_done(self.tap.step)
        if self._order and not self._learning:
            self._buckets_nf.learn(self.buckets, self._order)
        if self._learning:  # a sparse bucket: readable once a backward has run
            self._read_buckets(rebuilt=False)
        elif self.tap.enabled:
            self._light_finish()

    def _arm(self, on: bool) -> None:
        """Per-parameter hooks for this step (a sampled one) or none (the others).

        Tensor gradient hooks, not post-accumulate-grad hooks: a removed hook of either kind
        leaves its (empty) Python dict installed in C++, which every later backward still
        calls, with the GIL, once per parameter (measured: +0.2 us per parameter and backward,
        +90-200 us a backward at 500 parameters), and only a tensor's `_backward_hooks` can
        be reset to None, which uninstalls it. The hook runs just before the gradient is
        accumulated, right before torch's reducer sees it."""
        if on == bool(self._armed) or self._closed:
            return
        if not on:
            self._disarm()
            self._buckets_nf.apply()  # (hooks learned on the armed step)
            return
        self._fresh = [p for p in self.params if p._backward_hooks is None]
        self._armed = [p.register_hook(functools.partial(self._grad_ready_light, i))
                       for i, p in enumerate(self.params)]
        self._opt.arm()  # See [Note: optimizer-step tap] (probes/optimizer_step.py)

    def _disarm(self) -> None:
        if self._closed and "_buckets_nf" in self.__dict__:
            self._buckets_nf.close()
        for h in self._armed:
            h.remove()
        self._armed = []
        self._opt.disarm()
        for p in self._fresh:  # only dicts this watch created, and only if nobody added one
            if not p._backward_hooks:
                p._backward_hooks = None
        self._fresh = []

    def _grad_ready_light(self, index: int, _grad: torch.Tensor) -> None:
        # A parameter's gradient hook runs just before its AccumulateGrad node, whose post
        # hook is torch's reducer marking it ready: the bucket's last one is its BucketReady,
        # and torch launches ready buckets in index order.
        task = _graph_task()
        if task != self._task and task != -1:
            self._begin_backward(task)
        self._fired.add(index)
        self._order.append(index)
        self._nf.grad(self.tap.step, index, _grad)
        if not self.tap.enabled:
            return
        b = self._bucket_of.get(index, -1)
        self.tap.emit(ev.GradReady, index, b)
        if b >= 0 and self._sync:
            self._left[b] -= 1
            if self._left[b] == 0:
                self._bucket_ready(b)

    def _bucket_ready(self, b: int) -> None:
        self._left[b] = 0
        self.tap.emit(ev.BucketReady, b)
        while self._next_launch < len(self._left) and not self._left[self._next_launch]:
            nbytes, dtype = self._bucket_meta[self._next_launch]
            self.tap.emit(ev.AllReduceLaunched, self._next_launch, nbytes, dtype)
            self._next_launch += 1

    def _light_finish(self) -> None:
        """After torch's finalize_backward (which waited for every all-reduce): buckets
        torch marked ready itself (find_unused_parameters) are launched as of now, and every
        launched all-reduce is done."""
        if not self._sync or not self._left:
            return
        for b, left in enumerate(self._left):
            if left:
                self._bucket_ready(b)
        for b in range(self._next_launch):
            self.tap.emit(ev.AllReduceDone, b)
        self._left = []


class ForwardsOnlyWatch(HooklessWatch):
    """No comm hook and no per-parameter hook (`every=None`): each step records its forward;
    no backward callback ever runs."""

    def _hook_params(self) -> None:
        return

    def _arm_step(self, step: int) -> None:
        return

    def _arm_plain_until(self, step: int) -> int:
        return NEVER

    def _on_rebuild(self) -> None:
        return

    def _nf_arm(self, step: int, now: bool) -> None:
        return  # (no hook ever: the forward output is checked, the gradients never)

    def _check_unused(self) -> None:
        return  # (nothing observed what fired)
