"""The hook-less default's every-step NaN check: one gradient hook per bucket, on the parameter
whose gradient is ready last in that bucket, checks the bucket's local gradients before torch's
reducer launches its all-reduce; the forward output's sum is kept every step and read with it.
Feeds the rank's `NonfiniteCheck` (nonfinite.py). See [Note: every step, one hook a bucket].
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Collection, Sequence
from typing import Any

import torch

from ddpviz.probes import step_aside
from ddpviz.probes.check_budget import CheckBudget
from ddpviz.probes.nonfinite import (
    NonfiniteCheck,
    _max_abs,
    first_tensor,
    nonfinite,
    wide_sum,
)

# [Note: every step, one hook a bucket]
# torch's reducer launches a bucket's all-reduce when its last parameter is marked ready, in that
# parameter's AccumulateGrad post hook. A post-accumulate-grad hook on that parameter runs inside
# its AccumulateGrad, after every tensor hook (the job's own, which may write the NaN) and the
# accumulation, before that post hook: every gradient of the bucket is accumulated by then (with
# gradient_as_bucket_view, .grad is the bucket view, already divided by the world size in place:
# finiteness unchanged), the all-reduce not launched. So one hook per bucket sees each bucket's
# local gradients on every step: on CPU one sum per gradient (fp32 for 16-bit), added up and read at
# once; per parameter only when the total is non-finite (confirmed elementwise: a finite sum can
# overflow; one gradient alone is summed in place). On a GPU one fused max-abs per gradient
# (`_foreach_norm(inf)`, NaN propagates), stacked with the output's sum on the step's last hook,
# is copied to pinned memory behind a CUDA event and read on the host at a later step
# (nonfinite._Late): three device ops a hook, no host sync, no device op to read it.
# Which parameter is ready last is learned from the sampled steps' per-parameter hooks (their firing
# order; steps 0-2 are sampled, nothing is hooked before). A graph whose order changed makes the
# hook run earlier than the bucket's last gradient (a gradient not checked: a miss) or not at all
# (the step is then not claimed as checked); it never makes a finite gradient look non-finite. The
# steps whose per-parameter hooks are armed (sampled, precise) are checked by those: the bucket
# hooks step aside. The forward output's sum (fp32) is taken after every forward and read when the
# step's last bucket hook ran: non-finite there = the loss was already non-finite (field "loss"),
# and the parameters are checked once, as NonfiniteCheck.forward does.
# A removed post-accumulate-grad hook leaves its empty dict installed in C++ (See
# HooklessWatch._arm): after close(), one empty Python call per hooked parameter (one a bucket) and
# backward, ~0.2 us each. A tensor hook could be uninstalled, but it runs before the job's own
# tensor hooks registered after it, and would miss the NaN one of them writes.
# On a step shorter than the check can afford, the check runs every few steps instead: See
# [Note: the check's budget] (check_budget.py).

_clock = time.perf_counter_ns


class BucketCheck:
    """Every-step local-gradient and output check of one watched DDP (hook-less level).

    Args:
        check: the rank's NonfiniteCheck.
        params: the DDP's parameters (reducer order).
        owner: the watch: its `tap.step` is the current step, its `_armed` this step's
            per-parameter hooks (the bucket hooks step aside while there are any).
        views: the DDP's gradient_as_bucket_view (a hook per bucket; else one in all).
        skip: reducer indices never checked here (sparse gradients).
    """

    def __init__(self, check: NonfiniteCheck, params: Sequence[torch.Tensor], owner: Any,
                 views: bool, skip: Collection[int] = ()) -> None:
        self.check = check
        self.params = list(params)
        self._owner = owner
        self._views = views
        self._skip = set(skip)
        self._members: list[list[int]] = []  # per group, reducer indices in ready order
        self._last: list[int] = []  # per group, the hooked parameter
        self._handles: list[Any] = []
        self._plan: tuple[list[list[int]], list[int]] | None = None  # to install at apply()
        self.step = -1  # the step whose hooks ran last
        self.seen = 0  # groups checked at `step`
        self.ostep = -1  # the step of the forward output's sum
        self.osum: torch.Tensor | None = None
        self.closed = False
        # which steps are checked: See [Note: the check's budget]
        self.budget = CheckBudget(on_set=lambda b: check.period(b.every, b.cost_ns, b.step_ns))

    # --- what is hooked ----------------------------------------------------------------------

    def learn(self, buckets: Sequence[Sequence[int]], order: Sequence[int]) -> None:
        """The bucket map and a backward's ready order (a sampled step's hooks): which parameter
        is ready last, in each bucket (gradient_as_bucket_view: .grad is the bucket, which its
        all-reduce overwrites once launched) or in all (.grad stays local until the reducer's
        finalize copies the results back). Installed at the next apply() (hooks unarmed)."""
        pos = {i: n for n, i in enumerate(order) if i not in self._skip}
        groups = [list(b) for b in buckets] if self._views else [[i for b in buckets for i in b]]
        members, last = [], []
        for group in groups:
            fired = sorted((i for i in group if i in pos), key=pos.__getitem__)
            if fired:  # (parameters without a gradient in that backward: after, not hooked)
                members.append(fired + [i for i in group if i not in pos and
                                        i not in self._skip])
                last.append(fired[-1])
        if members != self._members or last != self._last:
            self._plan = (members, last)

    def apply(self) -> None:
        """Install the learned hooks (training thread, while no per-parameter hook is armed)."""
        plan, self._plan = self._plan, None
        if plan is None or self.closed:
            return
        self._remove()
        self._members, self._last = plan
        self._handles = [self.params[index].register_post_accumulate_grad_hook(
            functools.partial(self._hook, g)) for g, index in enumerate(self._last)]

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def close(self) -> None:
        """Remove the hooks (close())."""
        self.closed = True
        self._plan = None
        self._remove()

    # --- every step --------------------------------------------------------------------------

    def output(self, step: int, output: Any) -> None:
        """After the forward of `step`: keep its output's sum (one reduction; read later), on
        the steps the budget checks."""
        budget = self.budget
        if not budget.due(step):
            self.ostep = -1
            return
        t0 = _clock()
        out = output if type(output) is torch.Tensor else first_tensor(output)
        if out is None or not out.is_floating_point():
            self.ostep = -1
            return
        self.osum = wide_sum(out.detach())  # (fp64 stays fp64: its sum can exceed fp32's range)
        self.ostep = step
        budget.spend(_clock() - t0)

    def _hook(self, g: int, param: torch.Tensor) -> None:
        owner = self._owner
        if self.closed or owner._armed:
            return
        budget, step = self.budget, owner.tap.step  # (the forward asked already: no call)
        if not (budget.answer if step == budget.asked else budget.due(step)):
            return
        t0 = _clock()
        try:
            self._check(g, param)
            self.budget.spend(_clock() - t0)
        except Exception as exc:  # (never into the job: step aside, said once)
            self.closed = True
            self._plan = None
            step_aside.say(None, "the every-step NaN check", exc,
                           "NaN is then checked on the sampled steps only")

    def _check(self, g: int, param: torch.Tensor) -> None:
        owner = self._owner
        step = owner.tap.step
        if step != self.step:
            self.step, self.seen = step, 0
        self.seen = seen = self.seen + 1
        last = seen == len(self._members)
        osum = self.osum if last and self.ostep == step else None
        members, params = self._members[g], self.params
        got = [(i, t) for i in members if (t := params[i].grad) is not None]
        grads = [t for _, t in got]
        if param.device.type != "cpu":
            self._device(step, [i for i, _ in got], grads, osum)
            if last:
                budget = self.budget
                self.check.step_checked_device(step, osum is not None, budget.every,
                                               budget.cost_ns, budget.step_ns)
            return
        if grads and not math.isfinite(_total(grads)):
            # rare: which ones (confirmed elementwise: a finite sum can overflow)
            bad = [i for i in members if _bad(params[i].grad)]
            if bad:
                self.check.local_grads(step, bad)
        if last:
            budget = self.budget
            self.check.step_checked(step, None if osum is None else
                                    not math.isfinite(osum.item()), budget.every,
                                    budget.cost_ns, budget.step_ns)

    def _device(self, step: int, indices: list[int], grads: list[torch.Tensor],
                osum: torch.Tensor | None) -> None:
        """GPU: one fused max-abs per gradient of `indices` (NaN propagates), the output's sum
        appended on the step's last hook, copied to pinned memory behind an event and read at
        a later step: three device ops and no host sync a hook."""
        if not grads and osum is None:
            return
        if osum is not None and osum.dtype != torch.float32:  # fp64: only its finiteness
            osum = torch.where(osum.isfinite(), 0.0, math.nan).to(torch.float32)
        if osum is not None and grads and osum.device != grads[0].device:
            osum = osum.to(grads[0].device)  # (an output on another device: rare)
        self.check.local_grads_device(step, indices, _max_abs(grads, osum), osum is not None)


_flatten = torch._C._nn.flatten_dense_tensors  # one copy of them all, in C++
_SMALL = 1 << 16  # elements: a gradient up to this size is summed in one flat copy with the others


def _total(grads: list[torch.Tensor]) -> float:
    """The sum of these gradients' elements, in fp32 or wider (NaN or Inf when one holds one;
    also Inf when the sum overflows). Small ones go through one flat copy (one op for all: op
    dispatch is what costs there), large ones are summed in place (a copy would cost more than
    the sum: 4 x 1M fp32 measured 7 ms flattened, 1 ms in place)."""
    small = [t for t in grads if t.numel() <= _SMALL]
    total = 0.0
    if small:
        flat = small[0] if len(small) == 1 else _flatten(small)
        total = _sum(flat)
    if len(small) != len(grads):
        for t in grads:
            if t.numel() > _SMALL:
                total += _sum(t)
    return total


def _sum(t: torch.Tensor) -> float:
    return wide_sum(t).item()


def _bad(t: torch.Tensor | None) -> bool:
    return t is not None and bool(nonfinite(t))
