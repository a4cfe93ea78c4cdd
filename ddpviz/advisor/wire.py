"""The advisor's answer as the front end draws it (extension/src/advice.ts): numbers and words
computed here, in Python, sent as msgpack data, never markup. The notebook's TraceView sends
it as a trait beside diagnose()'s findings, the HTML report embeds it beside the run; the
front end checks it on arrival as it checks a trace, and draws the recommendation, the
predicted step time against the cap and the recommended bucket map.

Bounded: at most MAX_ROWS candidates, texts cut at the limits a trace's own strings have, the
recommended map left out (said in `notes`) past MAX_MAP_ENTRIES parameters. The advisor replays
every recorded step for each of ~30 settings, far slower than diagnose() (measured here: 0.26 s
for 2,140 events, 2.8 s for 20,288, where diagnose() takes 16 and 86 ms), so a run over
MAX_EVENTS is not advised in a view (the message says how to get its advice), and the TraceView
computes it on a thread of its own, never on the way to the first paint.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from ddpviz.limits import MAX_NAME, MAX_TEXT

if TYPE_CHECKING:
    from ddpviz.advisor.advice import Advice

WIRE_VERSION = 1  # advice.ts reads this version only
MAX_ROWS = 1024  # candidates sent (the default sweep has about 30)
MAX_NOTES = 64
MAX_MAP_ENTRIES = 1 << 20  # parameter indices in the recommended map (limits.MAX_PARAMS)
MAX_EVENTS = 200_000  # events of a run a view advises on (about 30 s of the advisor here)
# ... and a report, which is written before anyone looks (the advisor replays every step for
# each setting: ~0.26 s at 2k events, ~2.8 s at 20k; `ddpviz report` should not wait 30 s)
REPORT_MAX_EVENTS = 50_000


class SentRow(msgspec.Struct, frozen=True):
    """One candidate's prediction, as Advice.to_records() says it."""

    label: str
    family: str  # "current" | "cap" | "first+cap" | "default" | "layers" | "user"
    setting: str  # how to write it in code
    cap_mb: float  # the largest bucket cap in MiB (the chart's x)
    step_ms: float  # predicted step time (the chart's y)
    exposed_ms: float  # predicted exposed communication
    buckets: int  # buckets after the rebuild
    current: bool
    recommended: bool


class SentMap(msgspec.Struct, frozen=True):
    """The recommended setting's bucket map (after the rebuild where DDP rebuilds)."""

    setting: str
    rebuilt: bool
    buckets: list[list[int]]  # parameter indices per bucket, bucket 0 reduced first
    bytes: list[int]  # gradient bytes per bucket
    limits: list[int]  # the size limit each was filled against


class SentAdvice(msgspec.Struct, frozen=True):
    """What the front end receives: the advice, or `error` (why the advisor cannot advise on
    this run, in its own words) and nothing else."""

    version: int = WIRE_VERSION
    error: str = ""
    pending: bool = False  # the advisor is still at work on this run (a TraceView's thread)
    events: int = 0  # the run's events the advice read (a live run's grow)
    world_size: int = 0
    steps: int = 0  # steady steps replayed
    first_step: int = -1
    last_step: int = -1
    measured_step_ms: float = 0.0
    contention: float = 0.0
    reason: str = ""  # the recommendation, in words
    recommended: str = ""  # its label
    rows: list[SentRow] = msgspec.field(default_factory=list)
    map: SentMap | None = None
    notes: list[str] = msgspec.field(default_factory=list)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def _finite(x: float) -> float:
    x = float(x)  # (the replay's medians may be numpy floats, which msgpack does not encode)
    return x if math.isfinite(x) else 0.0  # (msgpack carries inf/nan; the chart cannot)


