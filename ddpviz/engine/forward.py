"""The forward side of DDP (walk-through step 5): finding the tensors in a module's output,
walking the autograd graph from them to see which parameters can get a gradient, and the sink
node that outputs pass through when DDP needs a hook at the very start of backward.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields, is_dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def find_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside an output: lists, tuples, dict values, dataclass fields (torch's
    `_find_tensors`, minus RPC references)."""
    if isinstance(obj, torch.Tensor):
        return iter([obj])
    if isinstance(obj, (list, tuple)):
        return itertools.chain.from_iterable(map(find_tensors, obj))
    if isinstance(obj, dict):
        return itertools.chain.from_iterable(map(find_tensors, obj.values()))
    if is_dataclass(obj) and not isinstance(obj, type):
        return itertools.chain.from_iterable(
            find_tensors(getattr(obj, f.name)) for f in fields(obj))
    return iter(())


def reachable_nodes(outputs: Iterable[torch.Tensor]) -> set[Any]:
    """All autograd nodes reachable from the outputs' grad_fns (the outputs' own excluded, as in
    torch's search: only nodes met along an edge are recorded)."""
    seen: set[Any] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        for nxt, _ in fn.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def unused_parameters(outputs: Iterable[torch.Tensor], grad_accumulators: list[Any]) -> list[int]:
    """Indices of parameters whose gradient accumulator is not in the graph of `outputs`.

    Args:
        outputs: the tensors the forward returned.
        grad_accumulators: each parameter's AccumulateGrad node, by parameter index.
    """
    seen = reachable_nodes(outputs)
    return [i for i, acc in enumerate(grad_accumulators) if acc not in seen]


class _DDPSink(torch.autograd.Function):
    """Identity on the outputs whose backward runs first; it lets DDP act at backward start
    and lets outputs left out of the loss deliver an undefined gradient (torch's _DDPSink)."""

    @staticmethod
    def forward(ctx: Any, on_backward: Any, clone: bool, *inputs: Any) -> Any:
        ctx.set_materialize_grads(False)
        ctx.on_backward = on_backward
        if clone:
            return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        callback = ctx.on_backward()
        if callback is not None:
            callback()
        return (None, None, *grads)


def pass_through_sink(output: Any, on_backward: Callable[[], None] | None,
                      clone: bool = True) -> Any:
    """Route every tensor of `output` that has a grad_fn through one sink node.

    Args:
        output: whatever the wrapped module returned.
        on_backward: called when the sink's backward runs (held weakly; None: nothing).
        clone: clone the outputs (torch's default, so an in-place edit of the loss works).
    """
    flat, spec = tree_flatten(output)
    placeholders: list[Any] = [t if not (isinstance(t, torch.Tensor) and t.grad_fn is not None)
                               else None for t in flat]
    ref: Callable[[], Any]
    if on_backward is not None and hasattr(on_backward, "__self__"):
        ref = weakref.WeakMethod(on_backward)
    else:
        ref = lambda: on_backward  # noqa: E731
    routed = _DDPSink.apply(ref, clone, *flat)
    for i, p in enumerate(placeholders):
        if p is None:
            placeholders[i] = routed[i]
    return tree_unflatten(placeholders, spec)
