"""The viewer bounds a finding's per-tensor groups (`Finding.tensors`: rank spans) as Python
does: what msgspec and check_events accept, extension/src/limits.ts accepts; a span past the
rank bound, a backwards span or a malformed group is rejected by both."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.limits import MAX_WORLD_SIZE, LimitError, check_events
from tests.extension.mirror import run_typescript

GOOD: list[Any] = [
    [],
    [["fc.weight", [["norm 1", [[0, 0], [2, MAX_WORLD_SIZE - 1]]], ["norm 2", [[1, 1]]]]]],
]
BAD: list[Any] = [
    [["w", [["a", [[3, 1]]]]]],  # lo > hi
    [["w", [["a", [[0, MAX_WORLD_SIZE]]]]]],  # past the rank bound
    [["w", [["a", [[-1, 2]]]]]],
    [["w", [["a", [[0, 1, 2]]]]]],  # not a pair
    [["w", "a"]],
]


def python_accepts(tensors: Any) -> bool:
    finding = {"kind": "replicas_diverged", "severity": "error", "title": "t",
               "tensors": tensors}
    raw = msgspec.json.encode({"type": "FindingReported", "rank": 0, "step": 0, "t_ns": 1,
                               "seq": 0, "finding": finding})
    try:
        event = msgspec.json.decode(raw, type=ev.ANY_EVENT)
        check_events([event])
    except (msgspec.ValidationError, LimitError):
        return False
    return True


@pytest.mark.parametrize(("tensors", "ok"), [(t, True) for t in GOOD] + [(t, False) for t in BAD])
def test_the_viewer_bounds_tensor_groups_as_python_does(tensors: Any, ok: bool) -> None:
    assert python_accepts(tensors) is ok
    finding = {"kind": "replicas_diverged", "severity": "error", "title": "t",
               "tensors": tensors}
    out = run_typescript("limits.ts", "g.outOfLimits('FindingReported', cases)",
                         {"finding": finding})
    assert out == (None if ok else "FindingReported.finding")
