"""What a difference of the model across ranks says: the title of one entry's mismatches and
one `Finding` per mismatch. Pure and torch-free, so that diagnosing a recorded trace never loads
torch; the engine's verification (engine/verify.py) builds its error message from the same
titles."""

from __future__ import annotations

from collections.abc import Sequence

from ddpviz.events import Mismatch
from ddpviz.findings import Finding, Kind, fix_for, odd_ranks

# One table of titles for both readers of a mismatch: the error message (one title per block of
# mismatches on one entry) and diagnosis (one finding per mismatch, `per_field=True`).
_TITLES = {
    "present": "{what} {index} '{name}' is missing on some ranks",
    "order": "{what} '{name}' is registered at a different position on some ranks",
    "name": "{what} {index} is named differently across ranks",
}


def mismatch_title(block: Sequence[Mismatch], *, per_field: bool = False) -> str:
    """The title of one entry's mismatches; `per_field` names the field when nothing else
    (missing, reordered, renamed) explains the difference."""
    first = block[0]
    if first.kind == "count":
        return f"the number of {first.name} differs across ranks"
    if first.kind == "device":
        return "ranks on one host use the same GPU"
    what = "parameter" if first.kind == "param" else "buffer"
    fields = {m.field for m in block}
    key = ("present" if "present" in fields else "order" if fields == {"order"}
           else "name" if "name" in fields else "")
    if key:
        return _TITLES[key].format(what=what, index=first.index, name=first.name)
    differs = f"has a different {first.field}" if per_field else "differs"
    return f"{what} {first.index} '{first.name}' {differs} across ranks"


def mismatch_findings(mismatches: Sequence[Mismatch], world_size: int) -> list[Finding]:
    """One finding per verification mismatch (what differs, which entry, which ranks)."""
    out: list[Finding] = []
    for m in mismatches:
        values = tuple((v, tuple(rs)) for v, rs in m.values)
        ranks = odd_ranks(values)
        title = mismatch_title([m], per_field=True)
        if m.kind == "device":
            out.append(Finding(
                kind="gpu_shared", severity="error", title=title, ranks=ranks, field=m.field,
                values=values, fix=fix_for("gpu_shared"), world_size=world_size))
            continue
        if m.kind == "count":
            noun = m.name  # "parameters" | "buffers"
            kind: Kind = "param_mismatch" if noun == "parameters" else "buffer_mismatch"
            out.append(Finding(
                kind=kind, severity="error", title=title, ranks=ranks, name=noun, field="count",
                values=tuple((f"{v} {noun}", rs) for v, rs in values), fix=fix_for(kind),
                world_size=world_size))
            continue
        shown = values if m.field != "order" else tuple((f"index {v}", rs) for v, rs in values)
        out.append(Finding(
            kind="param_mismatch" if m.kind == "param" else "buffer_mismatch",
            severity="error", title=title, ranks=ranks,
            param=m.index, name=m.name, field=m.field, values=shown,
            fix=fix_for("param_mismatch", m.field), world_size=world_size))
    return out
