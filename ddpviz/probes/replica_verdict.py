"""What a replica check found, in words: every rank's digests of one checked step in, a
`replicas_diverged` Finding (or None) out. Pure: no store, no torch (See [Note: replica
digests] in replicas.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from ddpviz.findings import (
    Finding,
    fix_for,
    format_ranks,
    group_ranks,
    odd_ranks,
    rank_spans,
    recording_advice,
)

SHOWN = 8  # differing tensors named in the title and detail lines


@dataclasses.dataclass
class RankState:
    """One rank's digests of one checked step: per tensor (digest pair), per tensor (norm,
    sum |x|) for parameters, reduced gradients (None: not digested)
    and buffers."""

    params: list[tuple[int, int]]
    param_stats: list[tuple[float, float]]
    grads: list[tuple[int, int]] | None
    grad_stats: list[tuple[float, float]] | None
    buffers: list[tuple[int, int]]
    buffer_stats: list[tuple[float, float]]
    buffer_names: list[str]
    synced: bool  # the checked step's backward all-reduced (not under no_sync)


def _differing(per_rank: Mapping[int, Sequence[tuple[int, int]]], n: int) -> list[int]:
    ranks = sorted(per_rank)
    return [i for i in range(n)
            if len({tuple(per_rank[r][i]) if i < len(per_rank[r]) else None for r in ranks}) > 1]


def _groups(per_rank: Mapping[int, Sequence[tuple[int, int]]], which: Sequence[int],
            label: Callable[[int], str] | None = None
            ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Ranks that hold the same bytes for every tensor in `which`, as ("group A: ...", ranks);
    `label(rank)` says what the group holds."""
    keys = {r: repr([tuple(per_rank[r][i]) if i < len(per_rank[r]) else None for i in which])
            for r in per_rank}
    grouped = group_ranks(keys)
    return tuple((f"group {chr(ord('A') + k) if k < 26 else k}"
                  + (f" ({label(rs[0])})" if label is not None else ""), rs)
                 for k, (_, rs) in enumerate(grouped))


def _norm_of(stats: Mapping[int, Sequence[tuple[float, float]]], i: int, name: str
             ) -> Callable[[int], str]:
    def label(rank: int) -> str:
        row = stats[rank]
        if i >= len(row):
            return f"{name}: absent"
        return f"{name} norm {row[i][0]:.6g}"
    return label


def _size(stats: Mapping[int, Sequence[tuple[float, float]]], i: int,
          groups: Sequence[tuple[str, tuple[int, ...]]]
          ) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
    """How large the difference of tensor i is: norm and mean per group of ranks, as text and
    as (what the group holds, its ranks) for `Finding.tensors` (the same words)."""
    parts = []
    norms = []
    held: list[tuple[str, tuple[int, ...]]] = []
    for _, rs in groups:
        r = rs[0]
        if i >= len(stats[r]):
            continue
        norm, total = stats[r][i]
        norms.append(norm)
        held.append((f"norm {norm:.6g}, sum |x| {total:.6g}", rs))
        parts.append(f"{format_ranks(rs)}: {held[-1][0]}")
    gap = ""
    finite = [x for x in norms if math.isfinite(x)]
    if len(finite) >= 2:
        gap = f"; norms differ by {max(finite) - min(finite):.3g}"
        if max(finite) > 0:
            gap += f" ({(max(finite) - min(finite)) / max(finite):.2%})"
    return "; ".join(parts) + gap, held


def differing_names(states: Mapping[int, RankState], param_names: Sequence[str]) -> set[str]:
    """The dotted names of the parameters and buffers whose bytes differ across ranks."""
    if len(states) < 2:
        return set()
    buffer_names = max((s.buffer_names for s in states.values()), key=len)
    params = _differing({r: s.params for r, s in states.items()}, len(param_names))
    buffers = _differing({r: s.buffers for r, s in states.items()}, len(buffer_names))
    return {param_names[i] for i in params} | {buffer_names[i] for i in buffers}


