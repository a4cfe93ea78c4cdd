"""The verdict on a recorded run, as `ddpviz diagnose` prints it and the HTML report opens with
it: what the trace holds (when it was recorded, for how long, which ranks, how many steps) and
its findings, severity first, as text for people or as JSON (schema in `diagnosis_json`).

Reads traces and findings only: no torch, no processes.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from ddpviz import events as ev
from ddpviz.findings import Finding, format_ranks, sort_findings, value_lines
from ddpviz.traces.fileformat import End, printable
from ddpviz.traces.trace import Trace
from ddpviz.units import human_duration

JSON_SCHEMA = 1  # bump when a key of diagnosis_json changes meaning or goes away
SEVERITIES = ("error", "warning", "info")


class TraceFacts(NamedTuple):
    """What a trace holds, for people."""

    ranks: tuple[int, ...]
    events: int
    steps: int  # DDP iterations seen (the highest step + 1) on the rank that ran most
    world_size: int  # from verification; 0 when the trace does not say
    started_wall_ns: int | None  # wall clock of the first event (or of the session's start)
    duration_ns: int  # first to last event, on the aligned clock
    # of which before the first event of step 0 or later (the model comparison, DDP's
    # construction and the script's own setup, where the trace holds them); 0 when none
    setup_ns: int
    truncated: bool  # a file ended in a torn frame: events after its last flush are lost
    source: str  # meta's "source" ("session", "ddpviz postmortem", ...), "" when unknown

    def started(self) -> str:
        """'2026-11-25 11:51:09 UTC', or '' when the trace carries no wall clock."""
        if self.started_wall_ns is None:
            return ""
        when = datetime.datetime.fromtimestamp(self.started_wall_ns / 1e9, tz=datetime.UTC)
        return when.strftime("%Y-%m-%d %H:%M:%S UTC")

    def sentence(self) -> str:
        """One line: '236 events from ranks 0,1 (world size 2), 3 steps, recorded
        2026-11-25 11:51:09 UTC over 1.20 s.'"""
        ranks = format_ranks(self.ranks) if self.ranks else "no rank"
        size = f" (world size {self.world_size})" if self.world_size else ""
        steps = f", {self.steps} step{'s' if self.steps != 1 else ''}" if self.steps else ""
        when = f", recorded {self.started()}" if self.started_wall_ns is not None else ""
        span = f" over {human_duration(self.duration_ns)}" if self.events else ""
        if self.events and 0 < self.setup_ns < self.duration_ns:
            span += (f" ({human_duration(self.setup_ns)} before the first step: construction "
                     f"and setup; {human_duration(self.duration_ns - self.setup_ns)} from the "
                     "first step on)")
        return f"{self.events} events from {ranks}{size}{steps}{when}{span}."


def trace_facts(trace: Trace) -> TraceFacts:
    """The facts `TraceFacts` names, from the trace's columns and meta."""
    tables = trace.columns()
    starts, ends, stepped, steps = [], [], [], 0
    for rank, t in tables.items():
        if not len(t):
            continue
        offset = trace.clock.get(rank, (0, 0))[0]
        starts.append(int(t.t.min()) + offset)
        ends.append(int(t.t.max()) + offset)
        steps = max(steps, int(t.step.max()) + 1)
        in_steps = t.t[t.step >= 0]
        if len(in_steps):
            stepped.append(int(in_steps.min()) + offset)
    sizes = [e.world_size for e in trace.of_type(ev.VerificationStarted)]
    sizes += [e.world_size for e in trace.of_type(ev.VerificationPassed)]  # ddpviz record
    sizes += [e.world_size for e in trace.of_type(ev.VerificationFailed)]
    meta = trace.meta
    wall: int | None = None
    if isinstance(meta.get("started_wall_ns"), int):
        wall = meta["started_wall_ns"]
    elif starts and isinstance(meta.get("wall_ns"), int) and isinstance(meta.get("mono_ns"), int):
        wall = meta["wall_ns"] - meta["mono_ns"] + min(starts)  # events carry monotonic ns
    source = meta.get("source")
    return TraceFacts(
        ranks=tuple(r for r, t in tables.items() if len(t)), events=len(trace), steps=steps,
        world_size=max(sizes, default=0), started_wall_ns=wall,
        duration_ns=(max(ends) - min(starts)) if starts else 0,
        setup_ns=(min(stepped) - min(starts)) if stepped else 0, truncated=trace.truncated,
        source=source if isinstance(source, str) else "")


def where(f: Finding) -> str:
    """'step 3, bucket 1, rank 1': where a finding is, '' when it names no place."""
    parts = [f"step {f.step}" if f.step >= 0 else "", f"bucket {f.bucket}" if f.bucket >= 0
             else "", format_ranks(f.ranks) if f.ranks else ""]
    return ", ".join(p for p in parts if p)


def ended_sentence(ranks: Sequence[int], ended: Mapping[int, End]) -> str:
    """'ranks 0,1 ended cleanly; rank 2 has no end record (still running, or killed).': what
    the ranks' files say of their end (See [Note: a rank's end in its file])."""
    clean = tuple(r for r in ranks if r in ended and not ended[r].error)
    parts = [f"{format_ranks(clean)} ended cleanly"] if clean else []
    for r in ranks:
        if r in ended and ended[r].error:
            parts.append(f"{format_ranks((r,))} exited on an uncaught {ended[r].error}")
    running = tuple(r for r in ranks if r not in ended)
    if running:
        parts.append(f"{format_ranks(running)} {'has' if len(running) == 1 else 'have'} no end "
                     "record (still running, or killed)")
    return "; ".join(parts) + "."


