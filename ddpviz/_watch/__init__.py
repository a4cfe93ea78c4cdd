"""`watch(ddp)`: ddpviz's events, findings and hang watchdog on a stock
`torch.nn.parallel.DistributedDataParallel`, so the same widgets and diagnosis work on torch's
own DDP, without changing what it computes. See [Note: transparent by construction]
(guarded.py).

What is observable from Python, and used: the reducer's parameter list (the same rule as
ddpviz's engine, params.py), its bucket map (`reducer._get_zeros_like_grad_buckets()`, once at
attach and once after the rebuild), a hook per parameter (a post-accumulate-grad hook: GradReady
or a per-bucket aggregate; without the guard, the default, a tensor gradient hook on sampled
steps only, whose bucket's last one is its BucketReady), a comm hook around the all-reduce
(`Recording(guard=True)`: BucketReady, AllReduceLaunched, AllReduceDone; see [Note: settled on
the training thread] in guarded.py; without it the hang guard is probes/quiet.py), a wrapper of
the DDP's forward (steps, heartbeats, the rebuild; See [Note: forward wrapped, not hooked] in
base.py), a pre-forward buffer comm hook doing torch's buffer broadcast under the watchdog, and
end-of-backward callbacks (parameters that got no gradient; errors).

The package: base.py is `Watch`, what every recording does (parameters and bucket maps, the
wrapped forward, the guarded buffer broadcast and bucket rebuild, the end-of-backward checks);
`new_watch` here chooses one of the two strategies once, when the Watch is created, from
`Recording.guard` (See [Note: recording policy] in recording.py): hookless.py (no comm hook:
per-parameter hooks armed on the sampled steps only, or none) and guarded.py (watch's comm hook
around each bucket all-reduce, settled on the training thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddpviz._watch.base import NotObservableError, Watch
from ddpviz._watch.guarded import LAZY_VIEWS_UNGUARDED, GuardedWatch
from ddpviz._watch.hookless import ForwardsOnlyWatch, HooklessWatch
from ddpviz.events import Emitter
from ddpviz.recording import Recording, resolve_recording

__all__ = ["NotObservableError", "Watch", "new_watch", "watch"]


def watch(ddp: nn.parallel.DistributedDataParallel, *, emitter: Emitter | None = None,
          hook: Callable[[Any, dist.GradBucket], torch.futures.Future] | None = None,
          state: Any = None, hang_timeout: float | None = None,
          recording: Recording | None = None, detail: str | None = None) -> Watch:
    """Attach ddpviz to a torch DDP (call on every rank, after constructing it, best before
    the first forward).

    Parameters, gradients and buffers stay bitwise what the unwatched DDP computes: tested
    against an unwatched twin at world sizes 2, 3 and 4 with fp32/bf16/fp16 parameters, with and
    without a comm hook, gradient_as_bucket_view (.grad reset or kept), static_graph,
    find_unused_parameters, no_sync, batched_grad_copy and sparse gradients
    (tests/dist/test_watch_transparency.py). Not bit-exact, untested: `ddp.join()` with
    `divide_by_initial_world_size=False` once a rank has joined (torch then averages over the
    ranks still training, watch over the whole world), and backward(create_graph=True) with
    gradient_as_bucket_view and kept gradients. Errors watch diagnoses inside backward (a hang,
    a peer that failed) are raised from backward() as `ddpviz.RankHangError`. The training thread
    itself waits for the bucket all-reduces at the end of backward (See [Note: settled on the
    training thread]): Ctrl-C there is raised from backward() within 0.25 s, and an all-reduce
    it left running is waited for at the next forward.

    A comm hook registered before watch() is wrapped (watch() must then come before the first
    forward: torch allows one hook per reducer, so watch rebuilds the reducer once); one
    registered after it with `ddp.register_comm_hook(state, hook)` or
    `ddp._register_builtin_comm_hook(type)` is wrapped too.

    Args:
        ddp: a `torch.nn.parallel.DistributedDataParallel`.
        emitter: where events go (default: the process's default emitter, which
            `ddpviz.launch` and `ddpviz.connect()` install).
        hook: your comm hook, if you use one (`hook(state, bucket) -> Future`); the same as
            registering it with `ddp.register_comm_hook(state, hook)`. Default: none, i.e.
            DDP's own averaging, reproduced bit for bit.
        state: the hook's state (default: the DDP's process group).
        hang_timeout: seconds before a bucket all-reduce that does not complete is diagnosed
            (default $DDPVIZ_HANG_TIMEOUT, else 0.6 x the process group's timeout, at most
            300 s; 0 turns the watchdog off).
        recording: what is observed, and at what cost (a `ddpviz.Recording`; measured:
            benchmarks/bench_watch.py and docs/guide/recording.md; See [Note: recording policy] in
            recording.py). `guard=False` (the default): no comm hook, so torch's C++
            reduction runs untouched; per-parameter hooks only on the steps `every` picks
            (default 100: 0-2, the rebuild step, every 100th, the step after a finding), which
            record GradReady, BucketReady, the launches in bucket order, every all-reduce done
            after the backward and the unused-parameter diagnosis; the other steps record the
            forward only. A hang in the backward's all-reduces is named by the pulse thread
            (See [Note: the quiet guard] in probes/quiet.py) as a `rank_hang` finding and a
            warning at hang_timeout, but torch itself waits until the process group's timeout
            and raises its own error. `guard=True`: watch's comm hook around each bucket
            all-reduce, which raises a hang from backward() as RankHangError at hang_timeout,
            records per-bucket all-reduce times and, on the steps without per-parameter
            events, a GradsSummarized per bucket (count, bytes, first and last ready time).
            `every=1`: a GradReady per parameter on every step; `every=None`: on none. Every
            recording keeps per-forward heartbeats, the bucket maps, the guarded buffer
            broadcast and bucket rebuild. Default: $DDPVIZ_RECORDING, else `Recording()`.
        detail: deprecated (one release): the old level names ("light", "sampled", "full",
            ...), mapped to `recording=` with a DeprecationWarning naming it.

    Returns:
        A `Watch`; `.close()` removes the hooks it added (the comm hook stays, passing
        through: torch cannot unregister one).
    """
    if recording is None and detail is not None:  # the warning points at watch()'s caller
        recording, detail = resolve_recording(None, detail, where="watch()", stacklevel=2), None
    return new_watch(ddp, emitter=emitter, hook=hook, state=state, hang_timeout=hang_timeout,
                     recording=recording, detail=detail)


def new_watch(ddp: nn.parallel.DistributedDataParallel, *, recording: Recording | None = None,
              detail: str | None = None, **options: Any) -> Watch:
    """The Watch of `ddp`: the strategy that runs its recording (resolved here, deprecations
    warned about once, at the caller), made with `options` (Watch.__init__'s). What watch()
    and `ddpviz record` (record/autowatch.py) create."""
    if not isinstance(ddp, nn.parallel.DistributedDataParallel):
        raise TypeError(f"ddpviz: watch() takes a torch.nn.parallel.DistributedDataParallel, "
                        f"got {type(ddp).__name__}.\nA ddpviz.DistributedDataParallel "
                        "reports its events itself: pass it emitter= instead.")
    rec = resolve_recording(recording, detail, where="watch()", stacklevel=2)
    if rec.guard and getattr(ddp, "lazy_bucket_allocation", False) and \
            ddp.gradient_as_bucket_view:
        raise NotObservableError(f"ddpviz: {NotObservableError.PREFIX}{LAZY_VIEWS_UNGUARDED}.")
    return strategy(rec)(ddp, recording=rec, **options)


def strategy(recording: Recording) -> type[Watch]:
    """The Watch subclass that runs `recording`."""
    if recording.guard:
        return GuardedWatch
    return HooklessWatch if recording.every is not None else ForwardsOnlyWatch
