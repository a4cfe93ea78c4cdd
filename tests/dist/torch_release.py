"""What the installed torch's DDP has: version-specific tests run only where it has what they
use, and are skipped saying why otherwise."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

TORCH_DDP = torch.nn.parallel.DistributedDataParallel
TORCH_ARGS = frozenset(inspect.signature(TORCH_DDP.__init__).parameters)


def missing(kwargs: Iterable[tuple[str, Any]], manual: bool = False) -> str | None:
    """Why the installed torch cannot build a DDP with `kwargs` (and, with `manual`, finalize
    its backward by hand); None: it can."""
    for name, _ in kwargs:
        if name not in TORCH_ARGS:
            return f"torch {torch.__version__} has no {name}"
    if manual and not hasattr(TORCH_DDP, "finalize_backward"):
        return f"torch {torch.__version__} has no finalize_backward()"
    return None
