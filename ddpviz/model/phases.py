"""The one table naming DDP's phases: per event type, the phase text the status header shows
after it, the phase span it opens or closes (the report's timeline, the Chrome export) and the
line `ddpviz demo` prints for it. Every other phase table is derived from `PHASES`.

(The watchdog's coarser positions, `events.Phase` and `events.PHASE_OF_COLLECTIVE`, stay in the
vocabulary: the engine reads them and may not import the model.)
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from ddpviz import events as ev
from ddpviz.events import Event

SpanPhase = Literal["verify", "broadcast", "forward", "backward", "optimizer step"]


class PhaseRow(NamedTuple):
    """What one event type says about where its rank is."""

    status: str | None = None  # the status header's phase after it (None: it sets none)
    opens: SpanPhase | None = None  # the phase span it opens
    closes: SpanPhase | None = None  # the open phase span it ends
    demo: str | None = None  # the `ddpviz demo` progress line for it


PHASES: dict[type[Event], PhaseRow] = {
    ev.ParamsBuilt: PhaseRow("parameters built", demo="parameters built"),
    ev.VerificationStarted: PhaseRow("verifying", opens="verify"),
    ev.VerificationPassed: PhaseRow("verified", closes="verify", demo="verified across ranks"),
    ev.VerificationFailed: PhaseRow("verification failed", closes="verify",
                                    demo="VERIFICATION FAILED"),
    ev.BroadcastStarted: PhaseRow("broadcasting", opens="broadcast"),
    ev.BroadcastChunkSent: PhaseRow("broadcasting"),
    ev.BroadcastChunkDone: PhaseRow("broadcasting"),
    ev.BroadcastFinished: PhaseRow("broadcast done", closes="broadcast",
                                   demo="state broadcast from rank 0"),
    ev.BucketAssigned: PhaseRow("buckets assigned"),
    # a forward ends the previous one (a forward without a backward: evaluation, no_sync)
    ev.ForwardStarted: PhaseRow("forward", opens="forward", closes="forward"),
    ev.BuffersSynced: PhaseRow("forward"),
    ev.BucketsRebuilt: PhaseRow("forward", demo="buckets rebuilt in gradient-ready order"),
    ev.BackwardStarted: PhaseRow("backward", opens="backward", closes="forward"),
    ev.GradReady: PhaseRow("backward"),
    ev.GradsSummarized: PhaseRow("backward"),
    ev.BucketReady: PhaseRow("backward"),
    ev.AllReduceLaunched: PhaseRow("backward"),
    ev.AllReduceDone: PhaseRow("backward"),
    ev.UnusedParametersFound: PhaseRow("backward", demo="unused parameters found"),
    # (every step, hook-less watch: See [Note: backward marks] in probes/backward_marks.py)
    ev.BackwardComputed: PhaseRow("backward"),
    ev.BackwardFinished: PhaseRow("after backward", closes="backward", demo="backward done"),
    # (sampled steps only: See [Note: optimizer-step tap] in probes/optimizer_step.py)
    ev.OptimizerStepStarted: PhaseRow("optimizer step", opens="optimizer step"),
    ev.OptimizerStepFinished: PhaseRow("after optimizer step", closes="optimizer step"),
}

# Derived views, one per reader:
# the status header's phase after each event type that sets one
STATUS_OF: dict[type[Event], str] = {
    cls: row.status for cls, row in PHASES.items() if row.status is not None}
# the phase span each event type opens, and the one it closes
SPAN_OPENS: dict[type[Event], SpanPhase] = {
    cls: row.opens for cls, row in PHASES.items() if row.opens is not None}
SPAN_CLOSES: dict[type[Event], SpanPhase] = {
    cls: row.closes for cls, row in PHASES.items() if row.closes is not None}
# the demo's progress line per event type
DEMO_LINE: dict[type[Event], str] = {
    cls: row.demo for cls, row in PHASES.items() if row.demo is not None}
