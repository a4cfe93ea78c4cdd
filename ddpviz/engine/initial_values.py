"""Initial values compared across ranks before DDP's state broadcast. Differing values are
harmless under DDP (rank 0's are broadcast) but usually mean a missing `torch.manual_seed`, so
they make a warning finding, never an error: loading a checkpoint on rank 0 only is a valid use.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ddpviz.engine.params import build_params_for_reducer, parameters_to_ignore
from ddpviz.findings import Finding, fix_for, group_ranks, odd_ranks


def _checksums(params: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[n, 2] float64: each tensor's sum and position-weighted sum (order-sensitive)."""
    out = torch.zeros(len(params), 2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for i, p in enumerate(params):
            flat = p.detach().reshape(-1).to(device=device, dtype=torch.float64)
            if flat.numel() == 0:
                continue
            weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=device)
            out[i, 0] = flat.sum()
            out[i, 1] = (flat * weights).sum()
    return out


def initial_value_findings(module: nn.Module, process_group: dist.ProcessGroup | None = None, *,
                           ignore: set[str] | None = None) -> tuple[Finding, ...]:
    """Compare every parameter's values across ranks (collective: one all_gather of two
    float64 checksums per parameter). Call only when verification passed (same parameters).

    Returns:
        One warning finding naming the parameters whose values differ and on which ranks, or
        nothing when every rank holds the same values.
    """
    group = dist.group.WORLD if process_group is None else process_group
    assert group is not None
    world_size = group.size()
    if world_size == 1:
        return ()
    entries = build_params_for_reducer(module, parameters_to_ignore(module)
                                       if ignore is None else ignore)
    params = [e.param for e in entries]
    if not params:
        return ()
    device = params[0].device if params[0].device.type == "cuda" and _backend(group) == "nccl" \
        else torch.device("cpu")
    mine = _checksums(params, device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group)
    sums = [g.cpu().tolist() for g in gathered]
    differ = [i for i in range(len(params)) if len({tuple(s[i]) for s in sums}) > 1]
    if not differ:
        return ()
    first = differ[0]
    values = group_ranks({r: f"checksum {sums[r][first][0]:.6g} / {sums[r][first][1]:.6g}"
                          for r in range(world_size)})
    names = [entries[i].name for i in differ]
    shown = ", ".join(repr(n) for n in names[:6]) + (", ..." if len(names) > 6 else "")
    return (Finding(
        kind="initial_values", severity="warning",
        title=f"{len(differ)} of {len(params)} parameters have different values across ranks "
              f"before DDP's broadcast, first parameter {first} '{entries[first].name}'",
        ranks=odd_ranks(values), param=first, name=entries[first].name, field="values",
        values=values, detail=(f"differing: {shown}",
                               "DDP overwrites them with rank 0's values at construction"),
        fix=fix_for("initial_values"), world_size=world_size),)


def _backend(group: dist.ProcessGroup) -> str:
    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return ""
