"""How ddpviz writes quantities for people, the same in the widgets, the static report, the
plan table and the CLI (extension/src/view.ts `humanBytes` mirrors `human_bytes`)."""

from __future__ import annotations

UNLIMITED = 2**62  # byte counts from here up are "no limit" (torch writes sys.maxsize)


def human_bytes(n: int) -> str:
    """Bytes in binary units, e.g. 1.0 MiB; sys.maxsize reads as 'unlimited'."""
    if n >= UNLIMITED:
        return "unlimited"
    x = float(n)
    for unit in ("B", "KiB", "MiB"):
        if x < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GiB"
