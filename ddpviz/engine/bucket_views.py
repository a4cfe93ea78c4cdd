"""Bucket buffers and the views into them (walk-through step 4's memory layout): one flat
buffer per bucket, a view per parameter laid out like the parameter (torch's bucket views,
anticipating AccumulateGrad's gradient layout contract), and the layout helpers the reducer
uses to copy gradients in and results out. Split out of engine/reducer.py, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ddpviz.engine import failure_texts as texts


def is_alias_of(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch._C._is_alias_of(a, b))  # type: ignore[attr-defined]


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """c10's is_non_overlapping_and_dense: some permutation of the dims is contiguous."""
    sizes, strides = t.shape, t.stride()
    if t.dim() == 1:
        return sizes[0] < 2 or strides[0] == 1
    order = sorted(range(t.dim()), key=lambda d: (sizes[d] < 2, strides[d]))
    expected = 1
    for d in order:
        if sizes[d] < 2:
            return True
        if strides[d] != expected:
            return False
        expected *= sizes[d]
    return True


def layout_view(flat: torch.Tensor, param: torch.Tensor, offset: int) -> torch.Tensor:
    """A view of `flat` at `offset` laid out like `param` (its strides when dense), as torch's
    bucket views are, anticipating AccumulateGrad's gradient layout contract."""
    if non_overlapping_and_dense(param):
        return flat.as_strided(param.size(), param.stride(), offset)
    return flat.narrow(0, offset, param.numel()).view(param.size())


def clone_obey_contract(src: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    if non_overlapping_and_dense(param):
        return torch.empty_strided(param.size(), param.stride(), dtype=src.dtype,
                                   device=src.device).copy_(src)
    return src.clone(memory_format=torch.contiguous_format)


@dataclass(eq=False)
class Bucket:
    """One bucket: its parameters and the flat buffer their gradients are reduced in."""

    variables: list[int]  # parameter indices, in bucket order
    params: list[torch.Tensor]
    sparse: bool  # a single parameter with a sparse gradient; `gradients` is that gradient
    limit: int  # the size limit the assignment gave it (bytes; 0 for sparse)
    gradients: torch.Tensor  # flat buffer (dense), or the sparse gradient once ready
    offsets: list[int] = field(default_factory=list)  # in elements
    lengths: list[int] = field(default_factory=list)
    sizes: list[torch.Size] = field(default_factory=list)
    views_in: list[torch.Tensor] = field(default_factory=list)  # where gradients are copied in
    views_out: list[torch.Tensor] = field(default_factory=list)  # where results are read out
    pending: int = 0
    future: torch.futures.Future | None = None
    skipped: bool = False  # skip_all_reduce_unused_params: not reduced this iteration
    deferred: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # batched_grad_copy

    @property
    def nbytes(self) -> int:
        flat = self.gradients._values() if self.gradients.is_sparse else self.gradients
        return flat.numel() * flat.element_size()


def make_bucket(b: int, indices: list[int], limit: int, params_all: Sequence[torch.Tensor],
                names: Sequence[str], sparse_flags: Sequence[bool], *,
                dtype: torch.dtype | None, gradient_as_bucket_view: bool) -> Bucket:
    """Bucket `b` holding parameters `indices` (bucket order): its flat buffer (in `dtype`, else
    the parameters' dtype) and views; with gradient_as_bucket_view, gradients that already
    exist move into the new views (a rebuild)."""
    params: list[torch.Tensor] = [params_all[i] for i in indices]
    if any(sparse_flags[i] for i in indices):
        if len(indices) != 1:
            raise ValueError(texts.sparse_bucket_shared(b))
        p = params[0]
        return Bucket(list(indices), params, True, limit,
                      torch.empty(0, dtype=p.dtype, device=p.device))
    first = params[0]
    for i, p in zip(indices, params, strict=True):
        if p.dtype != first.dtype or p.device != first.device:
            raise ValueError(texts.bucket_mixes_dtypes(b, first, i, names[i], p))
    offsets, lengths, offset = [], [], 0
    for p in params:
        offsets.append(offset)
        lengths.append(p.numel())
        offset += p.numel()
    flat = torch.empty(offset, dtype=dtype or first.dtype, device=first.device)
    bucket = Bucket(list(indices), params, False, limit, flat, offsets, lengths,
                    [p.size() for p in params])
    bucket.views_in = [layout_view(flat, p, o) for p, o in zip(params, offsets, strict=True)]
    bucket.views_out = list(bucket.views_in)
    if gradient_as_bucket_view:
        # A rebuild moves gradients that already exist into the new buckets; at
        # construction grads stay undefined (globally unused ones must remain None).
        _adopt_grads(params, bucket.views_in)
    return bucket


def _adopt_grads(params: Sequence[torch.Tensor], views: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, view in zip(params, views, strict=True):
            if p.grad is not None and not is_alias_of(p.grad, view) and \
                    p.grad.dtype == view.dtype:
                view.copy_(p.grad)
                p.grad = view


def allocate(bucket: Bucket, *, adopt_grads: bool) -> None:
    """lazy_bucket_allocation (torch 2.15): a new flat buffer and views for `bucket`, made when
    its first gradient of a backward is ready. With gradient_as_bucket_view (`adopt_grads`),
    every gradient that exists at that moment moves into its new view, as on a rebuild: the
    gradient that triggered the allocation, gradients of the bucket accumulated before it and,
    with kept gradients (zero_grad(set_to_none=False)), all the others. Those are then bucket
    views when marked ready and are divided in place (a true division), while gradients that
    arrive later as new tensors are multiplied by 1/world_size while copied in: the last bit
    differs at world size 3, so this order is torch's (measured bitwise on torch 2.15.0)."""
    old = bucket.gradients
    flat = torch.empty(sum(bucket.lengths), dtype=old.dtype, device=old.device)
    bucket.gradients = flat
    bucket.views_in = [layout_view(flat, p, o)
                       for p, o in zip(bucket.params, bucket.offsets, strict=True)]
    bucket.views_out = list(bucket.views_in)
    if adopt_grads:
        _adopt_grads(bucket.params, bucket.views_in)


def release(bucket: Bucket) -> None:
    """lazy_bucket_allocation: drop the reducer's hold on the bucket's storage after backward
    (gradients that are bucket views keep theirs alive)."""
    bucket.gradients = bucket.gradients.new_empty(0)
    bucket.views_in = []
    bucket.views_out = []
