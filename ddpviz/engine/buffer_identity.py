"""Buffers replaced instead of updated in place. DDP syncs the tensors `named_buffers()` holds
when it syncs; a module that assigns a new tensor to a buffer each step (`self.stats =
self.stats * 0.9 + m`) allocates every step, breaks every other holder of the old tensor (an
EMA, optimizer state, a tied module, a hook) which silently stops seeing synced values, and a
buffer re-registered as a plain attribute is not synced at all. Checked before each sync
against the tensors of the previous one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ddpviz.findings import Finding, fix_for


class BufferIdentity:
    """Remembers which tensor each buffer was at the last sync; reports each buffer once."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._last: dict[str, int] = {}
        self._reported: set[str] = set()

    def check(self, buffers: Mapping[str, torch.Tensor], step: int) -> list[Finding]:
        """Findings for buffers reassigned or gone since the last call; then remember these."""
        current = {name: id(t) for name, t in buffers.items()}
        found: list[Finding] = []
        if self._last:
            for name, ident in self._last.items():
                if name in self._reported:
                    continue
                if name not in current:
                    found.append(self._finding(name, step, "gone", (
                        "it is no longer among the module's buffers (re-assigned as a plain "
                        "attribute, or deleted), so DDP no longer syncs it",)))
                elif current[name] != ident:
                    found.append(self._finding(name, step, "reassigned", (
                        "a new tensor replaced it since the last sync (reassigned, not updated "
                        "in place); DDP syncs the new one, but whatever still holds the old "
                        "tensor no longer gets synced values",)))
        self._last = current
        return found

    def _finding(self, name: str, step: int, what: str, detail: tuple[str, ...]) -> Finding:
        self._reported.add(name)
        where = f"before step {step}" if step >= 0 else "after construction"
        how = "replaced by a new tensor" if what == "reassigned" else "removed"
        return Finding(
            kind="buffer_reassigned", severity="warning",
            title=f"buffer '{name}' was {how} {where} on rank {self.rank}",
            ranks=(self.rank,), name=name, field="identity", step=step,
            values=((what, (self.rank,)),), detail=detail, fix=fix_for("buffer_reassigned"),
            world_size=self.world_size)
