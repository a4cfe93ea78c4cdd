"""Bucket assignment by size: walk-through step 4, exactly as torch 2.13's C++ does it.

Owns `compute_bucket_assignment_by_size` (a Python twin of
`torch.distributed._compute_bucket_assignment_by_size`, which is only the tests' oracle) and
`replay_bucket_assignment`, which returns the same result together with every decision taken on
the way, so that a notebook can show *why* a parameter landed in its bucket; the byte limits
torch derives from the user's settings (`BucketCapacity`, `Limits`); and the two maps DDP builds
from them (`initial_buckets`, `rebuilt_buckets`).

See [Note: partly filled buckets] for the one non-obvious part.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

# Bucket assignment works on descriptions (TensorSpec: sizes, dtype and device by name), so
# planning a recorded run's maps (the dashboard, the advisor) needs no torch; torch is imported
# only where real tensors are passed in (_as_spec).

# [Note: partly filled buckets]
# torch keeps one accumulating bucket per (dtype, device) key in a std::unordered_map and, after
# the walk, emits the partly filled ones in that map's iteration order. Only when no
# tensor_indices are given is the result then sorted by smallest index; on the rebuild path
# (tensor_indices given) the hash-table order is what DDP uses. libstdc++ keeps all nodes in one
# singly linked list: a key whose hash bucket is empty goes to the front of the list, otherwise
# it goes in front of the first node of its hash bucket; a rehash re-inserts every node, in list
# order, by the same rule. Bucket counts grow 1 -> 13 -> 29 -> 59 ... (measured with g++ 12).
# The key hash is c10::hash_combine(std::hash<Device>, ScalarType), with
# std::hash<Device> = (device_type << 16) | uint8(device_index).

_MASK64 = (1 << 64) - 1

# (size at which the table grows, new bucket count): libstdc++'s _Prime_rehash_policy with
# max_load_factor 1.0, read off std::unordered_map growth.
_LIBSTDCXX_GROWTH: tuple[tuple[int, int], ...] = (
    (1, 13), (14, 29), (30, 59), (60, 127), (128, 257), (258, 541), (542, 1109), (1110, 2357),
    (2358, 5087), (5088, 10273), (10274, 20753), (20754, 42043), (42044, 85229),
)

# c10::ScalarType enum values (torch/headeronly/core/ScalarType.h).
_SCALAR_TYPE_NAMES = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32",
    "complex64", "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2",
    "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2",
    "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "uint16", "uint32", "uint64",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7", "float8_e8m0fnu", "float4_e2m1fn_x2",
)
SCALAR_TYPE: dict[str, int] = {name: i for i, name in enumerate(_SCALAR_TYPE_NAMES)}

# c10::DeviceType enum values (torch/headeronly/core/DeviceType.h).
DEVICE_TYPE: dict[str, int] = {
    name: i
    for i, name in enumerate(
        ("cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip", "fpga", "maia", "xla",
         "vulkan", "metal", "xpu", "mps", "meta", "hpu", "ve", "lazy", "ipu", "mtia",
         "privateuseone")
    )
}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor described by what bucketing needs: enough to plan for a model that exists only as
    shapes (meta device, or a description from another machine). dtype and device are torch's
    objects or their names ("float32", "cuda:0"), which is all a recorded trace holds."""

    numel: int
    element_size: int
    dtype: torch.dtype | str
    device: torch.device | str

    @staticmethod
    def of(tensor: torch.Tensor) -> TensorSpec:
        """The spec of a real tensor (any device, meta included: nothing is read).

        Args:
            tensor: a dense tensor, usually a parameter.

        Returns:
            Its `numel()`, `element_size()`, dtype and device.
        """
        return TensorSpec(tensor.numel(), tensor.element_size(), tensor.dtype, tensor.device)

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes (`numel * element_size`), what it fills of a bucket."""
        return self.numel * self.element_size


class CloseReason(enum.Enum):
    """Why a bucket was emitted."""

    SPARSE = "sparse"  # a sparse-gradient tensor always gets a bucket of its own (limit 0)
    LIMIT_REACHED = "limit reached"  # the bucket's bytes reached its key's current limit
    LEFTOVER = "leftover"  # still partly filled when the walk ended


class AssignStep(NamedTuple):
    """One tensor's trip through the assignment, in input order."""

    position: int  # position in the input list
    tensor_index: int  # the index reported in buckets (tensor_indices[position] or position)
    key: tuple[str, str]  # (dtype, device) the tensor is bucketed by; ("sparse", device) if sparse
    nbytes: int  # numel * element_size
    bucket_bytes: int  # bytes in its bucket after adding it
    limit: int  # the limit in force for its key when it was added (0 for sparse)
    limit_position: int  # which entry of bucket_size_limits that was (-1 for sparse)
    closed: CloseReason | None  # set when this tensor closed (emitted) its bucket


