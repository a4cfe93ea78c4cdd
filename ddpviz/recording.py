"""The recording policy (`ddpviz.Recording`, `recording=`, $DDPVIZ_RECORDING) and, at the
source, which steps record a GradReady per parameter and which only a GradsSummarized per
bucket. See [Note: recording policy] and [Note: detail levels].

Shared by ddpviz's DistributedDataParallel (engine/reducer.py), `watch()` and `ddpviz record`.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from typing import Literal

from ddpviz.events import Emitter, Event, FindingReported, GradReady, GradsSummarized, Tap

Level = Literal["full", "buckets", "sampled"]
LEVELS: tuple[Level, ...] = ("full", "buckets", "sampled")
ENV_RECORDING = "DDPVIZ_RECORDING"
ENV_DETAIL = "DDPVIZ_DETAIL"  # deprecated: the old level names (See [Note: recording policy])
_now = time.monotonic_ns

# [Note: detail levels]
# full     every GradReady (one event per parameter per backward).
# buckets  no GradReady: one GradsSummarized per bucket and step (count, bytes, first and last
#          ready time), emitted just before that bucket's BucketReady. The hook only updates
#          four numbers per bucket: no event object per parameter.
# sampled  (the default) full on steps 0..FIRST_FULL-1, on the step whose forward rebuilt the
#          buckets, on every EVERY-th step, and on any step in which this rank reported a
#          finding (the per-parameter times of the current step are kept in a list and emitted
#          as GradReady, with their own times, when the finding is reported) and the step after
#          it; buckets otherwise.
# Why these numbers: benchmarks/bench_fleet.py (docs/scale.md "Events at scale"). A 1,000-parameter,
# 25-bucket model emits ~1,100 events per rank and step at full, ~110 at buckets; at 256 ranks
# and 1 step/s that is 280k vs 28k events/s into one collector. Sampled every 100th step
# averages ~120 events per rank and step.
FIRST_FULL = 3
EVERY = 100
REPLICAS_EVERY = 25  # the replica check's default period (See [Note: replica digests])

# [Note: recording policy]
# Two independent choices, the same words for watch(), ddpviz's DDP, `ddpviz record` and
# $DDPVIZ_RECORDING (one default, `Recording()`, for every engine):
#   guard  watch(): its comm hook around each bucket all-reduce (per-bucket all-reduce times,
#          a hang raised from backward() as RankHangError, a GradsSummarized per bucket on the
#          steps without per-parameter detail) or none (torch's C++ reduction untouched, the
#          hang named by probes/quiet.py). ddpviz's DDP is always guarded: its all-reduce is
#          Python already, so the guard costs it nothing and `guard` changes nothing there.
#   every  which steps record a GradReady per parameter: 1 every step, N (default 100) steps
#          0..FIRST_FULL-1, the rebuild, every N-th and around a finding, None no step.
# The per-bucket summaries are not a third choice: they come with the guard, whose comm hook
# sees every bucket anyway (without it, a summary would need a hook per parameter on every
# step, which is what the hook-less recording avoids).
# The old level names map exactly (OLD_SPELLINGS) and still work for one release, with a
# DeprecationWarning naming the new spelling.
# stack_source is not about the backward: it keeps the user's source text out of the hang
# stacks a rank posts (file:line and function stay), for code whose lines hold secrets
# (docs/security.md). Each rank formats its own stack, so each rank's policy decides for it.


NEVER = 1 << 62  # plain_until's answer for "no step from here on" (See [Note: plain steps])


@dataclasses.dataclass(frozen=True, slots=True)
class Recording:
    """What ddpviz records of each backward, and whether watch() guards the all-reduce.

    Args:
        guard: watch() puts its comm hook around each bucket all-reduce: per-bucket all-reduce
            times, a GradsSummarized per bucket on the steps without per-parameter detail, and
            a hang in backward raised from backward() as `ddpviz.RankHangError`. False (the
            default): no comm hook, torch's C++ reduction runs untouched, a hang is named by
            ddpviz's pulse thread but raised by torch at the process group's timeout.
            ddpviz's DistributedDataParallel is always guarded (its all-reduce is Python).
        every: which steps record a GradReady per parameter: N (default 100) on steps 0-2,
            the bucket-rebuild step, every N-th step and the step of this rank's finding and
            the next; 1 every step; None no step.
        replicas: the replica check (docs/replicas.md): every N-th step (default 25) each
            rank digests its parameters, reduced gradients and buffers bitwise and the ranks
            compare the digests over the store (no collective); 1 every step (the first
            differing step exactly); None off.
        stack_source: hang findings show where a rank waits as a stack of file:line, function
            and that line's source text (True, the default); False leaves the source text out
            (it may hold secrets, and the stack travels over the store, into traces and
            reports: docs/security.md). Also read, from $DDPVIZ_RECORDING, for the stacks
            `ddpviz.launch` takes of a hung rank.

    In the environment (launched and torchrun ranks, `ddpviz record`):
    `DDPVIZ_RECORDING="guard,every=100"`, `"every=1"`, `"guard,every=never"`,
    `"stack_source=false"` (see `parse`).
    """

    guard: bool = False
    every: int | None = EVERY
    replicas: int | None = REPLICAS_EVERY
    stack_source: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.guard, bool):
            raise TypeError(f"ddpviz: Recording(guard={self.guard!r}) is not a bool.\nUse "
                            "guard=True (watch's comm hook) or guard=False.")
        if not isinstance(self.stack_source, bool):
            raise TypeError(f"ddpviz: Recording(stack_source={self.stack_source!r}) is not a "
                            "bool.\nUse stack_source=False (no source text in hang stacks) or "
                            "stack_source=True (the default).")
        if self.every is not None and (isinstance(self.every, bool)
                                       or not isinstance(self.every, int) or self.every < 1):
            raise ValueError(f"ddpviz: Recording(every={self.every!r}) is not a step period.\n"
                             "Use every=N (N >= 1; 1: every step) or every=None (no "
                             "per-parameter events).")
        if self.replicas is not None and (isinstance(self.replicas, bool) or not isinstance(
                self.replicas, int) or self.replicas < 1):
            raise ValueError(f"ddpviz: Recording(replicas={self.replicas!r}) is not a step "
                             "period.\nUse replicas=N (N >= 1; 1: every step) or replicas=None "
                             "(no replica check).")

    def __str__(self) -> str:
        """The $DDPVIZ_RECORDING spelling."""
        every = "never" if self.every is None else str(self.every)
        replicas = "" if self.replicas == REPLICAS_EVERY else \
            f",replicas={'never' if self.replicas is None else self.replicas}"
        source = "" if self.stack_source else ",stack_source=false"
        return ("guard," if self.guard else "") + f"every={every}" + replicas + source

    def spelled(self) -> str:
        """The Python spelling, as advice and warnings show it (`str()` gives the
        $DDPVIZ_RECORDING one).

        Returns:
            A constructor call that builds this policy, e.g.
            `"ddpviz.Recording(guard=True, every=100)"` (`replicas` and `stack_source` only
            when not the default).
        """
        replicas = "" if self.replicas == REPLICAS_EVERY else f", replicas={self.replicas}"
        source = "" if self.stack_source else ", stack_source=False"
        return f"ddpviz.Recording(guard={self.guard}, every={self.every}{replicas}{source})"

    @classmethod
    def parse(cls, text: str, *, where: str = f"${ENV_RECORDING}=") -> Recording:
        """Read a policy in its $DDPVIZ_RECORDING spelling, e.g. `"guard,every=100"`.

        Args:
            text: comma-separated items, in any order, each at most once: `guard` (or
                `guard=true|false|1|0|on|off|yes|no`), `every=N` or `every=never`,
                `replicas=N` or `replicas=never`, `stack_source=false` (or
                `stack_source=true`, the default; the same words as guard); case and spaces do
                not matter. What is left out keeps its default; "" is the default policy.
            where: where `text` came from, to start the error message with (default
                "$DDPVIZ_RECORDING=").

        Returns:
            The `Recording` it spells; `str()` of it gives back an equivalent text.

        Raises:
            ValueError: an unknown or repeated item, or a period below 1; names the item,
                and the new spelling when it is one of the old level names ("sampled", ...).
        """
        guard = False
        every: int | None = EVERY
        replicas: int | None = REPLICAS_EVERY
        stack_source = True
        seen: set[str] = set()
        for raw in text.split(","):
            item = raw.strip().lower()
            if not item:
                continue
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            ok = key not in seen
            seen.add(key)
            if key in ("guard", "stack_source") and ok:
                flags = {"": True, "true": True, "1": True, "on": True, "yes": True,
                         "false": False, "0": False, "off": False, "no": False}
                ok = (value in flags) and (bool(value) or not eq)
                if key == "guard":
                    guard = flags.get(value, False)
                else:
                    stack_source = flags.get(value, True)
            elif key in ("every", "replicas") and eq and ok:
                period: int | None = None
                if value not in ("never", "none"):
                    try:
                        period = int(value)
                    except ValueError:
                        period = 0
                    ok = period >= 1
                if key == "every":
                    every = period
                else:
                    replicas = period
            else:
                ok = False
            if not ok:
                old = _OLD_SPELLINGS.get(item.partition(":")[0])
                hint = (f"\n{item!r} is an old level name: write {_old(item)!s}."
                        if old is not None and _old(item) is not None else "")
                raise ValueError(
                    f"ddpviz: {where}{text!r} is not a recording policy ({raw.strip()!r}: "
                    "expected 'guard', 'guard=false', 'every=N' with N >= 1 or 'every=never', "
                    "'replicas=N' or 'replicas=never', 'stack_source=false', "
                    f"each at most once, comma-separated).{hint}\nUse e.g. "
                    f"'{Recording()}' (the default), 'guard,every=100' or 'every=1'.")
        return cls(guard, every, replicas, stack_source)


# The old level names: (guard, every); `None` in every = no per-parameter step; ":N" -> every.
_OLD_SPELLINGS: dict[str, tuple[bool, int | None]] = {
    "light": (False, EVERY), "steps": (False, None), "sampled": (True, EVERY),
    "full": (True, 1), "params": (True, 1), "buckets": (True, None)}


def _old(value: str) -> Recording | None:
    name, colon, n = value.strip().lower().partition(":")
    spelled = _OLD_SPELLINGS.get(name)
    if spelled is None or (colon and name not in ("light", "sampled")):
        return None
    every = spelled[1]
    if colon:
        try:
            every = int(n)
        except ValueError:
            return None
        if every < 1:
            return None
    return Recording(spelled[0], every)


def from_old(value: str, *, where: str, env: bool = False, stacklevel: int = 2) -> Recording:
    """An old level name (`detail="sampled:7"`, $DDPVIZ_DETAIL) as its Recording, with a
    DeprecationWarning that names the new spelling; a ValueError for anything else."""
    rec = _old(value)
    if rec is None:
        raise ValueError(
            f"ddpviz: {where}{value!r} is not a detail level (and `detail=` / ${ENV_DETAIL} "
            "are deprecated).\n" + (f"Set {ENV_RECORDING}, e.g. '{Recording()}' (the default) "
                                     "or 'guard,every=100'." if env else
                                     "Pass recording=ddpviz.Recording(guard=..., every=...), "
                                     "e.g. ddpviz.Recording() (the default)."))
    new = f"{ENV_RECORDING}={rec}" if env else f"recording={rec.spelled()}"
    warnings.warn(f"ddpviz: {where}{value!r} is deprecated and goes in the next release; use "
                  f"{new} (the same recording).", DeprecationWarning, stacklevel=stacklevel + 1)
    return rec


def resolve_recording(recording: Recording | None, detail: str | None = None, *,
                      where: str, stacklevel: int = 2) -> Recording:
    """The recording from `recording=`, else the deprecated `detail=`, else $DDPVIZ_RECORDING,
    else the deprecated $DDPVIZ_DETAIL, else `Recording()`. `where` names the call
    ("watch()")."""
    if recording is not None and detail is not None:
        raise TypeError(f"ddpviz: {where} got both recording= and detail=.\nPass recording= "
                        "only (detail= is its deprecated old spelling).")
    if recording is not None:
        if not isinstance(recording, Recording):
            raise TypeError(f"ddpviz: {where} recording={recording!r} is not a "
                            "ddpviz.Recording.\nPass e.g. recording=ddpviz.Recording(guard=True, "
                            "every=100); the string form is $DDPVIZ_RECORDING's.")
        return recording
    if detail is not None:
        return from_old(detail, where=f"{where} detail=", stacklevel=stacklevel + 1)
    raw = os.environ.get(ENV_RECORDING, "")
    if raw.strip():
        return Recording.parse(raw)
    raw = os.environ.get(ENV_DETAIL, "")
    if raw.strip():
        return from_old(raw, where=f"${ENV_DETAIL}=", env=True, stacklevel=stacklevel + 1)
    return Recording()


def stack_source_from_env() -> bool:
    """Whether $DDPVIZ_RECORDING lets stacks carry source text (`Recording.stack_source`), for
    the stacks taken outside a DDP's own recording: `ddpviz.launch`'s of a hung rank, the
    construction check of `ddpviz record`. An unreadable policy (the ranks raise on it) keeps
    the source out.

    Returns:
        True when unset or when the policy shows source text; False otherwise.
    """
    try:
        return Recording.parse(os.environ.get(ENV_RECORDING, "")).stack_source
    except ValueError:
        return False


def parse_level(value: str, *, where: str) -> tuple[Level, int]:
    """`DetailPolicy.describe()`'s spelling, `"full" | "buckets" | "sampled:N"`, back to
    (level, every): the per-step policy inside the engine, read by benchmarks/bench_fleet.py.
    Users spell a `Recording` (its `parse` reads $DDPVIZ_RECORDING)."""
    text = value.strip().lower()
    name, _, every_text = text.partition(":")
    every = EVERY
    if name == "sampled" and every_text:
        try:
            every = int(every_text)
        except ValueError:
            every = 0
    if name not in LEVELS or (every_text and name != "sampled") or every < 1:
        raise ValueError(
            f"ddpviz: {where}{value!r} is not a per-step policy; expected 'full', 'buckets', "
            "'sampled' or 'sampled:N' (N >= 1: every N-th step full).\nUse one of those "
            "(DetailPolicy.describe() spells them).")
    return name, every


class DetailPolicy:
    """Decides per step whether per-parameter events are recorded (see the Note)."""

    __slots__ = ("_finding_steps", "_rebuild_steps", "every", "first", "level")

    def __init__(self, level: Level = "sampled", every: int = EVERY,
                 first: int = FIRST_FULL) -> None:
        self.level: Level = level
        self.every = every
        self.first = first
        self._finding_steps: set[int] = set()
        self._rebuild_steps: set[int] = set()

    @classmethod
    def of(cls, recording: Recording) -> DetailPolicy:
        """The per-step policy of `recording` (its `every`; the guard is the caller's)."""
        if recording.every is None:
            return cls("buckets")
        if recording.every == 1:  # the same steps as sampled:1, without keeping a log
            return cls("full")
        return cls("sampled", recording.every)

    def full(self, step: int) -> bool:
        """Whether `step` records a GradReady per parameter."""
        if self.level == "full":
            return True
        if self.level == "buckets":
            return False
        return (step < self.first or step % self.every == 0 or step in self._rebuild_steps
                or step in self._finding_steps or (step - 1) in self._finding_steps)

    def plain_until(self, step: int) -> int:
        """The first step from `step` on that records per-parameter events, as far as is
        known now (a finding noted later changes it). See [Note: plain steps]
        (_watch/base.py)."""
        if self.level == "full" or step < self.first:
            return step
        if self.level == "buckets":
            return NEVER
        end = -(-step // self.every) * self.every
        for noted in (*self._rebuild_steps, *self._finding_steps):
            if noted >= step - 1:  # (a finding's step and the next are full)
                end = min(end, max(noted, step))
        return end

    def note_rebuild(self, step: int) -> None:
        self._rebuild_steps.add(step)

    def note_finding(self, step: int) -> None:
        self._finding_steps.add(step)

    def describe(self) -> str:
        if self.level == "sampled":
            return f"sampled:{self.every}"
        return self.level


class FindingObserver:
    """An emitter in front of another: after each FindingReported it passes on, calls
    `on_finding(step)` (the sampled level makes that step and the next full)."""

    __slots__ = ("emitter", "on_finding")

    def __init__(self, emitter: Emitter, on_finding: Callable[[int], None]) -> None:
        self.emitter = emitter
        self.on_finding = on_finding

    def __call__(self, event: Event, /) -> None:
        self.emitter(event)
        if type(event) is FindingReported:
            self.on_finding(event.step)

    def flush(self, timeout: float = 10.0) -> bool:
        """The emitter's `flush` (a `Sender`'s), where it has one; True otherwise."""
        flush = getattr(self.emitter, "flush", None)
        return bool(flush(timeout)) if callable(flush) else True


class GradSummary:
    """One rank's gradient-ready facts of the current backward at the level its policy picks:
    `per_param` steps emit a GradReady per hook (the caller does), the others call `add` per
    hook (four numbers updated, no event object) and `emit(bucket)` just before the bucket's
    BucketReady, which emits one GradsSummarized. At the sampled level the aggregated step's
    (param, bucket, time) triples are kept until the next backward, so that a finding
    (`note_finding`) can still emit them as GradReady events with their own times."""

    __slots__ = ("_agg", "_keep", "_log", "_step", "per_param", "policy", "tap")

    def __init__(self, policy: DetailPolicy, tap: Tap) -> None:
        self.policy = policy
        self.tap = tap
        self.per_param = True
        self._agg: dict[int, list[int]] = {}  # bucket -> [n_grads, first_t, last_t, nbytes]
        self._keep = policy.level == "sampled"  # keep (param, bucket, t) for a late finding
        self._log: list[tuple[int, int, int]] = []
        self._step = -1

    def begin(self, step: int) -> None:
        """A backward starts at `step`: pick its level, forget the previous aggregates."""
        self.per_param = self.policy.full(step)
        self._agg = {}
        self._log = []
        self._step = step

    def add(self, index: int, bucket: int, nbytes: int) -> None:
        t = _now()
        agg = self._agg.get(bucket)
        if agg is None:
            self._agg[bucket] = [1, t, t, nbytes]
        else:
            agg[0] += 1
            agg[2] = t
            agg[3] += nbytes
        if self._keep:
            self._log.append((index, bucket, t))

    def emit(self, bucket: int) -> None:
        agg = self._agg.pop(bucket, None)
        if agg is not None and self.tap.enabled:
            self.tap.emit(GradsSummarized, bucket, *agg)

    def note_finding(self, step: int) -> None:
        """A finding at `step`: that step and the next become full; what was kept of it is
        emitted now as GradReady events."""
        self.policy.note_finding(step)
        log, self._log = self._log, []
        if step != self._step or not self.tap.enabled:
            return
        for index, bucket, t in log:
            self.tap.emit_as(step, t, GradReady, index, bucket)
