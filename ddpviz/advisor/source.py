"""What the advisor reads: any run (ddpviz/traces/source.py says what counts as one), as one
Trace, and the error it raises for input it cannot use."""

from __future__ import annotations

from ddpviz.traces.fileformat import TraceError
from ddpviz.traces.source import SourceError, open_run
from ddpviz.traces.trace import Trace


class AdviceError(ValueError):
    """Input the advisor cannot use; the message says what was wrong and how to fix it."""


def as_trace(source: object) -> Trace:
    """The Trace behind `source` (a ddpviz.Run, Session, Trace, a `.ddpviz` path or folder, or
    events); what cannot be read raises AdviceError with the reason."""
    try:
        return open_run(source, refusal="advise() cannot read").as_trace()
    except (SourceError, OSError, TraceError) as e:
        raise AdviceError(str(e)) from None
