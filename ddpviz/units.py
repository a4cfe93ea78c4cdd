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


def human_duration(ns: float) -> str:
    """Nanoseconds for people: '2.35 s', '12.3 ms', '45 µs', '0 s'."""
    if ns < 0:
        return "-" + human_duration(-ns)
    s = ns / 1e9
    if s >= 1 or s == 0:
        return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
