"""The comparison of collective histories, pure (no torch, no store): what each rank issued at
each position of a process group (`Entry`, `Mark`) and the first position where ranks differ as
a `Finding`. The live check (collective_check.py) compares what ranks posted to the store; the
ring (ledger_ring.py) compares what each rank's ring file held after the job ended. See [Note:
comparing histories] (collective_check.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from ddpviz.findings import Finding, fix_for, format_ranks
from ddpviz.units import ordinal

# engine/comm.py's kinds of a DDP buffer broadcast (engine/ cannot be imported here: it
# imports torch; tests/probes hold the two equal)
BUFFERS = 1
EVALUATION = 2


class Entry(msgspec.Struct, array_like=True):
    """One collective as this rank issued it (what ranks compare). `span` is set once, when
    the call returns (by the thread that issued it)."""

    pos: int  # the group's sequence number before the call, less point-to-point shifts
    span: int  # how many sequence numbers it took (-1: still inside the call)
    op: str  # torch.distributed's function name ("all_reduce", "ddp:bucket 2")
    sig: str  # what must agree across ranks ("float32 x12 sum"); "" when nothing must
    site: str  # the user's call site: "train.py:54 in save_checkpoint"
    step: int  # the DDP step this rank was in (-1: before any)
    asym: bool = False  # point-to-point: not compared by position
    bucket: int = -1  # a DDP bucket's all-reduce (its comm hook ran it): the bucket
    # a DDP's buffer broadcast: comm.BUFFERS, or comm.EVALUATION for a forward without
    # gradients (See [Note: an evaluation on some ranks only], collective_check.py); else 0
    forward: int = 0


class Mark(msgspec.Struct, array_like=True, frozen=True):
    """Where a DDP's step began in a group's sequence: positions from here to the next mark
    that no Entry covers are DDP's (its forward's broadcasts, its backward's all-reduces)."""

    pos: int
    step: int
    bucket: int = -1  # the all-reduce of this bucket starts here (watch()'s guard knows)


class History(Protocol):
    """One rank's history of one group, as read (the store's chunks, or a ring file)."""

    by_pos: dict[int, Entry]
    marks: list[Mark]
    gap: bool  # part of it was not read: no verdict


def _at(h: History, pos: int) -> Entry | None:
    """The entry that starts at `pos` on a rank."""
    e = h.by_pos.get(pos)
    return e if e is not None and not e.asym else None


def _covering(h: History, pos: int) -> Entry | None:
    """An entry that started before `pos` and was still issuing collectives at it (the
    object collectives issue several)."""
    for back in range(1, 8):
        e = h.by_pos.get(pos - back)
        if e is not None:
            return e if (e.span < 0 or e.span > back) else None
    return None


def compare_at(name: str, ranks: tuple[int, ...], histories: Mapping[int, History],
               pos: int, *, after: str = "") -> Finding | None:
    """The finding at `pos` of group `name` (its global ranks `ranks`), None when the ranks
    agree there; `after`: a detail line added to it (where it was found)."""
    mine: dict[int, Entry] = {}
    other: dict[int, str] = {}
    for r in ranks:
        h = histories[r]
        if h.gap:
            return None  # part of a rank's history was not read: no verdict
        e = _at(h, pos)
        if e is not None:
            mine[r] = e
        else:
            inside = _covering(h, pos)
            if inside is not None:
                mine[r] = inside
            else:
                other[r] = _not_python(h.marks, pos)
    if not mine:
        return None
    if not other and len({_agree(e) for e in mine.values()}) == 1:
        return None
    return finding_at(name, ranks, pos, mine, other, after=after)


def finding_at(name: str, ranks: tuple[int, ...], pos: int, mine: dict[int, Entry],
               other: dict[int, str], *, after: str = "") -> Finding:
    """The finding at `pos`: `mine` the ranks' calls there, `other` what the ranks that
    issued none were in."""
    label = _group_label(name)
    nth = ordinal(pos + 1)
    values = _values({**{r: _entry_text(e) for r, e in mine.items()}, **other},
                     largest_first=True)
    step = max((e.step for e in mine.values()), default=-1)
    detail = (_place(nth, label, ranks, step), *((after,) if after else ()))
    if other:
        issued = tuple(sorted(mine))
        first = mine[issued[0]]
        title = (f"{format_ranks(issued)} issued {first.op} at {first.site} as the {nth} "
                 f"collective on {label}; {format_ranks(sorted(other))} issued something "
                 "else there")
        return Finding(kind="unmatched_collective", severity="error", title=title,
                       ranks=issued, step=step, detail=detail, values=values,
                       fix=fix_for("unmatched_collective"), world_size=len(ranks))
    if len({(e.op, e.sig) for e in mine.values()}) == 1:  # only the forwards differ
        return _evaluation_finding(name, ranks, pos, mine, after)
    counts: dict[tuple[str, str], list[int]] = {}
    for r, e in mine.items():
        counts.setdefault((e.op, e.sig), []).append(r)
    sizes = sorted((len(v) for v in counts.values()), reverse=True)
    if sizes[0] > sizes[1]:  # a majority: the others are the odd ones out
        common = max(counts.values(), key=len)
        odd = tuple(sorted(r for r in mine if r not in common))
    else:  # no rank's call is more common than another's: name them all
        odd = tuple(sorted(mine))
    title = (f"ranks issued different collectives as the {nth} collective on {label} "
             "(op, dtype, size or source rank differ)")
    return Finding(kind="collective_mismatch", severity="error", title=title, ranks=odd,
                   step=step, detail=detail, values=values,
                   fix=fix_for("collective_mismatch", "job"), world_size=len(ranks))


