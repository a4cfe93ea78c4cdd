"""ddpviz: an interactive debugger for PyTorch DistributedDataParallel that lives in Jupyter."""

from ddpviz.engine.buckets import (
    TensorSpec,
    compute_bucket_assignment_by_size,
    replay_bucket_assignment,
)
from ddpviz.plan import BucketPlan, bucket_plan

__version__ = "0.1.0"

__all__ = [
    "BucketPlan",
    "TensorSpec",
    "__version__",
    "bucket_plan",
    "compute_bucket_assignment_by_size",
    "replay_bucket_assignment",
]
