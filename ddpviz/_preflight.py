"""Checks to run before DDP (ddpviz's own, or torch's): every rank arrives, the model is the
same everywhere, and its initial values agree.

`preflight` is the engine's verification (walk-through step 2) behind a store-based meeting
with a timeout, plus a checksum comparison of every parameter's values: differing values are
harmless under DDP (rank 0's are broadcast) but usually mean a missing `torch.manual_seed`, so
they are a warning. It raises on every rank; `check=False` returns the report instead
(subprocess.run's idiom). Use it before wrapping a model in
`torch.nn.parallel.DistributedDataParallel`, which checks less and hangs or crashes where this
names the difference.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from ddpviz.engine import verify
from ddpviz.engine.initial_values import initial_value_findings
from ddpviz.engine.verify import mismatch_findings
from ddpviz.errors import RankMismatchError
from ddpviz.events import FindingReported, Tap, default_emitter
from ddpviz.findings import DiagnosisWarning, Finding, format_findings
from ddpviz.probes.rendezvous import rendezvous
from ddpviz.probes.watchdog import resolve_hang_timeout


@dataclass(frozen=True)
class VerificationReport:
    """What `preflight` found; the same on every rank.

    `ok` is False when any finding is an error (the model differs); warnings (initial values)
    leave it True. `verification` is the engine's ModelComparison with every rank's metadata.
    """

    world_size: int
    findings: tuple[Finding, ...]
    verification: verify.ModelComparison

    @property
    def ok(self) -> bool:
        """Whether every rank has the same model (no finding is an error; differing initial
        values are only warnings and leave it True)."""
        return not any(f.severity == "error" for f in self.findings)

    @property
    def mismatches(self) -> tuple[Finding, ...]:
        """The error findings, where the model differs across ranks (what `check=True`
        raises)."""
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """The findings that are not errors, e.g. parameters whose initial values differ (DDP's
        broadcast from rank 0 overwrites them)."""
        return tuple(f for f in self.findings if f.severity != "error")

    def __str__(self) -> str:
        if self.ok and not self.findings:
            return self.verification.message()
        parts = []
        if not self.ok:
            parts.append(self.verification.message())
        if self.warnings:
            parts.append(format_findings(self.warnings, self.world_size))
        return "\n".join(parts)

    def raise_if_failed(self) -> None:
        """Raise `RankMismatchError` (on every rank, same message) when the model differs."""
        if not self.ok:
            raise RankMismatchError(str(self), self.mismatches, report=self.verification)


def preflight(module: nn.Module, process_group: dist.ProcessGroup | None = None, *,
              timeout: float | None = None, check: bool = True, ignore: set[str] | None = None,
              tap: Tap | None = None) -> VerificationReport:
    """Check that every rank holds the same model (collective: call it on every rank), before
    `torch.nn.parallel.DistributedDataParallel(module)`: catches what torch does not check
    (dtypes, names, registration order, requires_grad, buffers) or reports badly (a count
    without names, one rank erroring while the others hang), without hanging.

    First every rank checks in through the store (a rank that never calls this is named after
    `timeout` seconds instead of hanging the others), then the engine's verification compares
    names, registration order, shapes, strides, dtypes, devices, requires_grad and buffers, and
    if all agree, the parameters' values are compared by checksum.

    Args:
        module: the model about to be wrapped.
        process_group: the group (default group if None).
        timeout: seconds to wait for the other ranks (default: ddpviz's hang timeout,
            $DDPVIZ_HANG_TIMEOUT, else 0.6 x the process group's timeout, at most 300 s).
        check: True (default) raises on a mismatch and warns on differing initial values;
            False returns the report for the caller to read (`report.ok`, `report.findings`),
            as `subprocess.run(check=False)` does.
        ignore: names to skip (default: `module._ddp_params_and_buffers_to_ignore`).
        tap: receives the verification events and a FindingReported per finding (default:
            the process's default emitter, so a launched rank reports to the notebook).

    Returns:
        A `VerificationReport` (`.ok`, `.findings`, `str()`), the same on every rank.

    Raises:
        RankMismatchError: with check=True, on every rank, with the same message, when the
            model differs.
        RankHangError: on every rank that arrived, when some rank never called preflight
            (also with check=False: there is no report to return).
    Warns:
        DiagnosisWarning: with check=True, initial values differ (usually a missing seed).
    """
    if tap is None:  # report to the notebook when launched (ddpviz.launch, ddpviz.connect)
        group = dist.group.WORLD if process_group is None else process_group
        tap = Tap(default_emitter(), rank=group.rank() if group is not None else 0)
    wait = resolve_hang_timeout(timeout, process_group)
    if wait is not None:
        rendezvous("verify", process_group, timeout=wait, what="preflight")
    compared = verify.verify_module_across_ranks(module, process_group, ignore=ignore, tap=tap,
                                                 raise_on_mismatch=False)
    findings: tuple[Finding, ...] = tuple(mismatch_findings(compared.mismatches,
                                                            compared.world_size))
    if compared.ok:
        findings += initial_value_findings(module, process_group, ignore=ignore)
    if tap is not None and tap.enabled:
        for f in findings:
            tap.emit(FindingReported, f)
    report = VerificationReport(compared.world_size, findings, compared)
    if check:
        report.raise_if_failed()
        for f in report.warnings:
            warnings.warn(f.text(), DiagnosisWarning, stacklevel=2)
    return report


def verify_across_ranks(module: nn.Module, process_group: dist.ProcessGroup | None = None, *,
                        timeout: float | None = None, ignore: set[str] | None = None,
                        tap: Tap | None = None) -> VerificationReport:
    """Deprecated: `preflight(module, ..., check=False)` (ddpviz's top level warns on access)."""
    return preflight(module, process_group, timeout=timeout, check=False, ignore=ignore, tap=tap)
