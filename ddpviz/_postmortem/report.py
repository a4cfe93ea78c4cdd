"""The post-mortem: Flight Recorder dumps aligned across ranks, mapped to DDP's phases when a
model is given, turned into findings in diagnose()'s vocabulary; printable, as records or JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from ddpviz._postmortem.align import GroupAlignment, align
from ddpviz._postmortem.ddp_map import DdpSchedule, Labelled, match_rank, name_span
from ddpviz._postmortem.dumps import FrDump, FrEntry, load_dumps
from ddpviz.findings import (
    Finding,
    Findings,
    fix_for,
    format_findings,
    format_ranks,
    group_ranks,
)
from ddpviz.plan import BucketPlan, PlanSettings, bucket_plan

if TYPE_CHECKING:
    from ddpviz.traces.trace import Trace



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

    def label(self, rank: int, seq: int) -> str:
        """What a recorded collective was in DDP's terms.

        Args:
            rank: the rank whose dump holds the collective.
            seq: its sequence id in its process group (the "#" of the report).

        Returns:
            "bucket 5 of step 812 (layers.10.weight … layers.11.bias, 23.1 MiB)", "the
            buffer broadcast of step 3 (broadcast of 1,024 float32)", or "OP [SIZES] DTYPE,
            not DDP's" for a collective of another process group or of the user's own; ""
            when the post-mortem has no model (no labels) or no such collective.
        """
        for lab in self.labels.get(rank, ()):
            if lab.entry.seq == seq:
                return _describe(lab)
        return ""

    def to_records(self) -> list[dict[str, Any]]:
        """Every collective of every dump, as plain data.

        Returns:
            One JSON-ready dict per (process group, rank, entry), by group then rank then
            sequence id: "rank", "pg", "seq", "record_id", "op", "numel", "dtype",
            "input_sizes", "completed", "state" as the recorder logged them, and DDP's view:
            "ddp_phase" ("bucket", "buffer_broadcast", ...; "not DDP's"; "" without a model),
            "step" and "bucket" (-1 when none), "params" (a bucket's parameter names) and
            "label" (see `label`).
        """
        by_rank = {r: {lab.entry.record_id: lab for lab in labs}
                   for r, labs in self.labels.items()}
        rows = []
        for g in self.groups:
            for r, entries in g.entries.items():
                for seq, e in sorted(entries.items()):
                    lab = by_rank.get(r, {}).get(e.record_id)
                    ddp = lab.ddp if lab else None
                    rows.append({
                        "rank": r, "pg": g.pg, "seq": seq, "record_id": e.record_id,
                        "op": e.op, "numel": e.numel, "dtype": e.dtype,
                        "input_sizes": [list(s) for s in e.input_sizes],
                        "completed": e.completed, "state": e.state,
                        "ddp_phase": ddp.phase if ddp else ("" if lab is None else "not DDP's"),
                        "step": ddp.step if ddp else -1, "bucket": ddp.bucket if ddp else -1,
                        "params": list(ddp.names) if ddp and ddp.phase == "bucket" else [],
                        "label": _describe(lab) if lab else e.describe()})
        return rows

    def to_json(self) -> str:
        """The whole post-mortem as one JSON document (for a ticket or another tool).

        Returns:
            JSON text of an object with "world_size", "dumps" (rank, source, version and
            entry count of each), "findings" (each finding's fields and its "text"), "ranks"
            (`rank_rows()`) and "collectives" (`to_records()`).
        """
        return json.dumps({
            "world_size": self.world_size,
            "dumps": [{"rank": d.rank, "source": d.source, "version": d.version,
                       "entries": len(d.entries)} for d in self.dumps],
            "findings": [_finding_dict(f) for f in self.findings],
            "ranks": self.rank_rows(),
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
                    "last_completed": self._pos(r, st.last_completed),
                    "first_pending": self._pos(r, st.first_pending),
                    "last_launched": self._pos(r, st.last_launched)})
        return rows

    def _pos(self, rank: int, e: FrEntry | None) -> str:
        if e is None:
            return "-"
        return f"#{e.seq} {self.label(rank, e.seq) or e.describe()}"

    def __str__(self) -> str:
        lines = [format_findings(self.findings, self.world_size or None), "",
                 "Where each rank stood (collective # = sequence id in its process group):"]
        for row in self.rank_rows():
            lines.append(f"  pg {row['pg']} rank {row['rank']}: last completed "
                         f"{row['last_completed']}; first pending {row['first_pending']}")
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


def _describe(lab: Labelled | None) -> str:
    if lab is None:
        return ""
    if lab.ddp is not None:
        return lab.ddp.label()
    return f"{lab.entry.describe()}, not DDP's"


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
    for g in groups:
        findings += _group_findings(g, labels if g is ddp_group else {}, world)
    return PostMortem(loaded, groups, findings, labels, plan, world)


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


def _group_findings(g: GroupAlignment, labels: dict[int, list[Labelled]], world: int
                    ) -> list[Finding]:
    out: list[Finding] = []
    by_seq = {r: {lab.entry.seq: lab for lab in labs} for r, labs in labels.items()}
    pg = "" if g.pg in ("0", "") else f" of process group {g.pg!r}"

    def name(rank: int, seq: int) -> str:
        lab = by_seq.get(rank, {}).get(seq)
        if lab is not None:
            return _describe(lab)
        e = g.entries.get(rank, {}).get(seq)
        return f"collective #{seq}{pg} ({e.describe()})" if e else f"collective #{seq}{pg}"

    if g.missing_dumps:
        out.append(Finding(
            kind="missing_rank", severity="warning", world_size=world,
            ranks=g.missing_dumps,
            title=f"no Flight Recorder dump from {format_ranks(g.missing_dumps)}{pg}",
            fix=fix_for("missing_rank", "dumps")))
    st = g.stall
    if st is not None:
        waiter = min(st.waiting)
        lab = by_seq.get(waiter, {}).get(st.seq)
        ddp = lab.ddp if lab else None
        what = name(waiter, st.seq)
        values: dict[int, str] = {}
        for r in st.waiting:
            values[r] = f"waiting in it (collective #{st.seq})"
        for r in st.never_launched:
            last = g.states[r].last_completed
            if last is None:
                values[r] = "last completed: nothing in its dump"
            else:
                done = name(r, last.seq)
                values[r] = "last completed: " + done + (
                    "" if done.startswith("collective #") else f" (#{last.seq})")
        for r in st.ahead:
            values[r] = "completed it"
        detail = []
        if ddp is not None and ddp.phase == "bucket":
            detail.append(f"bucket {ddp.bucket} ({ddp.which} map) holds: {', '.join(ddp.names)}")
        frames = st.waiting[waiter].frames
        if frames:
            detail.append(f"rank {waiter} launched it from: {frames[-1]}")
        if st.also:
            later = [name(min((r for r in g.entries if s in g.entries[r]), default=waiter), s)
                     for s in st.also[:3]]
            more = f" and {len(st.also) - 3} more" if len(st.also) > 3 else ""
            detail.append(f"{format_ranks(st.never_launched)} also never launched: "
                          f"{'; '.join(later)}{more}")
        if st.never_launched:
            title = f"{format_ranks(st.never_launched)} never launched {what}; " \
                    f"{format_ranks(sorted(st.waiting))} {_wait(st.waiting)} in it"
            ranks = st.never_launched
        else:
            title = f"{format_ranks(sorted(st.waiting))} {_wait(st.waiting)} in {what}"
            ranks = tuple(sorted(st.waiting))
        out.append(Finding(
            kind="rank_hang", severity="error", title=title, ranks=ranks, world_size=world,
            step=ddp.step if ddp else -1, bucket=ddp.bucket if ddp else -1,
            param=ddp.param_indices[0] if ddp and len(ddp.param_indices) == 1 else -1,
            name=name_span(ddp.names) if ddp and ddp.names else "",
            field=ddp.phase if ddp else "collective",
            values=group_ranks(values), detail=tuple(detail), fix=fix_for("rank_hang", "dumps")))
    for m in g.mismatches[:8]:
        values = {r: f"{e.describe()}" + (f" = {_describe(by_seq[r][m.seq])}"
                                          if m.seq in by_seq.get(r, {}) else "")
                  for r, e in m.by_rank.items()}
        grouped = group_ranks(values)
        odd = tuple(sorted(r for _, rs in grouped[1:] for r in rs))
        kinds = {(e.op, e.dtypes) for e in m.by_rank.values()}
        fld = "op" if len({k[0] for k in kinds}) > 1 else \
            "dtype" if len({k[1] for k in kinds}) > 1 else "size"
        out.append(Finding(
            kind="collective_mismatch", severity="error", world_size=world, ranks=odd,
            field=fld, title=f"collective #{m.seq}{pg} has a different {fld} across ranks",
            values=grouped, fix=fix_for("collective_mismatch", "sequence")))
    out += _plan_findings(g, labels, world)
    return out


def _plan_findings(g: GroupAlignment, labels: dict[int, list[Labelled]], world: int
                   ) -> list[Finding]:
    """Entries a rank launched that DDP's schedule does not have at that point: a different
    bucket map (same all-reduced total in other pieces) or an extra collective."""
    out: list[Finding] = []
    for r, labs in sorted(labels.items()):
        i = 0
        while i < len(labs):
            if labs[i].ddp is not None:
                i += 1
                continue
            run = [labs[i]]
            while i + len(run) < len(labs) and labs[i + len(run)].ddp is None:
                run.append(labs[i + len(run)])
            i += len(run)
            want = run[0].expected
            prev = next((lab.ddp for lab in reversed(labs[:i - len(run)]) if lab.ddp), None)
            after = f" after {prev.label()}" if prev else ""
            seqs = ", ".join(f"#{lab.entry.seq}" for lab in run[:8])
            lead = []  # the run's leading all-reduces of the bucket's dtype
            for lab in run:
                if lab.entry.op != "all_reduce" or want is None or \
                        set(lab.entry.dtypes) != {want.dtype}:
                    break
                lead.append(lab)
            if want is not None and want.phase == "bucket" and len(lead) > 1:
                got = [lab.entry.numel for lab in lead]
                out.append(Finding(
                    kind="plan_mismatch", severity="error", ranks=(r,), world_size=world,
                    step=want.step, bucket=want.bucket, field="bucket_sizes",
                    name=name_span(want.names),
                    title=f"rank {r} all-reduced step {want.step}'s gradients in buckets "
                          f"that differ from DDP's plan{after}",
                    values=((f"all_reduce sizes {got} ({seqs})", (r,)),),
                    detail=(f"DDP's plan ({_settings_text(want)}) has bucket {want.bucket} "
                            f"next: {want.numel:,} {want.dtype} ({name_span(want.names)})",),
                    fix=fix_for("plan_mismatch")))
            else:
                out.append(Finding(
                    kind="collective_mismatch", severity="error", ranks=(r,),
                    world_size=world, field="extra",
                    title=f"rank {r} launched {len(run)} collective(s) that are not DDP's"
                          f"{after}",
                    values=tuple((f"#{lab.entry.seq} {lab.entry.describe()}", (r,))
                                 for lab in run[:6]),
                    detail=(f"DDP's next collective there: {want.label()}",) if want else (),
                    fix=fix_for("collective_mismatch", "extra")))
    return out


def _settings_text(want: Any) -> str:
    return f"{want.which} map"


def _wait(ranks: Sized) -> str:
    return "waits" if len(ranks) == 1 else "wait"
