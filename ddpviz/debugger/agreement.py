"""Where the ranks agree on the boundary they all park at: one key in the default process
group's store (a notice board, never a collective on the user's group).

[Note: claiming a boundary]
The key `ddpviz/debug/target` holds the last claim, "ID|STEP|KIND|REASON": every rank parks
(kind "pause", "trigger") or applies a new break set (kind "breaks", ID = the SetBreaks' request)
at the forward of STEP. A claim is made only on a rank's training thread at one of its safe
points of step s, and names STEP = s + 1; in DDP no rank can have passed the forward of s + 1
then (it needs this rank's all-reduces of step s, not launched yet; so claims wait for a step
whose backward all-reduces, never one under no_sync()), so every rank still reads the claim at
that forward: an armed rank reads the key at every forward (one store read a step).
compare_set makes the first claim win; a rank claims only while no claim is pending: its STEP
is behind the rank's step (at that step itself another rank may not have read it yet: a rank at
step s has all of step s-1's all-reduces, so every rank has passed the forward of s-1; a claim
made at STEP's own forward overwrote it unread, and that rank missed a break-set change), and
only once every rank is armed (`ddpviz/debug/armed` counts them), since
an unarmed rank does not read the key.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

_PREFIX = "ddpviz/debug"
_TARGET = f"{_PREFIX}/target"
_ARMED = f"{_PREFIX}/armed"
_ABSENT = "-"  # compare_set's answer for a missing key: the expected value, here never stored


class Claim(NamedTuple):
    """One claimed boundary (See [Note: claiming a boundary])."""

    id: str  # the command's request number, or "t<rank>.<step>" for a triggered break
    step: int
    kind: str  # "pause" | "trigger" | "breaks"
    reason: str
    raw: str  # the key's value as read, for compare_set

    @classmethod
    def parse(cls, raw: str) -> Claim | None:
        parts = raw.split("|", 3)
        if len(parts) != 4 or not parts[1].lstrip("-").isdigit():
            return None
        return cls(parts[0], int(parts[1]), parts[2], parts[3], raw)


class Board:
    """The claims key and the armed count of one job's default store."""

    def __init__(self, store: dist.Store | None = None) -> None:
        if store is None:
            from torch.distributed import distributed_c10d as c10d

            store = c10d._get_default_store()
        self.store = store

    def read(self) -> tuple[str, Claim | None]:
        """The key's raw value ("" when no claim was ever made) and its claim."""
        raw = _text(self.store.compare_set(_TARGET, _ABSENT, _ABSENT))
        if raw == _ABSENT:
            return "", None
        return raw, Claim.parse(raw)

    def claim(self, seen: str, claim_id: str, step: int, kind: str, reason: str) -> Claim | None:
        """Claim `step` unless the key changed since it read `seen`; the claim now in force."""
        value = f"{claim_id}|{step}|{kind}|{reason.replace('|', '/')[:1000]}"
        got = _text(self.store.compare_set(_TARGET, seen, value))
        if got == _ABSENT:  # torch's compare_set of a missing key with "" set it; never here
            return None
        return Claim.parse(got)

    def arm(self) -> int:
        """Count this rank as armed; how many are."""
        return int(self.store.add(_ARMED, 1))

    def armed(self) -> int:
        return int(self.store.add(_ARMED, 0))


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
