"""Where a NaN/Inf starts: each rank checks what it computed locally (its forward output, its
gradients before the all-reduce, its parameters once something went non-finite), posts what it
found on the DDP's notice board (the store, never a collective), and every rank composes the
same `nonfinite_gradient` / `nonfinite_parameter` finding from every rank's posts. See
[Note: finding where a NaN starts] and docs/nonfinite.md.

Shared by watch() (hook-less and guarded levels, _watch/) and ddpviz's DDP (engine/ddp.py,
engine/reducer.py).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import msgspec
import torch

from ddpviz.events import FindingReported, Tap
from ddpviz.findings import Finding, fix_for, format_ranks, group_ranks, warning_of
from ddpviz.probes.check_budget import SHARE
from ddpviz.units import human_duration, ordinal

# [Note: finding where a NaN starts]
# One rank's non-finite gradient becomes every rank's after the all-reduce, so the origin can
# only be seen before the reduction, on the rank itself. What each level sees:
#   the forward output: its sum (one reduction, ~2-9 us on CPU; a non-finite sum is confirmed
#     with isfinite, as a finite sum can overflow), on every step at the guarded level and in
#     ddpviz's DDP, on steps 0-2 and every OUTPUT_EVERY-th step at the hook-less default (every
#     step while precise; the others cost one attribute write, see quiet_from). Non-finite
#     there = the loss was already non-finite on this rank: its parameters are checked once
#     (are they non-finite already?) and, on CPU, this step's local gradients are checked too
#     (the hook-less level arms its per-parameter hooks right after the forward).
#   local gradients: the guarded level's comm hook and ddpviz's own reducer see each bucket's
#     local buffer before its all-reduce (one sum per bucket, every step; per parameter only
#     when the bucket is non-finite); the hook-less default sees them through its per-parameter
#     hooks on the sampled steps and on every step for PRECISE_FOR steps after any rank saw
#     something non-finite ("precise"), and on every other step through one post-accumulate-grad
#     hook a bucket (probes/nonfinite_buckets.py, which also keeps the forward output's sum on
#     every step: See [Note: every step, one hook a bucket]).
# On CPU a flag is read at once; on a GPU it stays on the device (no host sync on the
# training thread): copied to pinned memory behind a CUDA event and read once the event is
# done, at a later step. So on a GPU a non-finite forward output arms the local checks from
# the next step on, not this one.
# Each rank posts its `_Post` (steps seen, steps whose gradients were checked, non-finite
# records) from the pulse thread (probes/pulse.py); once every rank is done with a step, every
# rank composes the same finding from the same posts (so `ddpviz diagnose` counts it once) and
# emits it from that thread, as the quiet guard does. A run of consecutive non-finite steps is
# one episode: only its first step is reported, later ones counted (a job that skips
# non-finite steps with a GradScaler gets one finding per new origin, at most MAX_FINDINGS).

PRECISE_FOR = 100  # steps with every local gradient checked after something went non-finite
# the hook-less default checks the forward output on steps 0-2 and every OUTPUT_EVERY-th step
# (and every step while precise): with bench_watch's small models (steps of ~0.1-0.2 ms of
# training-thread CPU) the check (~2-9 us) cost 5-8% of that on every step and ~2% on every
# 10th (benchmarks/bench_nonfinite.py); every 25th step keeps it near 1%, and every
# sampled step (every 100th) is one of them
OUTPUT_EVERY = 25
_FIRST = 3
MAX_FINDINGS = 8  # findings per DDP; later episodes are counted
_MAX_RECORDS = 32  # non-finite records a rank posts (later ones counted)
_MAX_RANGES = 32  # ranges of gradient-checked steps a rank posts
_MAX_NAMES = 8  # parameters named per rank
_READ_S = 0.5  # how often the pulse thread looks for other ranks' posts


class _Record(msgspec.Struct, omit_defaults=True):
    """What one rank found non-finite at one step."""

    step: int
    loss: bool = False  # its forward output was non-finite
    grads: list[int] = []  # parameters whose local gradient was non-finite, ready order
    n_grads: int = 0
    params: list[int] = []  # parameters non-finite at the forward (checked once)
    n_params: int = 0
    checked: bool = False  # its local gradients were checked at this step


class _Post(msgspec.Struct, omit_defaults=True):
    """One rank's state, as posted on the board."""

    done: int = -1  # every step up to this one is final on this rank
    fwd: int = -1  # the latest forward seen
    gchk: list[list[int]] = []  # [first, last] step ranges whose local gradients were checked
    ochk: list[list[int]] = []  # [first, last] step ranges whose forward output was checked
    bad: list[_Record] = []
    more: int = 0  # records not posted (beyond _MAX_RECORDS)
    # the every-step check's period and what set it: See [Note: the check's budget]
    every: int = 1
    cost_ns: int = 0
    step_ns: int = 0


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Post).decode


