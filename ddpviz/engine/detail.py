"""Detail levels at the source: which steps record a GradReady per parameter and which only a
GradsSummarized per bucket. See [Note: detail levels].

Shared by ddpviz's DistributedDataParallel (`detail=`, engine/reducer.py) and `watch()`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal

from ddpviz.events import Emitter, Event, FindingReported, GradReady, GradsSummarized, Tap

Level = Literal["full", "buckets", "sampled"]
LEVELS: tuple[Level, ...] = ("full", "buckets", "sampled")
ENV_DETAIL = "DDPVIZ_DETAIL"
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
# Why these numbers: benchmarks/bench_fleet.py (README "Events at scale"). A 1,000-parameter,
# 25-bucket model emits ~1,100 events per rank and step at full, ~110 at buckets; at 256 ranks
# and 1 step/s that is 280k vs 28k events/s into one collector. Sampled every 100th step
# averages ~120 events per rank and step.
FIRST_FULL = 3
EVERY = 100


def parse_level(value: str, *, where: str, also: str = "",
                default: str = "sampled") -> tuple[Level, int]:
    """`"full" | "buckets" | "sampled" | "sampled:N"` -> (level, every). `where` names the
    argument in the error ("detail=", "$DDPVIZ_DETAIL"); `also` names further choices."""
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
            f"ddpviz: {where}{value!r} is not a detail level; expected 'full', 'buckets', "
            f"'sampled' or 'sampled:N' (N >= 1: every N-th step full){also}.\nUse '{default}' (the "
            "default) for long or large jobs, 'full' to record every gradient hook.")
    return name, every


def resolve_level(detail: str | None) -> tuple[Level, int]:
    """The level from `detail=`, else $DDPVIZ_DETAIL (launched and torchrun ranks), else
    'sampled'."""
    if detail is not None:
        return parse_level(detail, where="detail=")
    raw = os.environ.get(ENV_DETAIL, "").strip()
    if raw:
        return parse_level(raw, where=f"${ENV_DETAIL}=")
    return "sampled", EVERY


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
    def resolve(cls, detail: str | None) -> DetailPolicy:
        level, every = resolve_level(detail)
        return cls(level, every)

    def full(self, step: int) -> bool:
        """Whether `step` records a GradReady per parameter."""
        if self.level == "full":
            return True
        if self.level == "buckets":
            return False
        return (step < self.first or step % self.every == 0 or step in self._rebuild_steps
                or step in self._finding_steps or (step - 1) in self._finding_steps)

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