def sent_advice(advice: Advice, events: int = 0) -> SentAdvice:
    """The advice as sent: the rows (current first, at most MAX_ROWS), the recommendation and
    the recommended map; `events`: how many events of the run it read."""
    notes = [*advice.notes, *advice.cost_model.notes]
    rows = list(advice.rows)
    if len(rows) > MAX_ROWS:  # (user candidates only): keep the current and recommended
        keep = rows[:MAX_ROWS - 1]
        if advice.recommended not in keep:
            keep.append(advice.recommended)
        notes.append(f"{len(rows) - len(keep)} of the {len(rows)} candidates are not drawn "
                     f"(a view draws {MAX_ROWS} at most)")
        rows = keep
    rec = advice.recommended
    buckets = [list(b.param_indices) for b in rec.buckets]
    bucket_map: SentMap | None = None
    if sum(len(b) for b in buckets) <= MAX_MAP_ENTRIES:
        bucket_map = SentMap(_cut(rec.candidate.setting(), MAX_TEXT),
                             rec.plan.rebuilt is not None, buckets,
                             [b.nbytes for b in rec.buckets], [b.limit for b in rec.buckets])
    else:
        notes.append("the recommended bucket map is too large to draw here")
    return SentAdvice(
        events=events, world_size=advice.world_size, steps=len(advice.steps),
        first_step=advice.steps[0] if advice.steps else -1,
        last_step=advice.steps[-1] if advice.steps else -1,
        measured_step_ms=_finite(advice.measured_step_s * 1e3),
        contention=_finite(advice.contention), reason=_cut(advice.reason, MAX_TEXT),
        recommended=_cut(rec.label, MAX_NAME),
        rows=[SentRow(_cut(r.label, MAX_NAME), "current" if r.current else r.candidate.family,
                      _cut(r.candidate.setting(), MAX_TEXT), _finite(r.candidate.cap_mb),
                      _finite(r.prediction.step_s * 1e3), _finite(r.prediction.exposed_s * 1e3),
                      len(r.buckets), r.current, r is rec) for r in rows],
        map=bucket_map, notes=[_cut(n, MAX_TEXT) for n in notes[:MAX_NOTES]])


PENDING = msgspec.msgpack.encode(SentAdvice(pending=True))  # what a view holds meanwhile


def advice_bytes(source: object, most: int | None = None, asker: str = "a view") -> bytes:
    """`advise(source)`'s answer as the front end reads it (msgpack `SentAdvice`); where the
    advisor cannot advise (too few steps, no per-parameter gradient times, a run over
    `most` events, ...), its message as `error`. Any other failure of the advisor is said the
    same way, so a view of the run never fails because its advice did.

    Args:
        source: any run (traces/source.py), e.g. a RunSource opened once for every verb.
        most: the most events advised on (None: MAX_EVENTS; the report: REPORT_MAX_EVENTS).
        asker: who asks, in the message of a run over `most` ("a view", "a report").
    """
    most = MAX_EVENTS if most is None else most
    from ddpviz.advisor.advisor import advise
    from ddpviz.advisor.source import AdviceError, as_trace

    try:
        trace = as_trace(source)
        events = len(trace)
        if events > most:
            return msgspec.msgpack.encode(SentAdvice(events=events, error=(
                f"ddpviz: this run has {events:,} events, over the {most:,} {asker} asks "
                "the bucket advisor about (it replays every recorded step for each setting: "
                "about 30 s at 200,000 events here).\nRun `ddpviz advise PATH` in a terminal, "
                "or print(ddpviz.advise(run)) in a notebook, for its advice.")))
        return msgspec.msgpack.encode(sent_advice(advise(trace), events))
    except AdviceError as exc:
        sent = SentAdvice(error=_cut(str(exc), MAX_TEXT))
    except Exception as exc:  # (a view draws the run whatever the advisor makes of it)
        sent = SentAdvice(error=_cut(f"ddpviz: the bucket advisor failed on this run "
                                     f"({type(exc).__name__}: {exc}).", MAX_TEXT))
    return msgspec.msgpack.encode(sent)
