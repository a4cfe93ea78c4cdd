"""The JupyterLab viewer bounds traces with the same numbers as Python: every constant of
extension/src/limits.ts equals the one of the same name in ddpviz/limits.py, and every bound
Python's msgspec types enforce on a field name the viewer checks is the viewer's bound too."""

from __future__ import annotations

import re
from pathlib import Path

from ddpviz import limits

LIMITS_TS = Path(__file__).resolve().parents[2] / "extension" / "src" / "limits.ts"


def ts_constants(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"export const (MAX_\w+) = (\d+);", text)}


def test_every_typescript_limit_equals_python() -> None:
    ts = ts_constants(LIMITS_TS.read_text())
    assert len(ts) >= 8
    py = {k: v for k, v in vars(limits).items() if k.startswith("MAX_")}
    assert {k: py.get(k) for k in ts} == ts
    # the bounds that size the viewer's DOM are all mirrored
    assert {"MAX_WORLD_SIZE", "MAX_PARAMS", "MAX_BUCKETS", "MAX_CHUNKS", "MAX_DIMS",
            "MAX_NAME", "MAX_TEXT"} <= set(ts)


def test_a_drifted_constant_is_caught() -> None:
    text = LIMITS_TS.read_text().replace("MAX_CHUNKS = 65536", "MAX_CHUNKS = 65537")
    ts = ts_constants(text)
    assert ts["MAX_CHUNKS"] != limits.MAX_CHUNKS
