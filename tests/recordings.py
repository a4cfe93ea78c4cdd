"""The recording each of the tests' short labels stands for: result keys and test ids keep the
old level names, the calls pass `recording=` (the old `detail=` spellings are deprecated; their
DeprecationWarning is pinned in tests/test_recording.py and tests/dist/test_detail_levels.py)."""

from __future__ import annotations

from ddpviz.recording import EVERY, Recording

_LABELS = {"light": (False, EVERY), "steps": (False, None), "sampled": (True, EVERY),
           "full": (True, 1), "params": (True, 1), "buckets": (True, None)}


def recording(label: str) -> Recording:
    """`"light"`, `"sampled:3"`, ... as the Recording it names (`":N"`: every=N)."""
    name, _, every = label.partition(":")
    guard, default = _LABELS[name]
    return Recording(guard=guard, every=int(every) if every else default)