class EmittedBucket(NamedTuple):
    """A bucket as it left the walk, before any sorting."""

    indices: tuple[int, ...]  # tensor indices, in the order they joined
    limit: int  # the size limit recorded for it (0 for sparse)
    reason: CloseReason


class BucketAssignment(NamedTuple):
    """Result of `replay_bucket_assignment`: torch's answer plus how it was reached."""

    bucket_indices: list[list[int]]  # torch's first return value
    per_bucket_size_limits: list[int]  # torch's second return value
    steps: list[AssignStep]  # one per input tensor, in input order
    emitted: list[EmittedBucket]  # in emission order (closed buckets, then leftovers)
    sorted_by_min_index: bool  # True when no tensor_indices were given (result then sorted)


def _as_spec(t: Any, position: int) -> TensorSpec:
    if isinstance(t, TensorSpec):
        return t
    import torch

    if isinstance(t, torch.Tensor):
        if t.is_sparse or t.layout != torch.strided:
            raise ValueError(
                f"ddpviz: tensor {position} has layout {t.layout}; bucket assignment has no "
                "support for sparse tensors (torch: 'No support for sparse tensors.'). Pass the "
                "dense parameter and mark it in expect_sparse_gradient instead."
            )
        return TensorSpec.of(t)
    raise TypeError(
        f"ddpviz: tensor {position} is a {type(t).__name__}; expected a torch.Tensor or a "
        "ddpviz TensorSpec(numel, element_size, dtype, device)."
    )


def _device(device: torch.device | str) -> tuple[str, str, int]:
    """(name, type, index) of a device or its name: 'cuda:1' -> ('cuda:1', 'cuda', 1); the
    index is -1 when not given (torch.device's index None)."""
    name = str(device)
    kind, sep, index = name.partition(":")
    if not kind or (sep and not index.isdigit()):
        raise ValueError(f"ddpviz: {name!r} is not a device; expected e.g. 'cpu' or 'cuda:0'.")
    return name, kind, int(index) if sep else -1


