"""The findings of one process group's aligned dumps: the collective the group is stuck at
(`rank_hang`), ranks that launched different collectives under one sequence id
(`collective_mismatch`, variant "sequence"; "extra" when the odd ranks' collective comes from a
call site the others never reach), collectives some ranks launched and the others never did
(`collective_mismatch` "extra"), and bucket sizes that differ from DDP's plan (`plan_mismatch`).
DDP's collectives are named in bucket terms (with a model), the job's own by their call site
(where the dumps have stacks; naming.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized

from ddpviz._postmortem.align import GroupAlignment, Mismatch
from ddpviz._postmortem.callsite import site_text
from ddpviz._postmortem.ddp_map import name_span
from ddpviz._postmortem.dumps import FrEntry
from ddpviz._postmortem.naming import Namer, group_text
from ddpviz.findings import Finding, fix_for, format_ranks, group_ranks
from ddpviz.plan import BucketPlan

MAX_MISMATCHES = 8  # per group: the first ones say what went wrong, the rest follow from them
NO_STACK = ("no stack in the dump, so no call site (the JSON form never has one; torch's "
            "_dump_fr_trace() and the files of TORCH_FR_DUMP_TEMP_FILE do)")


def group_findings(g: GroupAlignment, namer: Namer, plan: BucketPlan | None, world: int
                   ) -> list[Finding]:
    """Every finding of one process group, in the order: missing dumps, the stall, sequence
    mismatches, collectives only some ranks launched, bucket sizes off DDP's plan."""
    out: list[Finding] = []
    pg = "" if g.pg in ("0", "") else f" of process group {g.pg!r}"
    if g.missing_dumps:
        out.append(Finding(
            kind="missing_rank", severity="warning", world_size=world,
            ranks=g.missing_dumps,
            title=f"no Flight Recorder dump from {format_ranks(g.missing_dumps)}{pg}",
            fix=fix_for("missing_rank", "dumps")))
    if g.stall is not None and not _follows_mismatch(g):
        out.append(_hang(g, namer, pg, world))
    sites = _Sites(g, namer)
    out += [_mismatch(g, m, namer, sites, pg, world) for m in g.mismatches[:MAX_MISMATCHES]]
    out += _extra(g, namer, sites, pg, world)
    if plan is not None:
        out += _plan_findings(g, namer, plan, world)
    return out


def _follows_mismatch(g: GroupAlignment) -> bool:
    """Whether the group's stall is a mismatch's doing, which that finding says: every rank
    launched the stalled collective, differently; or the ranks that never launched it wait in
    a mismatched one before it (they cannot go on)."""
    st = g.stall
    mismatched = {m.seq for m in g.mismatches}
    if st is None or not mismatched:
        return False
    if not st.never_launched:
        return st.seq in mismatched
    pending = [g.states[r].first_pending for r in st.never_launched]
    return all(e is not None and e.seq in mismatched for e in pending)


def _key(e: FrEntry) -> tuple[str, str, int]:
    """A job collective's place in the code: the same op from the same line."""
    assert e.site is not None
    return (e.op, e.site.file, e.site.line)


class _Sites:
    """Where each rank launched the job's collectives, as far as its dump tells: a rank is
    blind when it holds a collective that may be the job's but has no stack (then nobody can
    say that it never launched one from a given line)."""

    def __init__(self, g: GroupAlignment, namer: Namer) -> None:
        self.keys: dict[int, set[tuple[str, str, int]]] = {}
        self.blind: set[int] = set()
        for r, entries in g.entries.items():
            keys = self.keys.setdefault(r, set())
            for e in entries.values():
                who = namer.who(g.pg, r, e)
                if e.site is not None and who == "job":
                    keys.add(_key(e))
                elif who in ("job", "unplanned", ""):
                    self.blind.add(r)

    def only_theirs(self, e: FrEntry, others: Iterable[int]) -> bool:
        """Whether none of `others` ever launched a collective like `e` (the same op from
        the same line; for an entry without a stack, any collective of the job's) in its
        dump, which must say so: no blind rank among them, and at least one of them."""
        others = list(others)
        if not others or any(q in self.blind for q in others):
            return False
        if e.site is None:
            return not any(self.keys.get(q) for q in others)
        return not any(_key(e) in self.keys.get(q, ()) for q in others)


def _name(g: GroupAlignment, namer: Namer, pg: str, rank: int, seq: int) -> str:
    """"bucket 0 of step 3 (...)" for DDP's, else "collective #N (the job's barrier at ...)"."""
    e = g.entries.get(rank, {}).get(seq)
    if e is None:
        return f"collective #{seq}{pg}"
    lab = namer.lab(g.pg, rank, seq)
    if lab is not None and lab.ddp is not None:
        return lab.ddp.label()
    return f"collective #{seq}{pg} ({namer.what(g.pg, rank, e)})"


