"""How a probe steps aside: it failed inside the job's own call (a hook, a wrapped method), so
it stops for good and says so once on stderr, and the job goes on as without it."""

from __future__ import annotations

import sys


def say(rank: int | None, what: str, exc: BaseException, lost: str) -> None:
    """Print that `what` failed with `exc` on `rank` (None: not known) and is stopped; `lost`:
    what ddpviz no longer sees because of it."""
    who = f"rank {rank}: " if rank is not None else ""
    print(f"ddpviz: {who}{what} failed ({exc!r}); ddpviz stops it ({lost}), the job goes on.",
          file=sys.stderr)