class _Flag:
    """A non-finite flag: a bool on CPU (read at once), a device-side 0-dim tensor elsewhere,
    copied to pinned memory behind a CUDA event and read once that is done (no host sync).
    `value()` is None until readable."""

    __slots__ = ("_cpu", "_event", "_value")

    def __init__(self, bad: bool | torch.Tensor) -> None:
        self._value: bool | None = None
        self._event: Any = None
        if not isinstance(bad, torch.Tensor):
            self._value = bad
            return
        self._cpu = torch.empty((), dtype=torch.bool, pin_memory=True)
        self._cpu.copy_(bad, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def value(self) -> bool | None:
        if self._value is None and self._event is not None and self._event.query():
            self._value = bool(self._cpu)
        return self._value


class _Late:
    """Device values (a 1-dim float vector: max-abs of gradients or parameters, a forward
    output's sum) copied to pinned memory behind a CUDA event, and read on the host once that
    is done: no host sync, no device op at read time. `value()` is None until readable, then
    the positions of the non-finite values (usually none)."""

    __slots__ = ("_bad", "_event", "_host")

    def __init__(self, values: torch.Tensor) -> None:
        self._bad: list[int] | None = None
        self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        self._host.copy_(values, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def value(self) -> list[int] | None:
        if self._bad is None and self._event.query():
            host = self._host
            # (a sum of finite values can overflow: confirmed elementwise)
            self._bad = [] if math.isfinite(float(host.sum())) else \
                torch.nonzero(~torch.isfinite(host)).flatten().tolist()
        return self._bad


def _max_abs(tensors: Sequence[torch.Tensor], last: torch.Tensor | None = None) -> torch.Tensor:
    """One fused max-abs per tensor (NaN propagates), stacked in fp32 on their device, with
    `last` (a 0-dim fp32 value on that device) appended."""
    values = list(torch._foreach_norm([t.detach() for t in tensors], float("inf"),
                                      dtype=torch.float32)) if tensors else []
    if last is not None:
        values.append(last)
    return torch.stack(values)


def nonfinite(t: torch.Tensor) -> bool | torch.Tensor:
    """t holds a NaN or Inf: a bool on CPU, a 0-dim bool tensor on t's device otherwise. One
    reduction (the sum, in fp32 for 16-bit types) on the usual path; on CPU a non-finite sum
    is confirmed elementwise (a sum of finite values can overflow)."""
    t = t.detach()
    s = wide_sum(t)
    if t.device.type == "cpu":
        return not math.isfinite(s.item()) and not bool(torch.isfinite(t).all())
    return ~(s.isfinite() | torch.isfinite(t).all())  # (no branch on a device value)


def wide_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of t's elements on its device: in fp32 for 16-bit types (whose own sums
    overflow early), in t's dtype otherwise."""
    return t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()


def first_tensor(output: Any) -> torch.Tensor | None:
    """The forward output's first floating tensor (a tensor, or inside a tuple/list/dict)."""
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    items: Iterable[Any] = ()
    if isinstance(output, (tuple, list)):
        items = output
    elif isinstance(output, dict):
        items = output.values()
    for item in items:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return item
    return None


class _Open:
    """A step being checked on this rank."""

    __slots__ = ("checked", "grads", "late", "loss", "params", "pending", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.loss = False
        self.grads: list[int] = []
        self.params: list[int] = []
        self.checked = False
        self.late = False  # opened by the every-step device check only (GPU), clean so far
        self.pending: list[tuple[str, Any, Any]] = []  # (what, where, _Flag or _Late)

    def resolve(self, check: NonfiniteCheck) -> bool:
        """Apply the flags readable now; True once none is left."""
        left: list[tuple[str, Any, Any]] = []
        for what, where, flag in self.pending:
            v = flag.value()
            if v is None:
                left.append((what, where, flag))
            elif not v:
                continue
            elif what == "loss":  # (GPU: read a step or more late; the parameters are
                self._loss(check, left)  # checked then, after the updates since)
            elif what == "grad":
                self.grads.append(where)
            elif what == "params":
                self.params = v
            else:  # "bucket": (its reducer indices, whether the output's sum is last)
                indices, with_output = where
                self.grads += [indices[i] for i in v if i < len(indices)]
                if with_output and len(indices) in v:
                    self._loss(check, left)
        self.pending = left
        return not left

    def _loss(self, check: NonfiniteCheck, left: list[tuple[str, Any, Any]]) -> None:
        self.loss = True
        late = check._check_params(self)
        if late is not None:
            left.append(late)


class NonfiniteCheck:
    """One rank's non-finite checks for one DDP (See [Note: finding where a NaN starts]).

    Args:
        params, names: the DDP's parameters (reducer order) and their dotted names.
        rank, world_size: this rank in the DDP's group.
        tap: where findings go (a FindingReported each).
        level: how local gradients are seen ("guarded": every bucket; "hook-less": sampled
            steps), for the texts; "hook-less" also checks the forward output only on steps
            0-2 and every OUTPUT_EVERY-th step (every step while precise).
    """

    def __init__(self, params: Sequence[torch.Tensor], names: Sequence[str], rank: int,
                 world_size: int, tap: Tap, level: str) -> None:
        self.params = list(params)
        self.names = list(names)
        self.rank = rank
        self.world_size = world_size
        self.tap = tap
        self.level = level
        self.output_every = OUTPUT_EVERY if level == "hook-less" else 1
        self.findings: list[Finding] = []  # what this DDP reported (every rank: the same)
        self.repeats = 0  # non-finite steps counted, not reported again
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._post = _Post()
        self._version = 0
        self._posted: tuple[int, int] = (0, -1)
        self._precise_until = -1
        self._remote_precise = -1  # set by the pulse thread
        # The usual step, on the training thread: `step >= quiet_from and step % output_every
        # and not _open` -> only `last = step` (the watch's forward wrapper does it inline: at
        # ~0.1-0.2 ms of training-thread CPU a step, each us is ~1% of bench_watch's budget)
        self.quiet_from = _FIRST
        self.last = -1  # the latest forward's step (fast path included)
        self._seen_count = 0
        self._posts: dict[int, _Post] = {}
        self._composed = -1  # steps up to this one are composed
        self._last_bad = -10  # the last composed non-finite step (episodes)
        self._origins: set[tuple[str, tuple[int, ...], str]] = set()
        self._last_read = 0.0
        self._warned = False
        self._bad_posted = 0
        self.local = False  # no board: compose from this rank's own state (one rank)
        # called (pulse thread) when quiet_from moved: a plain-steps window is void
        self.on_change: Callable[[], None] | None = None
        # the every-step bucket check's (nonfinite_buckets.py) run of clean steps: first, last,
        # forward output checked too; folded into the post's ranges by _sync_last
        self.run: tuple[int, int, bool] = (0, -1, False)

    @property
    def open_steps(self) -> Collection[int]:
        """The steps with checks still open (none on the usual step): one collection for the
        check's life, so the watch's forward wrapper holds it rather than asking each step."""
        return self._open

    # --- the training thread ------------------------------------------------------------------

    def forward(self, step: int, output: Any, *, armed: bool = False) -> bool:
        """After the forward of `step`: check its output. True when this step's local gradients
        must be checked (the output is non-finite, known now, or the checks are precise).
        `armed`: per-parameter hooks check this step's gradients (a sampled step, every=1):
        the output is checked with them, so a finding never says less of the loss than of
        the gradients.
        The usual path (a finite output, nothing open) is one reduction and a few attribute
        writes: no record is made for a step until something is checked in it."""
        post = self._post
        self.last = step
        if step % self.output_every and not self._open and step >= self.quiet_from \
                and not self.local and not armed:  # the usual unchecked step (quiet_from)
            return False
        if self._open:
            self._settle(step)
        if self.local:
            self.compose_local()
        post.fwd = step
        if not self._open:
            post.done = step - 1
        self._version += 1
        precise = step < self._precise_until or step < self._remote_precise
        if step >= _FIRST and step % self.output_every and not precise and not armed:
            return False
        out = output if type(output) is torch.Tensor else first_tensor(output)
        if out is None or not out.is_floating_point():
            return precise
        bad = nonfinite(out)
        with self._lock:
            _add(post.ochk, step)
        if bad is False:
            return precise
        rec = self._record(step)
        if bad is True:
            rec.loss = True
            self._check_params(rec)
            self._precise(step + 1 + PRECISE_FOR)
            return True
        rec.pending.append(("loss", -1, _Flag(bad)))
        return precise

    def plain_until(self, step: int) -> int:
        """Steps from `step` up to the one returned (exclusive) are usual steps here, as far
        as is known now (`on_change` says when that changes): forward() would only write
        `last`. See [Note: plain steps] (_watch/base.py)."""
        # (a step whose device values are not read yet is usual: See local_grads_device)
        if step < self.quiet_from or any(not rec.late for rec in self._open.values()):
            return step
        every = self.output_every
        return -(-step // every) * every  # the next output check

    def _precise(self, until: int) -> None:
        self._precise_until = max(self._precise_until, until)
        self.quiet_from = max(self.quiet_from, self._precise_until)

    def _record(self, step: int) -> _Open:
        rec = self._open.get(step)
        if rec is None:
            rec = self._open[step] = _Open(step)
        return rec

    def precise(self, step: int) -> bool:
        """Every local gradient of `step` is to be checked."""
        return step < self._precise_until or step < self._remote_precise

    def checking(self, step: int) -> None:
        """This step's local gradients are checked (all of them: the levels call it when
        their hooks or comm hook see every gradient of the backward)."""
        self._record(step).checked = True

    def grad(self, step: int, index: int, grad: torch.Tensor) -> None:
        """A parameter's local gradient (before the reducer sees it)."""
        rec = self._open.get(step)
        if rec is None or grad is None:
            return
        bad = nonfinite(grad)
        if bad is True:
            rec.grads.append(index)
        elif bad is not False:
            rec.pending.append(("grad", index, _Flag(bad)))

    def bucket(self, step: int, indices: Callable[[], list[int]], buffer: torch.Tensor,
               views: Callable[[], Sequence[torch.Tensor]]) -> None:
        """A bucket's local buffer before its all-reduce; `indices` and `views` give its
        parameters (reducer indices) and their gradients, called only when needed."""
        rec = self._open.get(step)
        if rec is None:
            return
        if buffer.device.type == "cpu":
            if nonfinite(buffer):
                rec.grads += [i for i, v in zip(indices(), views(), strict=False)
                              if nonfinite(v)]
            return
        vs = list(views())
        if vs:  # per-parameter values on the device: one fused max-abs (NaN propagates)
            rec.pending.append(("bucket", (indices(), False), _Late(_max_abs(vs))))

    def local_grads(self, step: int, indices: Sequence[int]) -> None:
        """The every-step bucket check (nonfinite_buckets.py) found these local gradients of
        `step` non-finite (CPU, read now; ready order)."""
        rec = self._open.get(step)
        if rec is None:
            rec = self._record(step)
            self._opened()
        rec.grads += indices

    def step_checked(self, step: int, loss: bool | None, every: int = 1, cost_ns: int = 0,
                     step_ns: int = 0) -> None:
        """The every-step bucket check saw every bucket of `step` (CPU); `loss`: its forward
        output was non-finite (None: not seen); `every`, `cost_ns`, `step_ns`: its period and
        what set it (check_budget.py)."""
        self.period(every, cost_ns, step_ns)
        rec = self._open.get(step)
        if rec is None and not loss:  # the usual step: one more in the run
            first, last, out = self.run
            if last == step - 1 and out == (loss is not None):
                self.run = (first, step, out)
            else:
                self._fold()
                self.run = (step, step, loss is not None)
            return
        if rec is None:
            rec = self._open_record(step)
        rec.checked = True
        if loss is not None:
            with self._lock:
                _add(self._post.ochk, step)
        if loss:
            rec.loss = True
            self._check_params(rec)

    def local_grads_device(self, step: int, indices: list[int], values: torch.Tensor,
                           with_output: bool) -> None:
        """The every-step bucket check's device values for these local gradients of `step`
        (their max-abs, then the forward output's sum when `with_output`; GPU: read at a later
        step, with no host sync)."""
        rec = self._open.get(step)
        if rec is None:  # (no _opened(): the step stays a plain one until a value reads bad)
            rec = self._record(step)
            rec.late = True
            self._version += 1
        rec.pending.append(("bucket", (indices, with_output), _Late(values)))

    def step_checked_device(self, step: int, output: bool, every: int = 1, cost_ns: int = 0,
                            step_ns: int = 0) -> None:
        """Every bucket of `step` checked (GPU); `output`: its forward output's sum was among
        the values. The steps before whose values are readable now are settled (on the plain
        steps no forward() does it). `every`...: as step_checked's."""
        self.period(every, cost_ns, step_ns)
        rec = self._open.get(step)
        if rec is None:
            rec = self._record(step)
            rec.late = True
        rec.checked = True
        if output:
            with self._lock:
                _add(self._post.ochk, step)
        if len(self._open) > 1:
            self._settle(step)

    def period(self, every: int, cost_ns: int, step_ns: int) -> None:
        """The every-step check's period, posted when it changed (also as soon as the budget
        set it: a NaN on the steps it then skips is told with it)."""
        post = self._post
        if every != post.every or step_ns != post.step_ns:
            with self._lock:
                post.every, post.cost_ns, post.step_ns = every, cost_ns, step_ns
            self._version += 1

    def _open_record(self, step: int) -> _Open:
        """`step`'s open record, opened now (outside forward(): See `_opened`) if none is."""
        rec = self._open.get(step)
        if rec is None:
            rec = self._record(step)
            self._opened()
        return rec

    def _opened(self) -> None:
        """A record opened outside forward(): the watch's plain-steps window is void."""
        self._version += 1
        if self.on_change is not None:
            self.on_change()

    def _fold(self) -> None:
        """The run of clean steps into the post's ranges."""
        first, last, out = self.run
        if last >= first:
            with self._lock:
                _merge(self._post.gchk, first, last)
                if out:
                    _merge(self._post.ochk, first, last)

    def backward_done(self, step: int) -> None:
        """The backward of `step` is over (its local gradients, if checked, all seen)."""
        self._settle(step + 1)

    def _check_params(self, rec: _Open) -> tuple[str, Any, Any] | None:
        """The loss is non-finite: are the parameters themselves (once per such step)? On CPU
        answered now; on a device, one fused max-abs whose values are read later (returned as
        a pending item: no host sync)."""
        params = self.params
        devices = {p.device for p in params}
        if len(devices) != 1 or next(iter(devices)).type == "cpu":
            rec.params = [i for i, p in enumerate(params) if bool(nonfinite(p))]
            return None
        return ("params", None, _Late(_max_abs(params)))

    def _settle(self, before: int) -> None:
        """Close the open steps before `before` whose flags are all readable."""
        changed = bad = False
        for step in sorted(self._open):
            if step >= before:
                break
            rec = self._open[step]
            if not rec.resolve(self):
                break
            del self._open[step]
            bad = self._close(rec) or bad
            changed = True
        if changed:
            self._version += 1
            if not self._open:
                self._post.done = max(self._post.done, min(before - 1, self._post.fwd))
            if bad and self.on_change is not None:
                self.on_change()  # (precise steps from here: the watch's plain window is void)

    def _close(self, rec: _Open) -> bool:
        """Post a settled step; True when something in it was non-finite."""
        post = self._post
        with self._lock:
            post.done = rec.step
            if rec.checked:
                _add(post.gchk, rec.step)
            if rec.loss or rec.grads or rec.params:
                self._precise(rec.step + 1 + PRECISE_FOR)
                if len(post.bad) < _MAX_RECORDS:
                    post.bad.append(_Record(
                        rec.step, rec.loss, rec.grads[:_MAX_NAMES], len(rec.grads),
                        rec.params[:_MAX_NAMES], len(rec.params), rec.checked))
                else:
                    post.more += 1
                return True
        return False

    def _sync_last(self) -> None:
        """Steps the fast path saw (`last`) into the post: seen, and final up to the one
        before (unless a step is still open)."""
        post, last = self._post, self.last
        first, end, out = self.run
        if end >= first:  # (the lock is held)
            _merge(post.gchk, first, end)
            if out:
                _merge(post.ochk, first, end)
        if last > post.fwd:
            post.fwd = last
            if not self._open:
                post.done = max(post.done, last - 1)

    def close(self) -> None:
        """The DDP is done: every step seen is final."""
        self._settle(1 << 62)
        with self._lock:
            self._sync_last()
            self._post.done = max(self._post.done, self._post.fwd)
        self._version += 1

    # --- the pulse thread (probes/pulse.py) ---------------------------------------------------

    def pulse(self, board: Any) -> None:
        """Post this rank's state when it changed (once any rank saw something non-finite),
        read the others' and compose what every rank is done with."""
        store = board.scope.store
        base = f"{board.base}/nf"
        with self._lock:
            self._sync_last()
            version, data = (self._version, self.last), None
            if version != self._posted and (self._post.bad or self._seen_count):
                data = _encode(self._post)
            new_bad = len(self._post.bad) + self._post.more
        if data is not None:
            self._posted = version
            board.post("nf", data.decode())
            if new_bad > self._bad_posted:
                self._bad_posted = new_bad
                store.add(f"{base}/count", 1)
        now = time.monotonic()
        if now - self._last_read < _READ_S and data is None:
            return
        self._last_read = now
        count = int(store.add(f"{base}/count", 0))
        if count == 0:
            return
        self._seen_count = count
        self._posts = posts = board.posts("nf", _decode)
        first_bad = min((b.step for p in posts.values() for b in p.bad
                         if b.step > self._composed), default=None)
        if first_bad is not None:  # something went non-finite: check every step from now on
            self._remote_precise = max(self._remote_precise, first_bad + 1 + PRECISE_FOR)
            self.quiet_from = max(self.quiet_from, self._remote_precise)
            if self.on_change is not None:
                self.on_change()
        for finding in self.compose():
            self._report(finding)

    def compose(self) -> list[Finding]:
        """Findings for the non-finite steps every rank is done with, in step order."""
        posts = self._posts
        if len(posts) < self.world_size:
            return []
        done = min(p.done for p in posts.values())
        steps = sorted({b.step for p in posts.values() for b in p.bad
                        if self._composed < b.step <= done})
        out = []
        for step in steps:
            f = self._compose_step(step, posts)
            if f is not None:
                out.append(f)
        if done > self._composed:
            self._composed = done
        return out

    def _compose_step(self, step: int, posts: dict[int, _Post]) -> Finding | None:
        recs = {r: next((b for b in p.bad if b.step == step), None) for r, p in posts.items()}
        continued = step == self._last_bad + 1
        self._last_bad = step
        p_ranks = tuple(r for r, b in recs.items() if b is not None and b.params)
        g_ranks = tuple(r for r, b in recs.items() if b is not None and b.grads)
        l_ranks = tuple(r for r, b in recs.items() if b is not None and b.loss)
        if continued or len(self.findings) >= MAX_FINDINGS:
            self.repeats += 1
            return None
        if p_ranks:
            first = recs[p_ranks[0]]
            assert first is not None
            key = ("nonfinite_parameter", p_ranks, self.names[first.params[0]])
        elif g_ranks or l_ranks:
            r0 = (g_ranks or l_ranks)[0]
            first = recs[r0]
            assert first is not None
            name = self.names[first.grads[0]] if first.grads else ""
            key = ("nonfinite_gradient", g_ranks or l_ranks, name)
        else:
            return None
        if key in self._origins:
            self.repeats += 1
            return None
        self._origins.add(key)
        if p_ranks:
            return self._parameter_finding(step, recs, p_ranks, posts)
        return self._gradient_finding(step, recs, g_ranks, l_ranks, posts)

    def _names(self, indices: Sequence[int], total: int) -> str:
        shown = ", ".join(repr(self.names[i]) for i in indices[:_MAX_NAMES] if
                          0 <= i < len(self.names))
        return shown + (f" and {total - len(indices[:_MAX_NAMES])} more"
                        if total > len(indices[:_MAX_NAMES]) else "")

    def _gradient_finding(self, step: int, recs: dict[int, _Record | None],
                          g_ranks: tuple[int, ...], l_ranks: tuple[int, ...],
                          posts: dict[int, _Post]) -> Finding:
        states: dict[int, str] = {}
        for r in sorted(posts):
            b = recs[r]
            loss = ("loss non-finite" if b is not None and b.loss else "loss finite" if
                    _in(step, posts[r].ochk) else "loss not checked at this step")
            if b is not None and b.grads:
                grads = f"local gradient non-finite: {self._names(b.grads, b.n_grads)}"
            elif (b is not None and b.checked) or _in(step, posts[r].gchk):
                grads = "local gradients finite"
            else:
                grads = "local gradients not checked at this step"
            states[r] = f"{loss}, {grads}"
        ranks = g_ranks or l_ranks
        first = recs[ranks[0]]
        assert first is not None
        param = first.grads[0] if first.grads else -1
        loss_bad = all(r in l_ranks for r in ranks)
        # (an origin rank whose loss was not checked at this step: the fix does not presume
        # the backward)
        unchecked = not loss_bad and any(r not in l_ranks and not _in(step, posts[r].ochk)
                                         for r in ranks)
        where = f" '{self.names[param]}'" if param >= 0 else ""
        what = "local gradient" + where if param >= 0 else "forward output (loss)"
        title = (f"non-finite {what} on {format_ranks(ranks)} at step {step}, before the "
                 "all-reduce spread it to every rank" + (" (the loss was already non-finite "
                                                         "there)" if loss_bad else ""))
        detail = [f"first in gradient-ready order on {format_ranks(ranks[:1])}: "
                  f"{self._names(first.grads, first.n_grads)}"] if first.grads else [
            f"the local gradients of {format_ranks(ranks)} were not checked at step {step}; "
            f"they are checked on every step from step {step + 1} on"]
        if self.repeats:
            detail.append(f"{self.repeats} earlier non-finite step(s) not reported again")
        return Finding(
            kind="nonfinite_gradient", severity="warning", title=title, ranks=ranks,
            param=param, name=self.names[param] if param >= 0 else "",
            field="loss" if loss_bad else "gradient", step=step,
            values=group_ranks(states), detail=tuple(detail),
            fix=fix_for("nonfinite_gradient", "loss" if loss_bad else "unchecked" if unchecked
                        else "", ranks=format_ranks(
                ranks), step=step), world_size=self.world_size)

    def _parameter_finding(self, step: int, recs: dict[int, _Record | None],
                           p_ranks: tuple[int, ...], posts: dict[int, _Post]) -> Finding:
        first = recs[p_ranks[0]]
        assert first is not None
        states = {}
        for r in sorted(posts):
            b = recs[r]
            states[r] = (f"non-finite: {self._names(b.params, b.n_params)}"
                         if b is not None and b.params else "finite")
        last = _last_finite(step, posts)  # the last forward seen finite on every rank
        prev = step - 1
        checked = [r for r, p in posts.items() if _in(prev, p.gchk)]
        if last == prev and len(checked) == len(posts):
            variant = ""
            when = f"in step {prev}'s update"
            detail = [f"step {prev}'s forward output and local gradients were finite on every "
                      "rank, so its optimizer step (or code between its backward and this "
                      "forward) made the parameters non-finite"]
        else:
            variant = "unseen"
            unchecked = [r for r in sorted(posts) if r not in checked]
            if last == prev:
                when = f"in step {prev}'s update"
                detail = [f"step {prev}'s forward output was finite on every rank; its local "
                          f"gradients were not checked on {format_ranks(unchecked)} ("
                          f"{_why_unchecked(self.level, posts)})"]
            else:
                since = "the start" if last < 0 else f"step {last}'s forward"
                when = f"between {since} and step {step}'s forward"
                detail = [f"the forward output was last seen finite on every rank at "
                          f"{since}; the steps after it were not checked ("
                          f"{_why_unchecked(self.level, posts)})"]
            detail += ["so whether a gradient (on which rank) or the optimizer step made them "
                       "non-finite was not seen",
                       f"the local gradients are checked on every step from step {step} on"]
        if self.repeats:
            detail.append(f"{self.repeats} earlier non-finite step(s) not reported again")
        param = first.params[0]
        return Finding(
            kind="nonfinite_parameter", severity="error",
            title=f"parameters became non-finite {when} on {format_ranks(p_ranks)} (seen at "
                  f"step {step}'s forward): {self._names(first.params, first.n_params)}",
            ranks=p_ranks, param=param, name=self.names[param], field="parameter",
            step=prev if last == prev else last + 1, values=group_ranks(states),
            detail=tuple(detail), fix=fix_for("nonfinite_parameter", variant),
            world_size=self.world_size)

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.tap.enabled:
            self.tap.emit_as(finding.step, time.monotonic_ns(), FindingReported, finding)
        if not self._warned:  # once on stderr; later findings go to the events only
            self._warned = True
            warnings.warn(warning_of(finding), stacklevel=1)

    def compose_local(self) -> None:
        """No board (one rank, or the watchdog off): compose from this rank's own state."""
        with self._lock:
            self._sync_last()
        self._posts = {self.rank: self._post} if self.world_size == 1 else {}
        for finding in self.compose():
            self._report(finding)


def _add(ranges: list[list[int]], step: int) -> None:
    """Add `step` to sorted [first, last] ranges, keeping the last _MAX_RANGES."""
    if ranges and ranges[-1][0] <= step <= ranges[-1][1] + 1:
        ranges[-1][1] = max(ranges[-1][1], step)
    else:
        _merge(ranges, step, step)


def _merge(ranges: list[list[int]], first: int, last: int) -> None:
    """Add the steps first..last to sorted [first, last] ranges (in any order: the every-step
    run is folded after later sampled steps), keeping the last _MAX_RANGES."""
    if ranges and ranges[-1][0] <= first <= ranges[-1][1] + 1:
        ranges[-1][1] = max(ranges[-1][1], last)
        return
    if not ranges or first > ranges[-1][1] + 1:  # after them all (the thinned check's steps)
        ranges.append([first, last])
        if len(ranges) > _MAX_RANGES:
            del ranges[0]
        return
    merged: list[list[int]] = []
    for a, b in sorted([*ranges, [first, last]]):
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    ranges[:] = merged[-_MAX_RANGES:]


def _in(step: int, ranges: Sequence[Sequence[int]]) -> bool:
    return any(a <= step <= b for a, b in ranges)


def _last_finite(step: int, posts: dict[int, _Post]) -> int:
    """The last step before `step` whose forward output every rank checked and saw finite
    (-1: none in what the ranks posted)."""
    last = step - 1
    while last >= 0:
        if all(_in(last, p.ochk) and not any(b.step == last and b.loss for b in p.bad)
               for p in posts.values()):
            return last
        # jump to the latest step before `last` that some rank's ranges could hold
        below = [min(last - 1, b) for p in posts.values() for a, b in p.ochk if a < last]
        if not below:
            return -1
        last = max(below)
    return -1


def _why_unchecked(level: str, posts: dict[int, _Post]) -> str:
    if level != "hook-less":
        return "no check ran on that step"
    return _thinned(posts) or (
        "the hook-less level checks local gradients on every step where its hooks saw the "
        "whole backward (none with every=None), and forward outputs on steps 0-2 and every "
        f"{OUTPUT_EVERY}th step, until something is non-finite")


def _thinned(posts: dict[int, _Post]) -> str:
    """What the check's budget thinned, per rank ("" when nothing was): See [Note: the
    check's budget] (check_budget.py)."""
    periods: dict[int, list[int]] = {}
    for r, p in sorted(posts.items()):
        if p.every > 1:
            periods.setdefault(p.every, []).append(r)
    if not periods:
        return ""
    parts = []
    for every, ranks in sorted(periods.items()):
        p = posts[ranks[0]]
        parts.append(f"every {ordinal(every)} step on {format_ranks(tuple(ranks))}, where it "
                     f"took {human_duration(p.cost_ns)} a step against steps of "
                     f"{human_duration(p.step_ns)}")
    return ("the default's check of local gradients and forward outputs, held to "
            f"{SHARE:.0%} of a step, ran " + "; ".join(parts))
