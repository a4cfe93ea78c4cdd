"""Bitwise digests of many tensors at once, on their own device (See [Note: replica digests]).

A tensor's digest is two int64 numbers over its raw bytes, read as integers of its element
size: the sum of the words and the sum of word x position (wrapping). Equal bytes give equal
digests on every rank; -0.0 vs 0.0 and two NaN payloads differ, and so does any single changed
word (the plain sum) or two swapped words (the weighted one). Beside it, three float64 numbers
per tensor (sum, sum of squares; non-finite values left out) say how large a difference is.

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


def _layout(lengths: tuple[int, ...], members: tuple[int, ...], device: torch.device
            ) -> tuple[torch.Tensor, ...]:
    """(starts, ends, positions 0..n-1, rows) of one group of tensors, kept: the same tensors
    are digested again at every check, and building these is most of a small model's cost."""
    key = (lengths, members, device)
    got = _LAYOUTS.get(key)
    if got is None:
        ends = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
        starts = ends - torch.tensor(lengths, dtype=torch.int64)
        got = (starts.to(device), ends.to(device),
               torch.arange(int(ends[-1]), dtype=torch.int64, device=device),
               torch.tensor(members, dtype=torch.int64, device=device))
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = got
    return got


def digest_tensors(tensors: Sequence[torch.Tensor | None], *, stats: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(int64 [n, 2] digests, float64 [n, 2] sum and sum of squares, or None), on the device
    of the tensors (CPU when there are none). Reads the tensors' current values; launch only
    (no host sync): copy the results to the host off the training thread."""
    n = len(tensors)
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    device = torch.device("cpu")
    for i, t in enumerate(tensors):
        if t is None or t.is_sparse or t.numel() == 0 or t.element_size() not in _INT_OF_SIZE:
            continue
        groups.setdefault((t.dtype, t.device), []).append(i)
        device = t.device
    digests = torch.tensor(NO_TENSOR, dtype=torch.int64, device=device).repeat(n, 1)
    out_stats = torch.zeros((n, 2), dtype=torch.float64, device=device) if stats else None
    with torch.no_grad():
        for (dtype, dev), members in groups.items():
            parts = [tensors[i].detach() for i in members]  # type: ignore[union-attr]
            starts, ends, position, rows = _layout(tuple(p.numel() for p in parts),
                                                   tuple(members), dev)
            flat = torch._utils._flatten_dense_tensors(parts)
            words = flat.view(_INT_OF_SIZE[flat.element_size()]).to(torch.int64)
            # prefix sums of the words and of word x position, with a leading 0 (wrapping)
            prefix = torch.zeros((2, words.numel() + 1), dtype=torch.int64, device=dev)
            torch.cumsum(torch.stack([words, words * position]), 1, out=prefix[:, 1:])
            seg = prefix[:, ends] - prefix[:, starts]
            # positions from 0 within each tensor: a tensor's digest does not depend on which
            # other tensors were digested with it
            seg[1] -= starts * seg[0]
            digests[rows] = seg.T
            if out_stats is not None and not dtype.is_complex:
                values = torch.nan_to_num(flat.to(torch.float64), nan=0.0, posinf=0.0,
                                          neginf=0.0)  # (a NaN would spoil later tensors' sums)
                fprefix = torch.zeros((2, words.numel() + 1), dtype=torch.float64, device=dev)
                torch.cumsum(torch.stack([values, values * values]), 1, out=fprefix[:, 1:])
                out_stats[rows] = (fprefix[:, ends] - fprefix[:, starts]).T
    return digests, out_stats
