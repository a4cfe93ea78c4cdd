"""A whole trace file read through `TailReader`, the reader of a followed folder (follow.py),
as the tests of every frame kind read it beside `Trace.load`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ddpviz.events import Event
from ddpviz.traces.fileformat import TailReader


def tail_read(reader: TailReader, path: Path) -> list[Any]:
    """What `reader` yields for all of `path` read at once (its records: lists of events,
    the header, ends), or the error it raises."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(reader.read(fd, os.path.getsize(path), 1 << 30))
    finally:
        os.close(fd)


def tailed_events(path: Path) -> list[Event]:
    """The events a fresh `TailReader` reads from `path`, in file order."""
    return [e for r in tail_read(TailReader(path), path) if isinstance(r, list) for e in r]