def _evaluation_finding(name: str, ranks: tuple[int, ...], pos: int,
                        mine: dict[int, Entry], after: str) -> Finding:
    """Some ranks' call at `pos` is the buffer broadcast of a forward without gradients,
    the others' is not (See [Note: an evaluation on some ranks only])."""
    label, nth = _group_label(name), ordinal(pos + 1)
    evaluating = tuple(sorted(r for r, e in mine.items() if e.forward == EVALUATION))
    others = tuple(sorted(r for r in mine if r not in evaluating))
    first = mine[evaluating[0]]
    values = _values({r: _forward_text(e) for r, e in mine.items()}, largest_first=False)
    theirs = [mine[r] for r in others]
    if all(e.forward == BUFFERS for e in theirs):
        steps = sorted({e.step for e in theirs})
        what = (f"DDP's buffer broadcast of the training forward at step "
                f"{', '.join(map(str, steps))}")
    else:
        what = "something else (below)"
    at_step = f" at step {first.step}" if first.step >= 0 else ""
    title = (f"{format_ranks(evaluating)} ran a forward through the DDP without gradients "
             f"(an evaluation) at {first.site}{at_step} that {format_ranks(others)} did "
             f"not: its buffer broadcast is the {nth} collective on {label}, where "
             f"{format_ranks(others)} issued {what}")
    detail = (_place(nth, label, ranks, -1),
              "a forward through the DDP broadcasts its buffers from rank 0 (broadcast_"
              "buffers=True) and leaves that out of the next forward, so the evaluating "
              "ranks have one broadcast more than the others until their next training "
              "forward: the job hangs, or pairs it with another collective, when one is "
              "left over (after the last evaluation at the latest)",
              *((after,) if after else ()))
    return Finding(kind="unmatched_collective", severity="error", title=title,
                   ranks=evaluating, step=first.step, detail=detail, values=values,
                   fix=fix_for("unmatched_collective", "evaluation"),
                   world_size=len(ranks))


def _not_python(marks: Sequence[Mark], pos: int) -> str:
    """What a rank's collective at `pos` was when it was not a call into torch.distributed."""
    best: Mark | None = None
    for m in marks:
        if m.pos <= pos and (best is None or m.pos >= best.pos):
            best = m
    if best is None:
        return "a collective not issued through torch.distributed (DDP's constructor or C++)"
    if best.bucket >= 0 and best.pos == pos:
        return f"DDP's all-reduce of bucket {best.bucket} at step {best.step}"
    return (f"one of DDP's collectives at step {best.step} (its buffer broadcast or bucket "
            "all-reduces), not a call into torch.distributed")


def _agree(e: Entry) -> tuple[str, str, bool]:
    """What ranks' calls at one position must agree on (See [Note: an evaluation on some
    ranks only])."""
    return e.op, e.sig, e.forward == EVALUATION


def _forward_text(e: Entry) -> str:
    """A call at a position where some rank's is an evaluation's buffer broadcast."""
    if e.forward == EVALUATION:
        return f"the buffer broadcast of a forward without gradients: {_entry_text(e)}"
    at_step = f" (step {e.step})" if e.step >= 0 else ""
    if e.forward == BUFFERS:
        return (f"DDP's buffer broadcast of the training forward at step {e.step}: "
                f"{_entry_text(e)}")
    return f"{_entry_text(e)}{at_step}"


def _entry_text(e: Entry) -> str:
    what = e.op if not e.sig else f"{e.op}({e.sig})"
    if e.bucket >= 0:
        what = f"DDP's all-reduce of bucket {e.bucket} ({e.sig})"
    return f"{what} at {e.site}"


def _values(texts: dict[int, str], *, largest_first: bool
            ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A finding's values: each distinct text with the ranks that issued it, the most common
    first (or in rank order)."""
    by_text: dict[str, list[int]] = {}
    for r in sorted(texts):
        by_text.setdefault(texts[r], []).append(r)
    pairs = [(t, tuple(rs)) for t, rs in by_text.items()]
    if largest_first:
        return tuple(sorted(pairs, key=lambda v: (-len(v[1]), v[1])))
    return tuple(sorted(pairs, key=lambda v: v[1]))


def _place(nth: str, label: str, ranks: Sequence[int], step: int) -> str:
    """The detail line saying which collective of the group the finding is about."""
    at_step = f" at step {step}" if step >= 0 else ""
    return (f"the {nth} collective on {label} ({format_ranks(ranks)}){at_step}, in the order "
            "each rank issued them; what each rank issued there is above")


def _group_label(name: str) -> str:
    if name in ("0", "default_pg"):
        return "the default group"
    return f"group {name}"
