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

    @property
    def findings(self) -> tuple[Any, ...]:
        """One `ddpviz.findings.Finding` per difference (kind, parameter, ranks, field)."""
        from ddpviz.diagnose import mismatch_findings

        return tuple(mismatch_findings(self.report.mismatches, self.report.world_size))


class RankHangError(RuntimeError):
    """Ranks stopped meeting each other: one never arrived, lags behind, runs other
    collectives, crashed, or failed. Raised on every rank that is still waiting, well before the
    process group's own timeout, naming the missing or lagging ranks and where each one was.

    `findings` holds the structured diagnosis (`ddpviz.findings.Finding`, kind "missing_rank",
    "rank_hang", "rank_exited" or "peer_failed"); `positions` maps each rank to where it was
    last seen (plain data: step, phase, collective, bucket, params), absent if it never said.
    """

    def __init__(self, message: str, findings: tuple[Any, ...] = (),
                 positions: dict[int, dict[str, Any]] | None = None) -> None:
        self.findings = tuple(findings)
        self.positions = dict(positions or {})
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.findings, self.positions))


class GradientGraphError(RuntimeError):
    """The autograd graph does not fit what DDP expects: a parameter's gradient hook fired twice
    in one iteration, or static_graph=True and the graph changed. `findings` says which
    parameter, on which rank, at which step."""

    def __init__(self, message: str, findings: tuple[Any, ...] = ()) -> None:
        self.findings = tuple(findings)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.findings))


class UnusedParametersError(RuntimeError):
    """Some parameters got no gradient in a backward that DDP had to reduce (with
    find_unused_parameters=False). Raised at the end of iteration 0 on every rank, and at the next
    forward later on; `findings` says, per parameter, which ranks gave it no gradient."""

    findings: tuple[Any, ...] = ()

