"""What the installed torch's DDP has: the twin accepts a constructor argument or offers a
method only where torch's own DistributedDataParallel does (torch 2.15 added
`lazy_bucket_allocation=` and manual backward finalization), and otherwise fails in torch's own
words, as torch would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

_TORCH_DDP = torch.nn.parallel.DistributedDataParallel
#: frozenset[str]: the constructor arguments of the installed torch's DDP
TORCH_DDP_ARGUMENTS = frozenset(inspect.signature(_TORCH_DDP.__init__).parameters)


def has_method(name: str) -> bool:
    """Whether the installed torch's DDP has the method or property `name`."""
    return hasattr(_TORCH_DDP, name)


def check_argument(name: str, given: object) -> None:
    """Raise torch's own TypeError when `name` was passed (not None) and the installed torch's
    DDP has no such argument."""
    if given is not None and name not in TORCH_DDP_ARGUMENTS:
        raise TypeError(f"DistributedDataParallel.__init__() got an unexpected keyword argument "
                        f"'{name}' (torch {torch.__version__} has no {name}; it is new in "
                        "torch 2.15)")


def missing_attribute(name: str) -> AttributeError:
    """torch's own AttributeError for a DDP method the installed torch does not have."""
    return AttributeError(f"'DistributedDataParallel' object has no attribute '{name}' (torch "
                          f"{torch.__version__} has no {name}; it is new in torch 2.15)")


class since_torch_215:
    """A DDP method that exists only where the installed torch's DDP has it: elsewhere, reading
    it raises torch's own AttributeError (so `hasattr` says False, as on torch's DDP)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if not has_method(self.name):
            raise missing_attribute(self.name)
        return self.fn if obj is None else self.fn.__get__(obj, owner)