def judge(step: int, states: Mapping[int, RankState], *, param_names: Sequence[str],
          broadcast_buffers: bool, last_agreed: int, precise: bool, world_size: int,
          exclude: frozenset[str] = frozenset()) -> Finding | None:
    """The finding for checked step `step` (parameters after its optimizer step, buffers
    right after the next forward's broadcast, gradients after its reduction), or None when every
    rank holds the same bytes. `last_agreed`: the last checked step where they agreed (-1:
    none, DDP's constructor broadcast made them equal); `precise`: every step since
    `last_agreed` was checked."""
    if len(states) < 2:
        return None
    n_params = len(param_names)
    params = {r: s.params for r, s in states.items()}
    bad_params = [i for i in _differing(params, n_params) if param_names[i] not in exclude]
    buffer_names = max((s.buffer_names for s in states.values()), key=len)
    buffers = {r: s.buffers for r, s in states.items()}
    bad_buffers = [i for i in _differing(buffers, len(buffer_names))
                   if buffer_names[i] not in exclude]
    if not bad_params and not bad_buffers:
        return None
    unsynced = tuple(sorted(r for r, s in states.items() if not s.synced))
    # See [Note: the cause from every rank]
    micro = len(unsynced) == len(states)
    grads = {r: s.grads for r, s in states.items() if s.grads is not None}
    bad_grads = (_differing(grads, n_params) if len(grads) == len(states) and not unsynced
                 else None)

    names = [param_names[i] for i in bad_params] + [buffer_names[i] for i in bad_buffers]
    if bad_params:
        first = bad_params[0]
        groups = _groups(params, bad_params, _norm_of(_stats(states, "param_stats"), first,
                                                      param_names[first]))
        field = "parameter"
    else:
        first = bad_buffers[0]
        groups = _groups(buffers, bad_buffers, _norm_of(_stats(states, "buffer_stats"), first,
                                                        buffer_names[first]))
        field = "buffer"
    odd, alone = _moved(groups)
    exact = precise or last_agreed == step - 1
    when = (f"first differing after step {step}" if exact else
            f"after step {step} (last agreed after step {last_agreed}; the first differing step "
            f"is between {last_agreed + 1} and {step})" if last_agreed >= 0 else
            f"after step {step} (first check; they were equal at DDP's construction)")
    shown = ", ".join(repr(x) for x in names[:SHOWN]) + (
        f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    kinds = []
    if bad_params:
        kinds.append(f"{len(bad_params)} of {n_params} parameters")
    if bad_buffers:
        kinds.append(f"{len(bad_buffers)} of {len(buffer_names)} buffers")
    title = f"replicas diverged: {' and '.join(kinds)} differ across ranks {when}: {shown}"

    # the likely cause, in plain words
    detail: list[str] = []
    severity = "error"
    variant = ""
    if bad_params and unsynced and not micro:
        variant = "no_sync"
        synced = tuple(sorted(r for r in states if r not in unsynced))
        detail.append(f"{format_ranks(unsynced)} ran step {step}'s backward without gradient "
                      "sync (no_sync() or require_backward_grad_sync=False: its gradients were "
                      f"not all-reduced), while {format_ranks(synced)} all-reduced: each rank "
                      "then stepped with different gradients")
    elif bad_params and micro:
        variant = "optimizer"
        detail.append(f"step {step} ran its backward without gradient sync on every rank (a "
                      "gradient-accumulation micro-step: no_sync() or "
                      "require_backward_grad_sync=False), which is normal and not the cause; "
                      + ("the parameters changed after it, before the next forward: an "
                         "optimizer step that used those local gradients (step only after the "
                         "backward that syncs), or gradients or parameters edited on some ranks "
                         "only (clipping, scaling, clamping under a rank condition)" if exact
                         else "the parameters changed differently at an optimizer step before "
                         "it: the optimizer (a different learning rate, schedule or state on "
                         "some ranks), or gradients or parameters edited on some ranks only "
                         "(clipping, scaling, clamping under a rank condition)"))
    elif bad_params and bad_grads:
        variant = "grads"
        grad_names = ", ".join(repr(param_names[i]) for i in bad_grads[:SHOWN])
        detail.append(f"the reduced gradients differed at step {step} ({grad_names}): a bucket "
                      "was skipped or reduced differently on some ranks (no_sync() or an "
                      "unused parameter on one rank, a comm hook that does not return the same "
                      "result everywhere)")
    elif bad_params and bad_grads is not None:
        variant = "optimizer"
        detail.append(f"the reduced gradients were equal on every rank at step {step}, so the "
                      "parameters changed differently after the reduction: the optimizer (a "
                      "different learning rate, schedule or state on some ranks) or a "
                      "rank-local edit of the parameters (in place, under a rank condition)")
    elif bad_params:
        variant = "optimizer"
        detail.append(f"the gradients were not checked at step {step} (no backward hook ran "
                      "there); the parameters changed differently on some ranks: the optimizer "
                      "or a rank-local edit, or gradients that differed")
    if bad_buffers:
        buf = ", ".join(repr(buffer_names[i]) for i in bad_buffers[:SHOWN])
        if not broadcast_buffers:
            detail.append(f"buffers {buf} differ: DDP was built with broadcast_buffers=False, "
                          "so each rank keeps its own (e.g. BatchNorm running statistics): "
                          "expected")
            if not bad_params:
                severity = "info"
                variant = "buffers_local"
        else:
            detail.append(f"buffers {buf} differ right after DDP's buffer broadcast from rank "
                          "0: something changed them between that broadcast and this check on "
                          "some ranks")
            if not bad_params:
                variant = "buffers"
    tensors = []  # the per-tensor lines as data, for the replica view (Finding.tensors)
    shown_tensors = [(param_names[i], _size(_stats(states, "param_stats"), i,
                                            _groups(params, [i])))
                     for i in bad_params[:SHOWN]]
    shown_tensors += [(buffer_names[i], _size(_stats(states, "buffer_stats"), i,
                                              _groups(buffers, [i])))
                      for i in bad_buffers[:SHOWN]]
    for tensor, (sizes, held) in shown_tensors:
        detail.append(f"{tensor}: {sizes}")
        if held:
            tensors.append((tensor, tuple((what, rank_spans(rs)) for what, rs in held)))
    if not alone and bad_params:
        who = "both ranks differ" if len(odd) == 2 else f"{format_ranks(odd)} all differ"
        detail.append("which rank's parameters moved differently cannot be told from their "
                      f"bytes: no value is held by more ranks than the others ({who}; with 3 "
                      "or more ranks, the ranks that differ from the value the others agree "
                      "on are named)")
    if not exact:
        detail.append("checked every step from now on for a while; "
                      f"{recording_advice('replicas=1')} finds the first differing step "
                      "exactly")
    return Finding(
        kind="replicas_diverged", severity=severity,  # type: ignore[arg-type]
        title=title, ranks=odd, param=first if bad_params else -1,
        name=names[0], field=field, step=step, values=groups, detail=tuple(detail),
        fix=fix_for("replicas_diverged", variant), world_size=world_size,
        tensors=tuple(tensors))


# [Note: the cause from every rank]
# The likely cause is read from what every rank did at the checked step, never from one rank:
# - some ranks ran its backward without gradient sync and others with it: those ranks stepped
#   with their own gradients (no_sync on some ranks only);
# - every rank ran it without sync: a gradient-accumulation micro-step, normal; its gradients
#   are local by design, so they are no evidence either way, and the parameters that differ
#   changed at an optimizer step before it;
# - every rank synced: reduced gradients that differ point at the reduction, equal ones at what
#   happened after it (the optimizer, a rank-local edit such as clipping on one rank).
# Which ranks moved differently: the ranks outside the value most ranks hold. With two ranks
# (or no value held by more ranks than any other) no rank is the odd one: all are named.


def _moved(groups: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[tuple[int, ...], bool]:
    """The ranks whose tensors moved differently, and whether they are set apart (a value
    held by more ranks than any other); when not, every rank (See [Note: the cause from every
    rank])."""
    if len(groups) > 1 and len(groups[0][1]) > len(groups[1][1]):
        return odd_ranks(groups), True
    return tuple(sorted(r for _, rs in groups for r in rs)), False


def _stats(states: Mapping[int, RankState], attr: str
           ) -> dict[int, list[tuple[float, float]]]:
    return {r: getattr(s, attr) for r, s in states.items()}