def key_hash(dtype: torch.dtype | str, device: torch.device | str) -> int:
    """c10::hash<BucketKey>: hash_combine(std::hash<Device>, ScalarType), in 64-bit arithmetic."""
    _, kind, index = _device(device)
    try:
        scalar_type = SCALAR_TYPE[_dtype_name(dtype)]
        device_type = DEVICE_TYPE[kind]
    except KeyError as e:
        raise ValueError(f"ddpviz: no c10 enum value known for {e.args[0]!r}") from None
    seed = (device_type << 16) | (index & 0xFF)
    return (seed ^ ((scalar_type + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _MASK64)) & _MASK64


class _UnorderedMapOrder:
    """The iteration order of libstdc++'s std::unordered_map with unique keys, insertions only.

    See [Note: partly filled buckets]."""

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self._hash: dict[Any, int] = {}
        self._n_buckets = 1

    def __contains__(self, key: Any) -> bool:
        return key in self._hash

    def _place(self, key: Any) -> None:
        b = self._hash[key] % self._n_buckets
        for pos, other in enumerate(self.keys):
            if self._hash[other] % self._n_buckets == b:
                self.keys.insert(pos, key)
                return
        self.keys.insert(0, key)

    def insert(self, key: Any, hash_code: int) -> None:
        self._hash[key] = hash_code
        size = len(self.keys) + 1
        for at_size, n_buckets in _LIBSTDCXX_GROWTH:
            if at_size == size:
                old, self.keys, self._n_buckets = self.keys, [], n_buckets
                for k in old:
                    self._place(k)
                break
        self._place(key)


def replay_bucket_assignment(
    tensors: Sequence[torch.Tensor | TensorSpec],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
    tensor_indices: Sequence[int] = (),
) -> BucketAssignment:
    """Assign tensors to buckets exactly as torch 2.13 does, recording every decision.

    Args:
        tensors: parameters (or `TensorSpec` objects) in the order to walk them.
        bucket_size_limits: byte limits; each (dtype, device) key walks this list on its own and
            the last entry repeats.
        expect_sparse_gradient: empty, or one flag per tensor, indexed by tensor index.
        tensor_indices: empty, or the index to report for each tensor (the rebuild path, where
            tensors come in gradient-ready order); then the result is not sorted.

    Returns:
        A `BucketAssignment`; its first two fields equal torch's return value.
    """
    specs = [_as_spec(t, i) for i, t in enumerate(tensors)]
    limits = [int(x) for x in bucket_size_limits]
    flags = [bool(f) for f in expect_sparse_gradient]
    indices = [int(i) for i in tensor_indices]
    _check_inputs(len(specs), limits, flags, indices)

    steps: list[AssignStep] = []
    emitted: list[EmittedBucket] = []
    order = _UnorderedMapOrder()
    # per (dtype, device) key, by name: [indices, bytes, limit position, last limit, key]
    open_buckets: dict[tuple[str, str], list[Any]] = {}
    last_pos = len(limits) - 1

    for position, spec in enumerate(specs):
        index = indices[position] if indices else position
        device = _device(spec.device)[0]
        nbytes = spec.numel * spec.element_size
        if flags and flags[index]:
            emitted.append(EmittedBucket((index,), 0, CloseReason.SPARSE))
            steps.append(AssignStep(position, index, ("sparse", device), nbytes,
                                    nbytes, 0, -1, CloseReason.SPARSE))
            continue
        key = (_dtype_name(spec.dtype), device)
        state = open_buckets.get(key)
        if state is None:
            order.insert(key, key_hash(*key))
            state = open_buckets[key] = [[], 0, 0, 0, key]
        state[0].append(index)
        bucket_bytes = state[1] = state[1] + nbytes
        pos = state[2]
        limit = state[3] = limits[pos]
        closed = None
        if bucket_bytes >= limit:
            closed = CloseReason.LIMIT_REACHED
            emitted.append(EmittedBucket(tuple(state[0]), limit, closed))
            state[0], state[1] = [], 0
            state[2] = min(pos + 1, last_pos)
        steps.append(AssignStep(position, index, state[4], nbytes, bucket_bytes, limit, pos,
                                closed))

    for key in order.keys:
        state = open_buckets[key]
        if state[0]:
            emitted.append(EmittedBucket(tuple(state[0]), state[3], CloseReason.LEFTOVER))

    result = list(emitted)
    if not indices:
        result.sort(key=lambda b: min(b.indices))
    return BucketAssignment(
        bucket_indices=[list(b.indices) for b in result],
        per_bucket_size_limits=[b.limit for b in result],
        steps=steps,
        emitted=emitted,
        sorted_by_min_index=not indices,
    )


def compute_bucket_assignment_by_size(
    tensors: Sequence[torch.Tensor | TensorSpec],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
    tensor_indices: Sequence[int] = (),
) -> tuple[list[list[int]], list[int]]:
    """Python twin of `torch.distributed._compute_bucket_assignment_by_size` (torch 2.13).

    Returns `(bucket_indices, per_bucket_size_limits)`, identical to torch's for every input torch
    accepts; where torch asserts or crashes, raises `ValueError` naming the problem. Tensors may be
    real tensors (any device, meta included) or `TensorSpec` objects. See `replay_bucket_assignment`
    for a step-by-step account.

    Args:
        tensors, bucket_size_limits, expect_sparse_gradient, tensor_indices: as for
            `replay_bucket_assignment`.

    Returns:
        `(bucket_indices, per_bucket_size_limits)`, as torch returns them.

    Raises:
        ValueError: where torch asserts or crashes (the message names the problem).
    """
    a = replay_bucket_assignment(tensors, bucket_size_limits, expect_sparse_gradient,
                                 tensor_indices)
    return a.bucket_indices, a.per_bucket_size_limits


def _check_inputs(n: int, limits: list[int], flags: list[bool], indices: list[int]) -> None:
    if n == 0:
        raise ValueError("ddpviz: no tensors to assign to buckets; pass at least one tensor "
                         "(torch hits an internal assert here).")
    if not limits:
        raise ValueError("ddpviz: bucket_size_limits is empty; pass at least one byte limit, "
                         "e.g. [25 * 1024 * 1024] (torch crashes here).")
    bad = [x for x in limits if x < 0 or x > _MASK64]
    if bad:
        raise ValueError(f"ddpviz: bucket size limits must be in [0, 2**64); got {bad[0]}.")
    if indices and len(indices) != n:
        raise ValueError(f"ddpviz: tensor_indices has {len(indices)} entries for {n} tensors; "
                         "give one index per tensor or none.")
    if flags and len(flags) != n:
        raise ValueError(f"ddpviz: expect_sparse_gradient has {len(flags)} flags for {n} "
                         "tensors; give one flag per tensor or none (torch hits an internal "
                         "assert here).")
    if flags and indices:
        out = [i for i in indices if not 0 <= i < n]
        if out:
            raise ValueError(f"ddpviz: tensor index {out[0]} is out of range for {n} sparse "
                             "flags; indices must lie in [0, len(tensors)).")


def _dtype_name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def bucket_keys(specs: Iterable[TensorSpec]) -> list[tuple[str, str]]:
    """Distinct (dtype, device) keys by name, in first-seen order (each key walks the limits on
    its own)."""
    seen: dict[tuple[str, str], None] = {}
    for s in specs:
        seen.setdefault((_dtype_name(s.dtype), _device(s.device)[0]), None)
    return list(seen)


# --- the byte limits --------------------------------------------------------------------------
# Which byte caps torch 2.13 uses for the initial map and for the rebuild. The rules (see
# ddp-facts.md, "Bucket size limits"):
# - bucket_cap_mb=None (default) and find_unused off, or static_graph: one bucket per
#   dtype/device at first ([sys.maxsize]); rebuilt in gradient-ready order with [1 MiB, 25 MiB].
# - find_unused on (not static): [first, cap] in registration order, never rebuilt.
# - an explicit bucket_cap_mb=X makes the first cap X too (no 1 MiB bucket).
# - bucket_cap_mb_list: these limits for both the initial and the rebuilt map; cap = max.

DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
MB = 1024 * 1024


class Limits(NamedTuple):
    """The limits for each of the two assignments DDP makes."""

    initial: list[int]  # passed to the constructor's assignment (registration order)
    rebuild: list[int] | None  # used by the rebuild (gradient-ready order); None: no rebuild
    set_last_bucket_cap: bool  # DDP_SET_LAST_BUCKET_CAP=1: the small bucket goes last


@dataclass(frozen=True)
class BucketCapacity:
    """torch 2.13's `_BucketCapacityConfig`: byte caps derived from the user's settings."""

    bucket_bytes_cap: int
    per_bucket_bytes_caps: tuple[int, ...]
    first_bucket_bytes_cap: int

    @staticmethod
    def create(bucket_cap_mb: float | None = None,
               bucket_cap_mb_list: list[float] | None = None) -> BucketCapacity:
        if bucket_cap_mb is not None and bucket_cap_mb < 0:
            raise ValueError(f"ddpviz: bucket_cap_mb must be >= 0, got {bucket_cap_mb}.")
        if bucket_cap_mb_list is not None and any(c < 0 for c in bucket_cap_mb_list):
            raise ValueError(f"ddpviz: bucket_cap_mb_list entries must be >= 0, got "
                             f"{list(bucket_cap_mb_list)}.")
        default = bucket_cap_mb is None
        cap_mb: float = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        per_bucket: tuple[int, ...] = ()
        if bucket_cap_mb_list:
            per_bucket = tuple(int(c * MB) for c in bucket_cap_mb_list)
            cap_mb = max(bucket_cap_mb_list)
            default = False
        cap = int(cap_mb * MB)
        return BucketCapacity(cap, per_bucket, DEFAULT_FIRST_BUCKET_BYTES if default else cap)

    def limits(self, *, find_unused_parameters: bool, static_graph: bool,
               env: Mapping[str, str] | None = None) -> Limits:
        """The initial and rebuild limits for these settings."""
        source = os.environ if env is None else env
        rebuilds = static_graph or not find_unused_parameters
        set_last = source.get("DDP_SET_LAST_BUCKET_CAP", "N/A") == "1"
        if self.per_bucket_bytes_caps:
            caps = list(self.per_bucket_bytes_caps)
            return Limits(caps, caps if rebuilds else None, set_last)
        if rebuilds:
            initial = [sys.maxsize]
        elif self.first_bucket_bytes_cap < self.bucket_bytes_cap:
            initial = [self.first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            initial = [self.bucket_bytes_cap]
        rebuild = [self.first_bucket_bytes_cap, self.bucket_bytes_cap] if rebuilds else None
        return Limits(initial, rebuild, set_last)


# --- the two maps DDP builds -------------------------------------------------------------------


def initial_buckets(
    tensors: Sequence[torch.Tensor | TensorSpec],
    limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
) -> tuple[BucketAssignment, list[list[int]], list[int]]:
    """The constructor's map in reduction order: torch reverses the assignment because gradients
    become ready roughly in reverse registration order. Returns (replay, buckets, limits)."""
    a = replay_bucket_assignment(tensors, limits, expect_sparse_gradient)
    return a, a.bucket_indices[::-1], a.per_bucket_size_limits[::-1]


def rebuilt_buckets(
    tensors: Sequence[torch.Tensor | TensorSpec],
    grad_ready_order: Sequence[int],
    limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] = (),
    set_last_bucket_cap: bool = False,
) -> tuple[BucketAssignment, list[list[int]], list[int]]:
    """The rebuild's map: tensors walked in gradient-ready order with their indices given (so the
    result is not sorted). With DDP_SET_LAST_BUCKET_CAP=1 the walk runs on the reversed order and
    the result is reversed back, putting the small bucket last. Returns (replay, buckets, limits).
    """
    order = list(grad_ready_order)
    if sorted(order) != list(range(len(tensors))):
        raise ValueError(
            f"ddpviz: the gradient-ready order must name each of the {len(tensors)} parameters "
            f"exactly once; got {len(order)} entries"
            + (f", missing {sorted(set(range(len(tensors))) - set(order))[:10]}" if
               len(set(order)) < len(tensors) else "") + "."
        )
    if set_last_bucket_cap:
        order.reverse()
    a = replay_bucket_assignment([tensors[i] for i in order], limits, expect_sparse_gradient,
                                 order)
    buckets, caps = a.bucket_indices, a.per_bucket_size_limits
    if set_last_bucket_cap:
        buckets, caps = buckets[::-1], caps[::-1]
    return a, buckets, caps
