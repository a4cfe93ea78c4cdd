"""Build the parameters DDP reduces and the buffers it syncs: walk-through step 1.

Mirrors torch 2.13's `_build_params_for_reducer`: named_modules() x
named_parameters(recurse=False), requires_grad only, the ignore list applied, shared
parameters kept once (first occurrence), sparse flags only from Embedding/EmbeddingBag with
sparse=True. Buffers: named_buffers() minus the ignore list.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamEntry:
    """One parameter of the reducer, at its position in DDP's list."""

    index: int  # position in the reducer's parameter list (bucket maps use it)
    name: str  # dotted name of its first occurrence, e.g. "encoder.0.weight"
    param: nn.Parameter
    sparse_grad: bool  # produced by Embedding/EmbeddingBag(sparse=True)


def parameters_to_ignore(module: nn.Module) -> set[str]:
    """The names DDP skips: `module._ddp_params_and_buffers_to_ignore`."""
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def _dotted(module_name: str, param_name: str) -> str:
    return f"{module_name}.{param_name}" if module_name else param_name


def build_params_for_reducer(
    module: nn.Module, ignore: set[str] | None = None
) -> list[ParamEntry]:
    """Parameters in the order DDP registers them with the reducer.

    Raises:
        ValueError: no parameter requires a gradient (torch raises RuntimeError there).
    """
    ignore = parameters_to_ignore(module) if ignore is None else ignore
    # torch matches the ignore list against f"{module_name}.{param_name}", which for the root
    # module's own parameters is ".weight": a root-level name in the list is never ignored by
    # the reducer (it is by the requires-grad check and by buffer sync). Mirrored on purpose.
    if not any(p.requires_grad for n, p in module.named_parameters() if n not in ignore):
        raise ValueError(
            "ddpviz: DistributedDataParallel is not needed when a module doesn't have any "
            f"parameter that requires a gradient ({type(module).__name__} has "
            f"{sum(1 for _ in module.parameters())} parameters, none trainable and not ignored)."
            " Set requires_grad=True on the parameters to train, or do not wrap this module."
        )
    entries: list[ParamEntry] = []
    seen: set[int] = set()
    for module_name, sub in module.named_modules():
        sparse = isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and bool(sub.sparse)
        for param_name, param in sub.named_parameters(recurse=False):
            if not param.requires_grad or f"{module_name}.{param_name}" in ignore:
                continue
            if id(param) in seen:
                continue
            seen.add(id(param))
            entries.append(ParamEntry(len(entries), _dotted(module_name, param_name), param,
                                      sparse))
    for e in entries:
        if isinstance(e.param, nn.parameter.UninitializedParameter):
            raise ValueError(
                f"ddpviz: parameter {e.index} '{e.name}' is uninitialized (lazy module); run a "
                "dry forward pass to initialize it before wrapping the module in DDP."
            )
    return entries


def build_buffers(
    module: nn.Module, ignore: set[str] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """Buffers DDP broadcasts from rank 0 (at construction and, by default, every forward)."""
    ignore = parameters_to_ignore(module) if ignore is None else ignore
    return [(n, b) for n, b in module.named_buffers() if n not in ignore]
