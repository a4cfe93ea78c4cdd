"""ddpviz: an interactive debugger for PyTorch DistributedDataParallel that lives in Jupyter."""

from ddpviz.diagnose import diagnose
from ddpviz.engine.buckets import (
    TensorSpec,
    compute_bucket_assignment_by_size,
    replay_bucket_assignment,
)
from ddpviz.engine.ddp import DistributedDataParallel
from ddpviz.errors import (
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
    "DistributedDataParallel",
    "Finding",
    "GradientGraphError",
    "LaunchError",
    "PostMortem",
    "RankError",
    "RankHangError",
    "RankMismatchError",
    "Run",
    "Session",
    "TensorSpec",
    "Trace",
    "UnusedParametersError",
    "VerificationReport",
    "Watch",
    "__version__",
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
