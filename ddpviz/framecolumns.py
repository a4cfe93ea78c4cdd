"""Event frames of hot events decoded straight into columns, without an object per event.

(The decoder proper follows; until then every frame is decoded into objects by tracefile.py.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ddpviz.events import Event


class EventColumns(NamedTuple):
    """The events of one or more event frames as columns, in file order (see columns.py for
    what `a`, `b` and `s` hold per type)."""

    rank: np.ndarray  # int64
    kind: np.ndarray  # uint8: the caller's code of the event's type
    step: np.ndarray  # int64
    t: np.ndarray  # int64
    seq: np.ndarray  # int64
    a: np.ndarray  # int64
    b: np.ndarray  # int64
    s: np.ndarray  # int32: index into `strings`; -1 for none
    strings: tuple[str, ...]
    rare: dict[int, Event]  # row -> the event, for types not held in columns (a, b left 0)

    def __len__(self) -> int:
        return len(self.kind)


def decode_frames(buf: memoryview, frames: Sequence[tuple[int, int]],
                  codes: Mapping[type[Event], int]) -> list[EventColumns | None]:
    """Per frame ((start, length) of its payload in `buf`): its events as columns, or None
    where the frame is not one this decoder reads exactly as msgspec would (decode it so)."""
    return [None] * len(frames)
