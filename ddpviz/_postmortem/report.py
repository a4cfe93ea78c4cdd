"""The post-mortem: Flight Recorder dumps aligned across ranks, mapped to DDP's phases when a
model is given, turned into findings in diagnose()'s vocabulary; printable, as records or JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from torch import nn

from ddpviz._postmortem.align import GroupAlignment, align
from ddpviz._postmortem.callsite import site_text
from ddpviz._postmortem.ddp_map import DdpSchedule, Labelled, match_rank
from ddpviz._postmortem.dumps import FrDump, FrEntry, load_dumps
from ddpviz._postmortem.group_findings import group_findings
from ddpviz._postmortem.naming import Namer, group_text
from ddpviz.findings import Finding, Findings, format_findings, format_ranks
from ddpviz.plan import BucketPlan, PlanSettings, bucket_plan

if TYPE_CHECKING:
    from ddpviz.traces.trace import Trace

MAX_JOB_LINES = 20  # call sites printed; job_collectives() has them all


@dataclass
class PostMortem:
    """What the dumps say: `.findings`, per-rank positions (`to_records()`), `to_json()`;
    prints as a house-style report."""

    dumps: list[FrDump]
    groups: list[GroupAlignment]
    findings: Findings
    labels: dict[int, list[Labelled]] = field(default_factory=dict)  # rank -> DDP labels
    plan: BucketPlan | None = None
    world_size: int = 0
    ddp_pg: str = ""  # DDP's process group ("" when there is none)

    @cached_property
    def namer(self) -> Namer:
        """Names the dumps' entries (naming.py)."""
        return Namer(self.labels, self.ddp_pg, self.plan is not None)

    def label(self, rank: int, seq: int) -> str:
        """What a recorded collective on DDP's process group was, in DDP's terms.

        Args:
            rank: the rank whose dump holds the collective.
            seq: its sequence id in its process group (the "#" of the report).

        Returns:
            "bucket 5 of step 812 (layers.10.weight … layers.11.bias, 23.1 MiB)", "the
            buffer broadcast of step 3 (broadcast of 1,024 float32)"; for a collective that
            is not DDP's, "the job's OP [SIZES] DTYPE at FILE:LINE in FUNCTION" (the call site
            where the dump has stacks) or "OP [SIZES] DTYPE, not in DDP's plan"; "" when the
            post-mortem has no model (no labels) or no such collective.
        """
        e = self.namer.lab(self.ddp_pg, rank, seq)
        return self.namer.what(self.ddp_pg, rank, e.entry) if e is not None else ""

    def to_records(self) -> list[dict[str, Any]]:
        """Every collective of every dump, as plain data.

        Returns:
            One JSON-ready dict per (process group, rank, entry), by group then rank then
            sequence id: "rank", "pg", "seq", "record_id", "op", "numel", "dtype",
            "input_sizes", "completed", "state" as the recorder logged them; who launched it,
            "origin" ("ddp", "job", "unplanned" or "" when the dumps cannot tell: see
            `naming.Who`) and "call_site" ("FILE:LINE in FUNCTION", the user's frame nearest
            it; "" without a stack); and DDP's view: "ddp_phase" ("bucket",
            "buffer_broadcast", ...; "not DDP's"; "" without a model), "step" and "bucket" (-1
            when none), "params" (a bucket's parameter names) and "label" (the collective in
            words, as in `label`, also without a model).
        """
        namer = self.namer
        rows = []
        for g in self.groups:
            for r, entries in g.entries.items():
                for seq, e in sorted(entries.items()):
                    lab = namer.lab(g.pg, r, seq)
                    ddp = lab.ddp if lab else None
                    rows.append({
                        "rank": r, "pg": g.pg, "seq": seq, "record_id": e.record_id,
                        "op": e.op, "numel": e.numel, "dtype": e.dtype,
                        "input_sizes": [list(s) for s in e.input_sizes],
                        "completed": e.completed, "state": e.state,
                        "origin": namer.who(g.pg, r, e),
                        "call_site": site_text(e.site) if e.site else "",
                        "ddp_phase": ddp.phase if ddp else ("" if lab is None else "not DDP's"),
                        "step": ddp.step if ddp else -1, "bucket": ddp.bucket if ddp else -1,
                        "params": list(ddp.names) if ddp and ddp.phase == "bucket" else [],
                        "label": namer.what(g.pg, r, e)})
        return rows

    def job_collectives(self) -> list[dict[str, Any]]:
        """The job's own collectives (not DDP's), one row per process group, call site and op.

        Returns:
            One JSON-ready dict per (process group, call site, op), by group then call site,
            with "pg" and "group" (its name, description and ranks in words), "op",
            "call_site" ("FILE:LINE in FUNCTION"; "" for those without a stack), "file",
            "line", "function" (None without a stack), "sizes" (the distinct "[SIZES] DTYPE"
            seen, at most 4), "ranks" (those that launched it), "count" (entries, all ranks
            together), "first_seq" and "last_seq". Without stacks and without a model the
            dumps cannot tell the job's from DDP's: then it lists none.
        """
        namer = self.namer
        rows: dict[tuple[str, str, str], dict[str, Any]] = {}
        for g in self.groups:
            for r, entries in sorted(g.entries.items()):
                for seq, e in sorted(entries.items()):
                    if namer.who(g.pg, r, e) not in ("job", "unplanned"):
                        continue
                    site = site_text(e.site) if e.site else ""
                    row = rows.setdefault((g.pg, site, e.op), {
                        "pg": g.pg, "group": group_text(g), "op": e.op, "call_site": site,
                        "file": e.site.file if e.site else None,
                        "line": e.site.line if e.site else None,
                        "function": e.site.func if e.site else None,
                        "sizes": [], "ranks": [], "count": 0, "first_seq": seq,
                        "last_seq": seq})
                    size = e.describe().removeprefix(e.op).strip()
                    if size not in row["sizes"] and len(row["sizes"]) < 4:
                        row["sizes"].append(size)
                    if r not in row["ranks"]:
                        row["ranks"].append(r)
                    row["count"] += 1
                    row["first_seq"] = min(row["first_seq"], seq)
                    row["last_seq"] = max(row["last_seq"], seq)
        return [rows[k] for k in sorted(rows, key=lambda k: (k[0], k[1] == "", k[1], k[2]))]

    def to_json(self) -> str:
        """The whole post-mortem as one JSON document (for a ticket or another tool).

        Returns:
            JSON text of an object with "world_size", "dumps" (rank, source, version and
            entry count of each), "findings" (each finding's fields and its "text"), "ranks"
            (`rank_rows()`), "job_collectives" (`job_collectives()`) and "collectives"
            (`to_records()`).
        """
        return json.dumps({
            "world_size": self.world_size,
            "dumps": [{"rank": d.rank, "source": d.source, "version": d.version,
                       "entries": len(d.entries)} for d in self.dumps],
            "findings": [_finding_dict(f) for f in self.findings],
            "ranks": self.rank_rows(),
            "job_collectives": self.job_collectives(),
            "collectives": self.to_records()}, indent=1)

    def rank_rows(self) -> list[dict[str, Any]]:
        """Where each rank stood in each process group when it dumped.

        Returns:
            One dict per (process group, rank), by group then rank, with "pg", "rank", and
            "last_completed", "first_pending", "last_launched", each "#SEQ LABEL" (see
            `label`) or "-" when there is none.
        """
        rows = []
        for g in self.groups:
            for r, st in sorted(g.states.items()):
                rows.append({
                    "pg": g.pg, "rank": r,
                    "last_completed": self._pos(g.pg, r, st.last_completed),
                    "first_pending": self._pos(g.pg, r, st.first_pending),
                    "last_launched": self._pos(g.pg, r, st.last_launched)})
        return rows

    def _pos(self, pg: str, rank: int, e: FrEntry | None) -> str:
        if e is None:
            return "-"
        return f"#{e.seq} {self.namer.what(pg, rank, e)}"

    def __str__(self) -> str:
        lines = [format_findings(self.findings, self.world_size or None), "",
                 "Where each rank stood (collective # = sequence id in its process group):"]
        for row in self.rank_rows():
            lines.append(f"  pg {row['pg']} rank {row['rank']}: last completed "
                         f"{row['last_completed']}; first pending {row['first_pending']}")
        jobs = self.job_collectives()
        if jobs:
            lines += ["", "The job's own collectives (not DDP's), by call site:"]
            lines += [f"  {job_line(row)}" for row in jobs[:MAX_JOB_LINES]]
            if len(jobs) > MAX_JOB_LINES:
                lines.append(f"  ... and {len(jobs) - MAX_JOB_LINES} more (job_collectives())")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def to_trace(self) -> Trace:
        """A ddpviz Trace of what the dumps say (bucket maps, DDP's all-reduces, findings):
        `.dashboard()` it, or `.save("x.ddpviz")` for the JupyterLab viewer.

        Returns:
            A new `Trace`, one rank per dump, on the recorder's clock. It holds the planned
            bucket maps (with a model), DDP's all-reduces, buffer broadcasts and rebuild as
            events, and one FindingReported per finding (on the lowest rank it names).
        """
        from ddpviz._postmortem.trace_export import to_trace

        return to_trace(self)

    def show(self) -> Any:
        """A PostMortemView widget: findings, per-rank positions, each rank's last collectives
        (needs ipywidgets).

        Returns:
            The widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.postmortem_view import PostMortemView

        return PostMortemView(self)


def _finding_dict(f: Finding) -> dict[str, Any]:
    import msgspec

    out: dict[str, Any] = msgspec.to_builtins(f)
    out["text"] = f.text()
    return out


def job_line(row: dict[str, Any]) -> str:
    """One row of `PostMortem.job_collectives()` in words: "all_gather at train.py:61 in
    log_metrics: [3] float32, ranks 0,1, 12 times (#5-#49) on process group 0 (...)"."""
    where = f" at {row['call_site']}" if row["call_site"] else " (no stack in the dumps)"
    sizes = f": {', '.join(row['sizes'])}" if any(row["sizes"]) else ""
    seqs = f"#{row['first_seq']}" + (f"-#{row['last_seq']}" if row["last_seq"] > row["first_seq"]
                                     else "")
    times = "once" if row["count"] == 1 else f"{row['count']} times"
    return (f"{row['op']}{where}{sizes}, {format_ranks(row['ranks'])}, {times} ({seqs}) on "
            f"{row['group']}")


def postmortem(dumps: str | os.PathLike[str] | Iterable[Any] | Mapping[int, Any],
               model: nn.Module | None = None, *,
               settings: PlanSettings | Mapping[str, Any] | None = None,
               example_inputs: Any = None, broadcast_buffers: bool = True) -> PostMortem:
    """Read torch Flight Recorder dumps of a hung or crashed job and say, in DDP's terms, who
    waited where.

    Args:
        dumps: a folder of per-rank dumps (files PREFIX<rank>, JSON or pickle, as
            `TORCH_FR_DUMP_TEMP_FILE`, `_dump_fr_trace` or `_dump_fr_trace_json` write them),
            a list of paths, a list of loaded dicts (rank = position) or {rank: dict or path}.
        model: the nn.Module the job wrapped in DDP (any device, meta works). With it, every
            collective on DDP's process group is named (bucket, step, parameters).
        settings: DDP's bucket settings (PlanSettings or a dict of its fields:
            bucket_cap_mb, bucket_cap_mb_list, find_unused_parameters, static_graph).
        example_inputs: inputs for one local backward that measures the gradient-ready order
            of the rebuilt map (else predicted from reverse registration order).
        broadcast_buffers: DDP's argument of that name.

    Returns:
        A PostMortem; `.findings` holds the findings.
    """
    loaded = load_dumps(dumps)
    groups = align(loaded)
    world = max([len(g.members) for g in groups] + [len(loaded)])
    labels: dict[int, list[Labelled]] = {}
    plan = None
    ddp_group = _ddp_group(groups)
    if model is not None and ddp_group is not None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"ddpviz: postmortem(model=...) takes the nn.Module wrapped in DDP, "
                            f"found {type(model).__name__}.")
        s = settings if isinstance(settings, PlanSettings) else _settings(settings or {})
        plan = bucket_plan(model, bucket_cap_mb=s.bucket_cap_mb,
                           bucket_cap_mb_list=s.bucket_cap_mb_list,
                           find_unused_parameters=s.find_unused_parameters,
                           static_graph=s.static_graph, example_inputs=example_inputs,
                           set_last_bucket_cap=s.set_last_bucket_cap)
        schedule = DdpSchedule(model, plan, broadcast_buffers=broadcast_buffers)
        for r, entries in ddp_group.entries.items():
            labels[r] = match_rank(schedule, [entries[s] for s in sorted(entries)])
    findings = Findings()
    ddp_pg = ddp_group.pg if ddp_group is not None else ""
    namer = Namer(labels, ddp_pg, plan is not None)
    for g in groups:
        findings += group_findings(g, namer, plan if g is ddp_group else None, world)
    return PostMortem(loaded, groups, findings, labels, plan, world, ddp_pg)


def _settings(given: Mapping[str, Any]) -> PlanSettings:
    known = set(PlanSettings.__dataclass_fields__)
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"ddpviz: postmortem(settings=...) got unknown key(s) "
                         f"{', '.join(map(repr, unknown))}; expected some of "
                         f"{', '.join(sorted(known))} (DDP's argument names).")
    fields: dict[str, Any] = {k: tuple(v) if k == "bucket_cap_mb_list" and v else v
                              for k, v in given.items()}
    return PlanSettings(**fields)


def _ddp_group(groups: Sequence[GroupAlignment]) -> GroupAlignment | None:
    """DDP's process group: the default group if any, else the busiest."""
    cands = [g for g in groups if not g.pg.endswith(":p2p")]
    if not cands:
        return None
    default = [g for g in cands if g.desc == "default_pg" or g.pg == "0"]
    return default[0] if default else max(cands, key=lambda g: sum(map(len, g.entries.values())))
