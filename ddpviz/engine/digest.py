"""Bitwise digests of many tensors at once, on their own device (See [Note: replica digests]).

A tensor's digest is two int64 numbers over its raw bytes, read as integers of its element
size: the sum of the words and the sum of word x position (wrapping). Equal bytes give equal
digests on every rank; -0.0 vs 0.0 and two NaN payloads differ, and so does any single changed
word (the plain sum) or two swapped words (the weighted one). Beside it, three float64 numbers
per tensor (norm, sum |x|: the 2- and 1-norms, which the inf-norm would cost 4x more than) say
how large a difference is.

The work is a handful of torch ops per dtype, whatever the number of tensors: the tensors are
concatenated (one C++ call), then segment sums via a cumulative sum. A tensor of 0 elements,
or one that is None or sparse, gets the digest NO_TENSOR.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

NO_TENSOR = (0, -1)  # the digest of a missing (None), empty or sparse tensor
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_LAYOUTS: dict[tuple[Any, ...], tuple[torch.Tensor, ...]] = {}  # see _layout
_MAX_LAYOUTS = 16


def _layout(lengths: tuple[int, ...], members: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> tuple[torch.Tensor, ...]:
    """(a zero of `dtype`, bounds: starts then ends, lengths, rows) of one group of tensors,
    kept: the same tensors are digested again at every check, and building these is most of a
    small model's cost."""
    key = (lengths, members, dtype, device)
    got = _LAYOUTS.get(key)
    if got is None:
        sizes = torch.tensor(lengths, dtype=torch.int64)
        ends = sizes.cumsum(0)
        got = (torch.zeros(1, dtype=dtype, device=device),
               torch.cat([ends - sizes, ends]).to(device), sizes.to(device),
               torch.tensor(members, dtype=torch.int64, device=device))
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = got
    return got


def digest_tensors(tensors: Sequence[torch.Tensor | None], *, stats: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(int64 [n, 2] digests, float64 [n, 2] norm and sum |x| (0 for integer tensors), or
    None), on the device of the tensors (CPU when there are none). Reads the tensors' current
    values; launch only (no host sync): copy the results to the host off the training
    thread."""
    n = len(tensors)
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    device = torch.device("cpu")
    for i, t in enumerate(tensors):
        if t is None or t.is_sparse or t.numel() == 0 or t.element_size() not in _INT_OF_SIZE:
            continue
        groups.setdefault((t.dtype, t.device), []).append(i)
        device = t.device
    whole = len(groups) == 1 and len(next(iter(groups.values()))) == n  # the usual case
    digests = None if whole else torch.tensor(NO_TENSOR, dtype=torch.int64,
                                              device=device).repeat(n, 1)
    out_stats = None if whole or not stats else torch.zeros((n, 2), dtype=torch.float64,
                                                            device=device)
    with torch.no_grad():
        for (dtype, dev), members in groups.items():
            parts = [tensors[i].detach() for i in members]  # type: ignore[union-attr]
            zero, bounds, sizes, rows = _layout(tuple(p.numel() for p in parts),
                                                tuple(members), dtype, dev)
            # the words after a leading 0 word; tensor k is words (start_k, end_k]
            flat = torch._utils._flatten_dense_tensors([zero, *parts])
            words = flat.view(_INT_OF_SIZE[flat.element_size()]).to(torch.int64)
            # sum_k = c1[end] - c1[start]; the sum of the running sums within tensor k,
            # (c2[end] - c2[start]) - len_k * c1[start], weighs each word by its distance from
            # the tensor's end: positions within the tensor, whatever else is digested with it
            c1 = torch.cumsum(words, 0)  # (int64 wraps: a hash, the same on every rank)
            c2 = torch.cumsum(c1, 0)
            k = len(members)
            at1 = c1.index_select(0, bounds)
            at2 = c2.index_select(0, bounds)
            seg = torch.stack([at1[k:] - at1[:k],
                               at2[k:] - at2[:k] - sizes * at1[:k]], 1)
            if digests is None:
                digests = seg
            else:
                digests[rows] = seg
            if stats:
                sizes = torch.zeros((k, 2), dtype=torch.float64, device=dev) \
                    if not dtype.is_floating_point else torch.stack(
                        [torch.stack(torch._foreach_norm(parts)),
                         torch.stack(torch._foreach_norm(parts, 1))], 1).double()
                if out_stats is None:
                    out_stats = sizes
                else:
                    out_stats[rows] = sizes
    if digests is None:  # (no tensor at all)
        digests = torch.empty((0, 2), dtype=torch.int64)
    if stats and out_stats is None:
        out_stats = torch.empty((0, 2), dtype=torch.float64)
    return digests, out_stats