def verdict(findings: Sequence[Finding]) -> str:
    """The run in one word: "errors" when a finding is an error, else "warnings" when one is a
    warning, else "healthy" (notes, severity "info", say what was not checked or needs no
    fix: they leave a run healthy)."""
    severities = {f.severity for f in findings}
    return "errors" if "error" in severities else "warnings" if "warning" in severities \
        else "healthy"


def verdict_line(findings: Sequence[Finding]) -> str:
    """The verdict first, then the counts: 'healthy: no problems found.', 'healthy: no
    problems found (1 note, last: what was not checked).', 'errors: 1 error, 2 warnings, 1
    note.'"""
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    notes = counts["info"]
    noted = f"{notes} note{'s' if notes > 1 else ''}"
    word = verdict(findings)
    if word == "healthy":
        return ("healthy: no problems found"
                + (f" ({noted}, last: what was not checked)" if notes else "") + ".")
    told = [f"{counts[s]} {s}{'s' if counts[s] > 1 else ''}" for s in ("error", "warning")
            if counts[s]]
    return f"{word}: {', '.join(told + ([noted] if notes else []))}."


_GROUPS = {"error": "error", "warning": "warning", "info": "note"}  # headings, severity first


def finding_lines(f: Finding) -> list[str]:
    """One finding for a terminal: title and where, values per rank, detail, fix."""
    at = where(f)
    colon = ":" if f.values or f.detail else ""
    lines = [f"- {f.title}" + (f" ({at})" if at else "") + colon]
    lines += ["  " + line for line in value_lines(f.values)]
    lines += [f"    {d}" for d in f.detail]
    if f.fix:
        lines.append(f"  fix: {f.fix}")
    return lines


def diagnosis_text(trace: Trace, findings: Sequence[Finding],
                   files: Sequence[Path] = (), ended: Mapping[int, End] | None = None,
                   notes: Sequence[str] = ()) -> str:
    """`ddpviz diagnose`'s output: the verdict (healthy, warnings or errors, with counts), the
    trace in one line, which ranks' files say they ended (`ended`, when any does), `notes`
    (messages on the files: end records not counted), then the findings grouped by severity
    (errors first, notes last: what was not checked), each with where it is, its values,
    detail and fix. Every line is one line of the output: what a file put in it (a
    name, an error) cannot start another or reorder it (See [Note: text from a file, on a
    terminal], fileformat.py)."""
    facts = trace_facts(trace)
    name = (", ".join(str(f) for f in files) if len(files) <= 2
             else f"{len(files)} files in {files[0].parent}") if files else "trace"
    lines = [f"ddpviz: {verdict_line(findings)}", f"ddpviz: {name}: {facts.sentence()}"]
    if ended:
        lines.append(f"ddpviz: {ended_sentence(facts.ranks, ended)}")
    lines += [line for note in notes for line in note.split("\n")]
    if facts.truncated:
        lines.append("ddpviz: a file ended in a torn frame: events after the writer's last "
                     "flush are missing, so the diagnosis may be incomplete.")
    ordered = sort_findings(findings)
    for severity in SEVERITIES:
        group = [f for f in ordered if f.severity == severity]
        if not group:
            continue
        heading = _GROUPS[severity]
        lines += ["", f"{heading}s ({len(group)}):" if len(group) > 1 else f"{heading}:"]
        for f in group:
            lines += finding_lines(f)
    return "\n".join(printable(line) for line in lines)


def finding_record(f: Finding) -> dict[str, Any]:
    """A finding as plain data: every field of `Finding` (values as [value, ranks] pairs) and
    `text`, its house-style message (the same shape as `ddpviz postmortem --json`'s)."""
    out: dict[str, Any] = msgspec.to_builtins(f)
    out["text"] = f.text()
    return out


def diagnosis_json(trace: Trace, findings: Sequence[Finding],
                   files: Sequence[Path] = (), ended: Mapping[int, End] | None = None) -> str:
    """`ddpviz diagnose --json`: one object,
    {"schema": 1, "verdict": "healthy" | "warnings" | "errors",
     "trace": {"files", "ranks", "events", "steps", "world_size", "started" (ISO 8601 UTC or
               null), "started_wall_ns", "duration_s", "setup_s" (of duration_s, the
               time before the first step: construction and setup), "truncated", "source",
               "ended": {"RANK": {"events", "dropped", "error"}} (the ranks whose file ends
               with its end record: see tracefile.py)},
     "counts": {"error": n, "warning": n, "info": n},
     "findings": [{"kind", "severity", "title", "ranks", "param", "name", "field", "bucket",
                   "step", "values", "detail", "fix", "world_size", "tensors", "text"}, ...]}
    with findings errors first; -1 in param/bucket/step means "not about one"."""
    facts = trace_facts(trace)
    ordered = sort_findings(findings)
    counts = {s: sum(f.severity == s for f in ordered) for s in SEVERITIES}
    started = (datetime.datetime.fromtimestamp(facts.started_wall_ns / 1e9, tz=datetime.UTC)
               .isoformat() if facts.started_wall_ns is not None else None)
    doc = {"schema": JSON_SCHEMA, "verdict": verdict(ordered),
           "trace": {"files": [str(f) for f in files], "ranks": list(facts.ranks),
                     "events": facts.events, "steps": facts.steps,
                     "world_size": facts.world_size, "started": started,
                     "started_wall_ns": facts.started_wall_ns,
                     "duration_s": facts.duration_ns / 1e9,
                     "setup_s": facts.setup_ns / 1e9, "truncated": facts.truncated,
                     "source": facts.source,
                     "ended": {str(r): {"events": e.events, "dropped": e.dropped,
                                        "error": e.error}
                               for r, e in sorted((ended or {}).items())}},
           "counts": counts, "findings": [finding_record(f) for f in ordered]}
    return json.dumps(doc, indent=1)
