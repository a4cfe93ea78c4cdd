"""What the installed torch's DDP has: version-specific tests run only where it has what they
use, and are skipped saying why otherwise."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from typing import Any

import torch

TORCH_DDP = torch.nn.parallel.DistributedDataParallel
TORCH_ARGS = frozenset(inspect.signature(TORCH_DDP.__init__).parameters)


# What torch 2.13, the main suite's release, lacks (torch_support.TESTED; 2.14 has the same
# arguments). Under NEWER_ONLY (`make test-torch-newest`, beside the main suite in CI) the cases
# that use none of it are skipped: the main suite ran them on 2.13 already.
NEWER_ARGS = frozenset({"lazy_bucket_allocation"})
NEWER_ONLY = "DDPVIZ_TEST_NEWER_ONLY"


def missing(kwargs: Iterable[tuple[str, Any]], manual: bool = False) -> str | None:
    """Why the installed torch cannot build a DDP with `kwargs` (and, with `manual`, finalize
    its backward by hand), or why the case is not run here (NEWER_ONLY); None: it runs."""
    kwargs = list(kwargs)
    if os.environ.get(NEWER_ONLY) == "1" and not manual \
            and not any(name in NEWER_ARGS for name, _ in kwargs):
        return f"{NEWER_ONLY}=1: torch 2.13 has what this case uses (the main suite runs it)"
    for name, _ in kwargs:
        if name not in TORCH_ARGS:
            return f"torch {torch.__version__} has no {name}"
    if manual and not hasattr(TORCH_DDP, "finalize_backward"):
        return f"torch {torch.__version__} has no finalize_backward()"
    return None