def _hang(g: GroupAlignment, namer: Namer, pg: str, world: int) -> Finding:
    st = g.stall
    assert st is not None
    waiter = min(st.waiting)
    entry = st.waiting[waiter]
    lab = namer.lab(g.pg, waiter, st.seq)
    ddp = lab.ddp if lab else None
    what = _name(g, namer, pg, waiter, st.seq)
    values: dict[int, str] = {r: f"waiting in it (collective #{st.seq})" for r in st.waiting}
    for r in st.never_launched:
        last = g.states[r].last_completed
        if last is None:
            values[r] = "last completed: nothing in its dump"
        else:
            done = _name(g, namer, pg, r, last.seq)
            values[r] = "last completed: " + done + (
                "" if done.startswith("collective #") else f" (#{last.seq})")
    for r in st.ahead:
        values[r] = "completed it"
    detail = []
    if ddp is not None and ddp.phase == "bucket":
        detail.append(f"bucket {ddp.bucket} ({ddp.which} map) holds: {', '.join(ddp.names)}")
    if entry.site is not None:
        detail.append(f"rank {waiter} launched it from {site_text(entry.site)}")
    if namer.who(g.pg, waiter, entry) == "job":
        detail.append(f"on {group_text(g)}")
    if st.also:
        later = [_name(g, namer, pg, min((r for r in g.entries if s in g.entries[r]),
                                         default=waiter), s) for s in st.also[:3]]
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
    return Finding(
        kind="rank_hang", severity="error", title=title, ranks=ranks, world_size=world,
        step=ddp.step if ddp else -1, bucket=ddp.bucket if ddp else -1,
        param=ddp.param_indices[0] if ddp and len(ddp.param_indices) == 1 else -1,
        name=name_span(ddp.names) if ddp and ddp.names else "",
        field=ddp.phase if ddp else "collective",
        values=group_ranks(values), detail=tuple(detail), fix=fix_for("rank_hang", "dumps"))


def _mismatch(g: GroupAlignment, m: Mismatch, namer: Namer, sites: _Sites, pg: str,
              world: int) -> Finding:
    """One sequence id, different collectives. The ranks at fault are those whose collective
    is the job's, from a call site where none of the ranks that launched something else ever
    launched one (a collective only they issue); else the odd ones out, or all of them when no
    group of ranks is the larger."""
    values = {r: namer.value(g.pg, r, e) for r, e in m.by_rank.items()}
    grouped = group_ranks(values)
    kinds = {(e.op, e.dtypes) for e in m.by_rank.values()}
    fld = "op" if len({k[0] for k in kinds}) > 1 else \
        "dtype" if len({k[1] for k in kinds}) > 1 else "size"
    own: list[int] = []
    for r, e in sorted(m.by_rank.items()):
        if e.site is None or namer.who(g.pg, r, e) != "job":
            continue
        others = [q for q, f in m.by_rank.items() if f.site is None or _key(f) != _key(e)]
        if sites.only_theirs(e, others):
            own.append(r)
    detail = []
    if own and len(own) < len(m.by_rank):
        ranks = tuple(own)
        rest = sorted(set(m.by_rank) - set(own))
        where = sorted({site_text(s) for r in own if (s := m.by_rank[r].site) is not None})
        detail.append(f"{format_ranks(ranks)} launched it from {', '.join(where)}; "
                      f"{format_ranks(rest)}'s dump{'s hold' if len(rest) > 1 else ' holds'} no "
                      "collective from there: a collective only some ranks issue")
        fix = fix_for("collective_mismatch", "extra")
    else:
        larger = len(grouped) > 1 and len(grouped[0][1]) > len(grouped[1][1])
        ranks = tuple(sorted(r for _, rs in grouped[1:] for r in rs)) if larger else \
            tuple(sorted(m.by_rank))
        entries = list(m.by_rank.values())
        same_site = fld != "op" and all(e.site is not None for e in entries) and \
            len({_key(e) for e in entries}) == 1
        fix = fix_for("collective_mismatch", "same_site" if same_site else "sequence")
    waiting = sorted(r for r, e in m.by_rank.items() if not e.completed)
    done = sorted(r for r, e in m.by_rank.items() if e.completed)
    detail.append("; ".join(x for x in (
        f"{format_ranks(waiting)} {_wait(waiting)} in it" if waiting else "",
        f"{format_ranks(done)} completed it" if done else "") if x))
    detail.append(f"on {group_text(g)}")
    bare = sorted(r for r, e in m.by_rank.items()
                  if not e.origin and namer.who(g.pg, r, e) != "ddp")
    if bare:
        detail.append(f"{format_ranks(bare)}: {NO_STACK}")
    return Finding(
        kind="collective_mismatch", severity="error", world_size=world, ranks=ranks,
        field=fld, title=f"collective #{m.seq}{pg} has a different {fld} across ranks",
        values=grouped, detail=tuple(detail), fix=fix)


