"""What the advisor reads: a Run, a Session, a Trace or a .ddpviz path, as one Trace."""

from __future__ import annotations

import os
from pathlib import Path

from ddpviz.traces.trace import Trace


class AdviceError(ValueError):
    """Input the advisor cannot use; the message says what was wrong and how to fix it."""


def as_trace(source: object) -> Trace:
    """The Trace behind `source` (a ddpviz.Run, Session, Trace, or a path to a trace file)."""
    from ddpviz.traces.trace import TraceError

    if isinstance(source, Trace):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise AdviceError(f"ddpviz: no trace file {str(path)!r}.\nPass the path of a "
                              ".ddpviz file saved by Trace.save, `ddpviz record` or a Session.")
        try:
            return Trace.load(path)
        except (OSError, TraceError) as e:
            raise AdviceError(str(e)) from None
    trace = getattr(source, "trace", None)  # Run and Session both expose .trace
    if isinstance(trace, Trace):
        return trace
    raise AdviceError(
        f"ddpviz: advise() cannot read a {type(source).__name__}.\nPass a ddpviz.Run, a "
        "Session, a Trace or the path of a .ddpviz trace of one recorded run.")
