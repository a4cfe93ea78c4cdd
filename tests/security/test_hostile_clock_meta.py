"""Per-rank trace files whose metadata carries absurd wall/monotonic clocks: merging them
ignores those clocks with a note (the file stays unaligned) instead of making the dashboard
overflow (issue 23)."""

from __future__ import annotations

import pytest

from ddpviz import events as ev
from ddpviz.traces.trace import Trace

REAL = {"wall_ns": 1_700_000_000_000_000_000, "mono_ns": 5_000_000_000}


def _rank_file(rank: int, **clock: int) -> Trace:
    t = Trace(meta={"rank": rank, "boot": f"host{rank}", **clock})
    t.extend([ev.GradReady(rank, 0, 1000 + s, s, 0, 0) for s in range(5)])
    return t


@pytest.mark.parametrize("clock", [
    {"wall_ns": 10**30, "mono_ns": -10**30},
    {"wall_ns": 2**63 - 1, "mono_ns": 0},
    {"wall_ns": 0, "mono_ns": 2**62},
])
def test_absurd_clocks_in_a_merged_files_meta_are_ignored_with_a_note(clock: dict[str, int]
                                                                      ) -> None:
    with pytest.warns(UserWarning, match="ignoring the clocks in a merged file's metadata"):
        merged = Trace.merge([_rank_file(0, **REAL), _rank_file(1, **clock)])
    assert merged.clock[1] == (0, -1)
    assert len(merged) == 10
    merged.dashboard()  # used to raise OverflowError


def test_plausible_clocks_still_align() -> None:
    later = {"wall_ns": REAL["wall_ns"] + 7_000, "mono_ns": REAL["mono_ns"]}
    merged = Trace.merge([_rank_file(0, **REAL), _rank_file(1, **later)])
    assert merged.clock[1] == (7_000, -1)