def _extra(g: GroupAlignment, namer: Namer, sites: _Sites, pg: str, world: int
           ) -> list[Finding]:
    """Collectives that are not DDP's, launched by some ranks at sequence ids the other ranks
    never reached (their dumps end before), where those ranks' dumps show that they never
    launch such a collective (`_Sites.only_theirs`; else they are behind, and the stall's
    `rank_hang` says so). One finding per run of them; ranks that launched the same run
    together."""
    mismatched = {m.seq for m in g.mismatches}
    last = {r: st.last_launched.seq if st.last_launched else 0 for r, st in g.states.items()}
    runs: dict[tuple[tuple[int, str], ...], list[int]] = {}
    for r, entries in sorted(g.entries.items()):
        extra = [s for s in sorted(entries)
                 if s not in mismatched and any(n < s for n in last.values())
                 and namer.who(g.pg, r, entries[s]) in ("job", "unplanned")
                 and sites.only_theirs(entries[s], (q for q, n in last.items() if n < s))]
        for run in _runs(extra):
            key = tuple((s, namer.value(g.pg, r, entries[s])) for s in run)
            runs.setdefault(key, []).append(r)
    out = []
    for key, launched in runs.items():
        r, first = launched[0], key[0][0]
        never = tuple(sorted(q for q, n in last.items() if n < first))
        entries = g.entries[r]
        prev = next((lab.ddp for s in sorted(entries, reverse=True) if s < first
                     and (lab := namer.lab(g.pg, r, s)) is not None and lab.ddp), None)
        after = f" after {prev.label()}" if prev else ""
        if len(key) == 1:
            what = f"{namer.what(g.pg, r, entries[first])} (collective #{first}{pg})"
        else:
            what = f"{len(key)} collectives that are not DDP's"
        lab = namer.lab(g.pg, r, first)
        want = lab.expected if lab else None
        detail = [f"on {group_text(g)}"]
        if want is not None:
            detail.insert(0, f"DDP's next collective there: {want.label()}")
        if not entries[first].origin:
            detail.append(f"{format_ranks(launched)}: {NO_STACK}")
        out.append(Finding(
            kind="collective_mismatch", severity="error", ranks=tuple(launched),
            world_size=world, field="extra",
            title=f"{format_ranks(launched)} launched {what}, which {format_ranks(never)} "
                  f"never launched{after}",
            values=tuple((f"#{s} {v}", tuple(launched)) for s, v in key[:6]),
            detail=tuple(detail), fix=fix_for("collective_mismatch", "extra")))
    return out


def _runs(seqs: list[int]) -> list[list[int]]:
    """[3, 4, 5, 9] -> [[3, 4, 5], [9]]."""
    out: list[list[int]] = []
    for s in seqs:
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _plan_findings(g: GroupAlignment, namer: Namer, plan: BucketPlan, world: int
                   ) -> list[Finding]:
    """A rank whose all-reduces, where DDP's plan has its next buckets, add up to exactly
    what those buckets hold but in other pieces: a different bucket map. The job's own
    collectives (by their stack) are never taken for such pieces."""
    out: list[Finding] = []
    for r in sorted(g.entries):
        labs = [lab for s in sorted(g.entries[r]) if (lab := namer.lab(g.pg, r, s)) is not None]
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
            if want is None or want.phase != "bucket":
                continue
            buckets = plan.rebuilt if want.which == "rebuilt" and plan.rebuilt else plan.initial
            planned = sum(b.numel for b in buckets if b.index >= want.bucket)
            lead, total = [], 0  # the run's leading all-reduces of the bucket's dtype
            for lab in run:
                e = lab.entry
                if e.op != "all_reduce" or set(e.dtypes) != {want.dtype} or e.origin == "job" \
                        or total >= planned:
                    break
                lead.append(lab)
                total += e.numel
            if len(lead) < 2 or total != planned:
                continue
            prev = next((lab.ddp for lab in reversed(labs[:i - len(run)]) if lab.ddp), None)
            after = f" after {prev.label()}" if prev else ""
            seqs = ", ".join(f"#{lab.entry.seq}" for lab in lead[:8])
            out.append(Finding(
                kind="plan_mismatch", severity="error", ranks=(r,), world_size=world,
                step=want.step, bucket=want.bucket, field="bucket_sizes",
                name=name_span(want.names),
                title=f"rank {r} all-reduced step {want.step}'s gradients in buckets "
                      f"that differ from DDP's plan{after}",
                values=((f"all_reduce sizes {[lab.entry.numel for lab in lead]} ({seqs})",
                         (r,)),),
                detail=(f"DDP's plan ({want.which} map) has bucket {want.bucket} next: "
                        f"{want.numel:,} {want.dtype} ({name_span(want.names)})",),
                fix=fix_for("plan_mismatch")))
    return out


def _wait(ranks: Sized) -> str:
    return "waits" if len(ranks) == 1 else "wait"

