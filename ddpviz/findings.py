"""The diagnosis vocabulary: a `Finding` says what is wrong, where (parameter, bucket, step),
on which ranks, with which values per rank, and the likely fix; and how findings read.

Findings are frozen msgspec Structs so they can travel inside `events.FindingReported` and
land in traces. The text follows the house style: the first line says what differs (index,
dotted name, world size), then one line per distinct value with its ranks, then the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from ddpviz.limits import (
    BucketIndexOrNone,
    Lines,
    Name,
    ParamIndexOrNone,
    Ranks,
    RankValues,
    Step,
    Text,
    WorldSizeOrUnknown,
)

Severity = Literal["error", "warning", "info"]

# Every kind of finding, with what its fields mean. Keep in step with diagnose.py and the docs.
KINDS: dict[str, str] = {
    "param_mismatch": "a parameter differs across ranks (field: present, name, order, shape, "
                      "stride, dtype, device, requires_grad, sparse_grad; or count)",
    "buffer_mismatch": "a buffer differs across ranks (field: present, name, order, shape, "
                       "dtype, device; or count)",
    "gpu_shared": "two ranks on one host use the same GPU",
    "initial_values": "parameter values differ before DDP's broadcast (usually a missing seed)",
    "unused_parameter": "a parameter got no gradient in a backward, on some or all ranks",
    "hook_fired_twice": "a parameter's gradient hook fired twice in one iteration",
    "graph_changed": "static_graph=True, but the set of parameters with gradients changed",
    "grad_order": "gradients became ready in a different order on some ranks",
    "missing_rank": "a rank never arrived where every rank must (or sent no events)",
    "rank_waiting": "live, before the hang deadline: ranks wait for others that have not "
                    "arrived yet (who is missing, since when)",
    "rank_hang": "ranks wait in a collective that other ranks did not reach",
    "rank_exited": "a rank's connection closed while others waited for it (exit or crash)",
    "peer_failed": "this rank stopped because another rank failed",
    "uneven_iterations": "ranks ran different numbers of iterations",
    "collective_mismatch": "ranks issued different collectives in the same iteration",
    "buffer_reassigned": "a buffer was replaced by a new tensor instead of updated in place",
    "events_dropped": "events were lost on the way, so the diagnosis may be incomplete",
    "plan_mismatch": "a rank's collectives differ from DDP's plan for the given model and "
                     "settings (bucket sizes or order; post-mortem)",
}

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One diagnosed problem. Only `kind`, `severity` and `title` are always set."""

    kind: Name  # a key of KINDS
    severity: Name  # "error" | "warning" | "info"
    title: Text  # what is wrong, one line, without "ddpviz: " and the world size
    ranks: Ranks = ()  # the ranks at fault (the odd ones out), sorted
    param: ParamIndexOrNone = -1  # parameter (or buffer) index in DDP's list; -1 when not about one
    name: Name = ""  # its dotted name
    field: Name = ""  # what differs: "shape", "dtype", "order", "grad_order", ...
    bucket: BucketIndexOrNone = -1  # bucket index (reduction order); -1 when not about one
    step: Step = -1  # DDP iteration; -1 for construction or unknown
    values: RankValues = ()  # (value, ranks), most common first
    detail: Lines = ()  # further lines, printed after the values
    fix: Text = ""  # the likely fix, one or two sentences
    world_size: WorldSizeOrUnknown = 0  # 0 when unknown

    def text(self, *, header: bool = True) -> str:
        """The house-style message: title line, one line per value with its ranks, detail,
        fix. header=False drops the "ddpviz: " prefix and world size (for grouped output)."""
        lines = [self.headline() if header else f"{self.severity}: {self.title}:"]
        lines += value_lines(self.values)
        lines += [f"  {d}" for d in self.detail]
        if self.fix and header:
            lines.append(self.fix)
        return "\n".join(lines)

    def headline(self) -> str:
        size = f" (world_size={self.world_size})" if self.world_size else ""
        colon = ":" if self.values or self.detail else "."
        return f"ddpviz: {self.title}{size}{colon}"

    def __str__(self) -> str:
        return self.text()

    def matches(self, **fields: object) -> bool:
        """True when every given field has the given value (tests and filters)."""
        return all(getattr(self, k) == v for k, v in fields.items())


class Findings(list[Finding]):
    """A list of findings that prints (and shows in IPython) as one house-style message."""

    def __str__(self) -> str:
        return format_findings(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


class DiagnosisWarning(UserWarning):
    """A finding of severity "warning" raised as a Python warning (e.g. initial values)."""


def format_ranks(ranks: Sequence[int]) -> str:
    """(3,) -> 'rank 3'; (0, 1, 2) -> 'ranks 0,1,2'; runs of 4 or more as 'a-b'."""
    parts: list[str] = []
    run: list[int] = []
    for r in [*sorted(ranks), None]:
        if r is not None and run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 4 else [str(x) for x in run]
        run = [] if r is None else [r]
    if not parts:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def group_ranks(values: Mapping[int, str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """{rank: value} -> ((value, ranks), ...), most common value first, ties by lowest rank."""
    by_value: dict[str, list[int]] = {}
    for r in sorted(values):
        by_value.setdefault(values[r], []).append(r)
    groups = [(v, tuple(rs)) for v, rs in by_value.items()]
    return tuple(sorted(groups, key=lambda g: (-len(g[1]), g[1][0])))


def odd_ranks(values: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """The ranks outside the most common group (all ranks when every group is one rank and
    there are only two: then nobody is "the odd one", so the later groups are)."""
    return tuple(sorted(r for _, rs in values[1:] for r in rs))


def value_lines(values: Sequence[tuple[str, tuple[int, ...]]]) -> list[str]:
    """'  ranks 0,1: value' lines, labels padded to one width."""
    if not values:
        return []
    width = max(len(format_ranks(rs)) for _, rs in values) + 1
    return [f"  {(format_ranks(rs) + ':').ljust(width)} {v}" for v, rs in values]


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable otherwise."""
    return sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))


def format_findings(findings: Sequence[Finding], world_size: int | None = None) -> str:
    """All findings in one message: a single one as itself; several as a summary line, one
    block each (errors first), then each distinct fix once."""
    if not findings:
        suffix = f" (world_size={world_size})" if world_size else ""
        return f"ddpviz: no problems found{suffix}."
    ordered = sort_findings(findings)
    if len(ordered) == 1:
        return ordered[0].text()
    size = world_size or max(f.world_size for f in ordered)
    counts = {s: sum(f.severity == s for f in ordered) for s in _SEVERITY_ORDER}
    summary = ", ".join(f"{n} {s}{'s' if n > 1 else ''}" for s, n in counts.items() if n)
    lines = [f"ddpviz: {len(ordered)} findings ({summary})"
             f"{f' (world_size={size})' if size else ''}:"]
    for f in ordered:
        lines.append(f.text(header=False))
    fixes: list[str] = []
    for f in ordered:
        if f.fix and f.fix not in fixes:
            fixes.append(f.fix)
    lines += fixes
    return "\n".join(lines)
