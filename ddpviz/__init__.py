"""ddpviz: an interactive debugger for PyTorch DistributedDataParallel that lives in Jupyter."""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpviz.advise import advise
    from ddpviz.diagnose import diagnose
    from ddpviz.engine.buckets import (
        TensorSpec,
        compute_bucket_assignment_by_size,
        replay_bucket_assignment,
    )
    from ddpviz.engine.ddp import DistributedDataParallel
    from ddpviz.engine.detail import Recording
    from ddpviz.errors import (
        DiagnosisError,
        GradientGraphError,
        RankHangError,
        RankMismatchError,
        UnusedParametersError,
    )
    from ddpviz.findings import Finding
    from ddpviz.launcher import LaunchError, RankError, Run, launch
    from ddpviz.plan import BucketPlan, bucket_plan
    from ddpviz.postmortem import PostMortem, postmortem
    from ddpviz.preflight import VerificationReport, preflight, verify_across_ranks
    from ddpviz.session import Session, connect, listen
    from ddpviz.trace import Trace
    from ddpviz.watch import Watch, watch

# Public name -> the module that owns it. Names load on first use (PEP 562), so `import ddpviz`
# or `import ddpviz.engine.buckets` does not load zmq, cloudpickle, ipywidgets or plotly; the
# block above tells type checkers the same names. tests/test_public_api.py keeps the three
# lists in step.
_WHERE = {
    "advise": "ddpviz.advise",
    "BucketPlan": "ddpviz.plan",
    "DiagnosisError": "ddpviz.errors",
    "DistributedDataParallel": "ddpviz.engine.ddp",
    "Finding": "ddpviz.findings",
    "GradientGraphError": "ddpviz.errors",
    "LaunchError": "ddpviz.launcher",
    "PostMortem": "ddpviz.postmortem",
    "RankError": "ddpviz.launcher",
    "RankHangError": "ddpviz.errors",
    "RankMismatchError": "ddpviz.errors",
    "Recording": "ddpviz.engine.detail",
    "Run": "ddpviz.launcher",
    "Session": "ddpviz.session",
    "TensorSpec": "ddpviz.engine.buckets",
    "Trace": "ddpviz.trace",
    "UnusedParametersError": "ddpviz.errors",
    "VerificationReport": "ddpviz.preflight",
    "Watch": "ddpviz.watch",
    "bucket_plan": "ddpviz.plan",
    "compute_bucket_assignment_by_size": "ddpviz.engine.buckets",
    "connect": "ddpviz.session",
    "diagnose": "ddpviz.diagnose",
    "launch": "ddpviz.launcher",
    "listen": "ddpviz.session",
    "postmortem": "ddpviz.postmortem",
    "preflight": "ddpviz.preflight",
    "replay_bucket_assignment": "ddpviz.engine.buckets",
    "verify_across_ranks": "ddpviz.preflight",
    "watch": "ddpviz.watch",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ddpviz' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


class _Package(types.ModuleType):
    """ddpviz itself. Loading a submodule binds it to its package's attribute; for the five
    whose name is also a public function (watch, diagnose, preflight, postmortem, advise) the
    function keeps the name, as when this package imported everything eagerly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by name, like any module (cloudpickle dispatches on the exact ModuleType, so
        # a function that uses `ddpviz` could not be sent to launch()'s ranks otherwise).
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Package


__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext ddpviz` registers the %%ddp magic (IPython is imported only then)."""
    from ddpviz.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from ddpviz.magic import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "BucketPlan",
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
    "TensorSpec",
    "Trace",
    "UnusedParametersError",
    "VerificationReport",
    "Watch",
    "__version__",
    "advise",
    "bucket_plan",
    "compute_bucket_assignment_by_size",
    "connect",
    "diagnose",
    "launch",
    "listen",
    "postmortem",
    "preflight",
    "replay_bucket_assignment",
    "verify_across_ranks",
    "watch",
]
