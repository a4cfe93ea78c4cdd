"""ddpviz: an interactive debugger for PyTorch DistributedDataParallel that lives in Jupyter."""

import importlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpviz._diagnose.diagnosis import diagnose
    from ddpviz._postmortem import PostMortem, postmortem
    from ddpviz._preflight import VerificationReport, preflight
    from ddpviz._watch import Watch, watch
    from ddpviz.advisor import advise
    from ddpviz.ddp import DistributedDataParallel
    from ddpviz.errors import (
        DiagnosisError,
        GradientGraphError,
        RankHangError,
        RankMismatchError,
        UnusedParametersError,
    )
    from ddpviz.findings import Finding
    from ddpviz.launcher import LaunchError, RankError, Run, launch
    from ddpviz.plan import bucket_plan
    from ddpviz.recording import Recording
    from ddpviz.session.connect import connect
    from ddpviz.session.live import Session, listen
    from ddpviz.traces.trace import Trace

# Public name -> the module that owns it: what a user calls in the first hour, what those calls
# return, and the errors they raise. Names load on first use (PEP 562), so `import ddpviz` or
# `import ddpviz.engine.buckets` does not load torch, zmq, cloudpickle, ipywidgets or plotly; the
# block above tells type checkers the same names. tests/test_public_api.py keeps the three lists
# in step. A module that owns a public function of its own name is private (`_diagnose`,
# `_preflight`, `_postmortem`) or named apart (`advisor`): importing a submodule binds it to the
# package's attribute of that name, which would replace the function.
_WHERE = {
    "DiagnosisError": "ddpviz.errors",
    "DistributedDataParallel": "ddpviz.ddp",
    "Finding": "ddpviz.findings",
    "GradientGraphError": "ddpviz.errors",
    "LaunchError": "ddpviz.launcher",
    "PostMortem": "ddpviz._postmortem",
    "RankError": "ddpviz.launcher",
    "RankHangError": "ddpviz.errors",
    "RankMismatchError": "ddpviz.errors",
    "Recording": "ddpviz.recording",
    "Run": "ddpviz.launcher",
    "Session": "ddpviz.session.live",
    "Trace": "ddpviz.traces.trace",
    "UnusedParametersError": "ddpviz.errors",
    "VerificationReport": "ddpviz._preflight",
    "Watch": "ddpviz._watch",
    "advise": "ddpviz.advisor",
    "bucket_plan": "ddpviz.plan",
    "connect": "ddpviz.session.connect",
    "diagnose": "ddpviz._diagnose.diagnosis",
    "launch": "ddpviz.launcher",
    "listen": "ddpviz.session.live",
    "postmortem": "ddpviz._postmortem",
    "preflight": "ddpviz._preflight",
    "watch": "ddpviz._watch",
}

# Names that left the top level: old name -> (owner, name there, the spelling to use now).
# They still resolve, with a DeprecationWarning naming the new spelling; not in __all__ or dir().
_MOVED = {
    "BucketPlan": ("ddpviz.plan", "BucketPlan", "ddpviz.plan.BucketPlan"),
    "TensorSpec": ("ddpviz.plan", "TensorSpec", "ddpviz.plan.TensorSpec"),
    "compute_bucket_assignment_by_size": ("ddpviz.plan", "compute_bucket_assignment_by_size",
                                          "ddpviz.plan.compute_bucket_assignment_by_size"),
    "replay_bucket_assignment": ("ddpviz.plan", "replay_bucket_assignment",
                                 "ddpviz.plan.replay_bucket_assignment"),
    "verify_across_ranks": ("ddpviz._preflight", "verify_across_ranks",
                            "ddpviz.preflight(module, ..., check=False)"),
}

def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is not None:
        value = getattr(_load(where), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    moved = _MOVED.get(name)
    if moved is not None:
        owner, attr, spelling = moved
        warnings.warn(f"ddpviz.{name} is deprecated: use {spelling}", DeprecationWarning,
                      stacklevel=2)
        return getattr(_load(owner), attr)  # not cached: warn every time
    # Public submodules load on first use too, so `import ddpviz` stays the one import:
    # `ddpviz.plan.TensorSpec`, `ddpviz.advisor.measure(pg)`.
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return _load(f"{__name__}.{name}")
    raise AttributeError(f"module 'ddpviz' has no attribute {name!r}")


def _load(module: str) -> Any:
    """Import `module` whole: a kernel interrupt that lands inside it is held until the import
    is done. The first `ddpviz.launch` imports msgspec, zmq, numpy and asyncio; an import cut
    by KeyboardInterrupt half-way leaves a C extension loaded without its package (the next
    import of msgspec then crashed the process, numpy refuses to load twice) or a package
    missing names (asyncio), so one early interrupt broke the kernel for good."""
    from ddpviz.interrupts import interrupts_deferred

    with interrupts_deferred():
        return importlib.import_module(module)


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})




__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext ddpviz` registers the %%ddp magic (IPython is imported only then)."""
    from ddpviz.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from ddpviz.magic import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "DiagnosisError",
    "DistributedDataParallel",
    "Finding",
    "GradientGraphError",
    "LaunchError",
    "PostMortem",
    "RankError",
    "RankHangError",
    "RankMismatchError",
    "Recording",
    "Run",
    "Session",
    "Trace",
    "UnusedParametersError",
    "VerificationReport",
    "Watch",
    "__version__",
    "advise",
    "bucket_plan",
    "connect",
    "diagnose",
    "launch",
    "listen",
    "postmortem",
    "preflight",
    "watch",
]
