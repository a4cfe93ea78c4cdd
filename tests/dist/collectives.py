"""Record the collectives one process issues: op, dtype, numel, in issue order.

Both torch's C++ Reducer and a Python engine reach the process group through the same
dispatcher ops (`c10d::allreduce_`, `c10d::broadcast_`, ...): torch's `ProcessGroup::allreduce`
in C++ and `dist.all_reduce` in Python both call them. A TorchDispatchMode sees those calls with
their real tensors, on the issuing thread, in issue order, so one recorder observes torch's DDP
and ddpviz's engine identically. (The profiler was tried first: its `c10d::` events carry no
shapes, and its `gloo:*` events carry no dtype and start on gloo's worker threads, so two
collectives in flight can swap places.)

Limits: the mode is thread-local (collectives issued from threads the recording thread did not
start are not seen; CPU autograd runs hooks on the calling thread, so DDP's are), and what gloo
does inside one collective (e.g. a sparse all-reduce's internal exchanges) is one call here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The dispatcher namespaces of collectives: the process-group ops and the functional ones.
_NAMESPACES = frozenset({"c10d", "_c10d_functional"})
# Ops in those namespaces that move no data between ranks.
_NOT_COLLECTIVES = frozenset({"check_for_nan", "wait_tensor"})
# The schema argument that holds what a rank contributes, first match wins.
_INPUT_ARGS = ("tensors", "input_tensors", "input_list", "inputs", "input_tensor", "input",
               "tensor")


class Collective(NamedTuple):
    """One collective call as the issuing rank made it."""

    op: str  # dispatcher op without namespace and trailing "_": "allreduce", "broadcast", ...
    dtype: str  # "float32"; several input tensors of different dtypes: "float32,int64"
    numel: int  # elements contributed by this rank (all input tensors; dense size if sparse)
    sparse: bool  # an input was a sparse tensor
    n_tensors: int  # input tensors in the call (1 for everything DDP issues)

    def __str__(self) -> str:
        many = f" x{self.n_tensors}" if self.n_tensors != 1 else ""
        return f"{self.op} {self.dtype}[{self.numel}]{many}{' sparse' if self.sparse else ''}"


def _flatten(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)


def describe_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Collective | None:
    """The Collective for one dispatcher call, or None if it is not a collective."""
    schema = getattr(func, "_schema", None)  # higher-order operators have none
    if schema is None:
        return None
    namespace, _, name = schema.name.partition("::")
    if namespace not in _NAMESPACES or name in _NOT_COLLECTIVES:
        return None
    bound = {a.name: v for a, v in zip(schema.arguments, args, strict=False)}
    bound.update(kwargs)
    tensors: list[torch.Tensor] = []
    for arg in _INPUT_ARGS:
        if arg in bound:
            tensors = list(_flatten(bound[arg]))
            break
    dtypes: list[str] = []
    for t in tensors:
        d = str(t.dtype).removeprefix("torch.")
        if d not in dtypes:
            dtypes.append(d)
    return Collective(
        op=name.rstrip("_"),
        dtype=",".join(dtypes),
        numel=sum(t.numel() for t in tensors),
        sparse=any(t.is_sparse for t in tensors),
        n_tensors=len(tensors),
    )


class CollectiveRecorder(TorchDispatchMode):
    """Context manager: `with CollectiveRecorder() as rec: ...`; then `rec.calls`.

    `take()` returns the calls recorded since the previous `take()`, so phases (constructor,
    training) can be cut apart without nesting recorders.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Collective] = []
        self._taken = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        call = describe_call(func, args, kwargs)
        if call is not None:
            self.calls.append(call)
        return func(*args, **kwargs)

    def take(self) -> list[Collective]:
        """The calls since the last take() (or since the start)."""
        new = self.calls[self._taken:]
        self._taken = len(self.calls)
        return new


def first_difference(expected: list[Collective], actual: list[Collective],
                     names: tuple[str, str] = ("torch", "ddpviz")) -> str | None:
    """None if both sequences are equal, else a one-line description of the first difference."""
    for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
        if e != a:
            return f"collective #{i}: {names[0]} {e} vs {names[1]} {a}"
    if len(expected) != len(actual):
        n = min(len(expected), len(actual))
        longer, extra = (names[0], expected[n]) if len(expected) > n else (names[1], actual[n])
        return (f"{names[0]} issued {len(expected)} collectives, {names[1]} {len(actual)}; "
                f"the first extra one (#{n}, {longer}): {extra}")
    return None
