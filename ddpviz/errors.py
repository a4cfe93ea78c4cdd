"""Errors ddpviz raises for problems a user must fix (not internal invariants).

Each carries the structured facts behind its message, so that a notebook or a test can read
what went wrong without parsing text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpviz.engine.verify import VerificationReport


class RankMismatchError(RuntimeError):
    """The model differs across ranks; raised on every rank, with the same message everywhere.

    A RuntimeError, like torch's own verification errors, so existing `except RuntimeError`
    code keeps working. `report` holds every difference and the metadata gathered from all ranks.
    """

    def __init__(self, report: VerificationReport, message: str | None = None) -> None:
        self.report = report
        super().__init__(message if message is not None else report.message())

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their args only; keep the report when crossing process boundaries.
        return (type(self), (self.report, str(self)))
