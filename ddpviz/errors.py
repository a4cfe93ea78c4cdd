"""Errors ddpviz raises for problems a user must fix (not internal invariants).

Each carries the structured facts behind its message, so that a notebook or a test can read
what went wrong without parsing text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddpviz.findings import Finding


class DiagnosisError(RuntimeError):
    """Base of every ddpviz error that carries a diagnosis: `findings` holds one
    `ddpviz.Finding` per problem (kind, severity, ranks, step, parameter, the fix), the same
    findings `ddpviz.diagnose` reports for the run. `except ddpviz.DiagnosisError as e` catches
    RankMismatchError, RankHangError, GradientGraphError and UnusedParametersError alike.

    A RuntimeError, like torch's own DDP errors, so existing `except RuntimeError` code keeps
    working.
    """

    findings: tuple[Finding, ...] = ()

    def __init__(self, message: str, findings: Iterable[Finding] = ()) -> None:
        self.findings = tuple(findings)
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle their args only; keep the findings across process boundaries.
        return (type(self), (str(self), self.findings))


class RankMismatchError(DiagnosisError):
    """The model differs across ranks; raised on every rank, with the same message everywhere.

    `findings` holds one finding per difference (kind, parameter, ranks, field); `report`, when
    raised by verification, the engine's `ModelComparison`: every difference and the metadata
    gathered from all ranks.
    """

    def __init__(self, message: str, findings: Iterable[Finding] = (), report: Any = None
                 ) -> None:
        super().__init__(message, findings)
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.findings, self.report))


class RankHangError(DiagnosisError):
    """Ranks stopped meeting each other: one never arrived, lags behind, runs other
    collectives, crashed, or failed. Raised on every rank that is still waiting, well before the
    process group's own timeout, naming the missing or lagging ranks and where each one was.

    `findings` holds the structured diagnosis (kind "missing_rank", "rank_hang", "rank_exited"
    or "peer_failed"); `positions` maps each rank to where it was last seen (plain data: step,
    phase, collective, bucket, params), absent if it never said.
    """

    def __init__(self, message: str, findings: Iterable[Finding] = (),
                 positions: dict[int, dict[str, Any]] | None = None) -> None:
        super().__init__(message, findings)
        self.positions = dict(positions or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.findings, self.positions))


class GradientGraphError(DiagnosisError):
    """The autograd graph does not fit what DDP expects: a parameter's gradient hook fired twice
    in one iteration, or static_graph=True and the graph changed. `findings` says which
    parameter, on which rank, at which step."""


# [Note: torch's sentences]
# Code and tests written against torch's DDP match on its error text ("Expected to have finished
# reduction in the prior iteration ..."), so ddpviz's errors for the same situations keep their
# own diagnosis first and then carry torch's text verbatim (reducer.cpp, torch 2.13), and stay
# RuntimeErrors.

TORCH_GRAPH_CHANGED = (
    "Your training graph has changed in this iteration, e.g., one parameter is unused in first "
    "iteration, but then got used in the second iteration. this is not compatible with "
    "static_graph set to True.")


def torch_unfinished_reduction(missing: dict[int, list[tuple[int, str]]], *,
                               find_unused_parameters: bool, static_graph: bool) -> str:
    """torch's text when a reduction of the prior iteration did not finish (see the Note);
    `missing` maps a rank to its (index, name) pairs without a gradient (torch names only its
    own rank; an error raised alike on every rank names each)."""
    import torch.distributed as dist

    base = ("Expected to have finished reduction in the prior iteration before starting a new "
            "one. ")
    outputs = "making sure all `forward` function outputs participate in calculating loss. "
    bug = ("\nIf you already have done the above, then the distributed data parallel module "
           "wasn't able to locate the output tensors in the return value of your module's "
           "`forward` function. Please include the loss function and the structure of the "
           "return value of `forward` of your module when reporting this issue (e.g. list, "
           "dict, iterable).")
    if static_graph:
        text = base + (
            "This error indicates that your training graph has changed in this iteration, "
            "e.g., one parameter is used in first iteration, but then got unused in the second "
            "iteration. this is not compatible with static_graph set to True.")
    elif not find_unused_parameters:
        text = base + (
            "This error indicates that your module has parameters that were not used in "
            "producing loss. You can enable unused parameter detection by passing the keyword "
            "argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`, and by \n") + outputs + bug
    else:
        text = base + (
            "This error indicates that your module has parameters that were not used in "
            "producing loss. Since `find_unused_parameters=True` is enabled, this likely  means "
            "that not all `forward` outputs participate in computing loss. You can fix this by "
            ) + outputs + bug
    try:
        debug_off = dist.get_debug_level() == dist.DebugLevel.OFF
    except (AttributeError, RuntimeError):
        debug_off = True
    for rank, params in sorted(missing.items()):
        if not debug_off:
            text += (f"\nParameters which did not receive grad for rank {rank}: "
                     + ", ".join(n for _, n in params))
        text += (f"\nParameter indices which did not receive grad for rank {rank}: "
                 + " ".join(str(i) for i, _ in params))
    if debug_off:
        text += ("\n In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG "
                 "to either INFO or DETAIL to print out information about which particular "
                 "parameters did not receive gradient on this rank as part of this error")
    return text


class UnusedParametersError(DiagnosisError):
    """Some parameters got no gradient in a backward that DDP had to reduce (with
    find_unused_parameters=False). Raised at the end of iteration 0 on every rank, and at the next
    forward later on; `findings` says, per parameter, which ranks gave it no gradient."""

