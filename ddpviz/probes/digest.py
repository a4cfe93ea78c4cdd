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


class Snapshot:
    """The bytes of some tensors as of now: one flat copy per dtype and device (a leading 0
    word, then the tensors), taken on the training thread; `digest` reads only the copies, so
    on the CPU it runs on another thread while training goes on."""

    __slots__ = ("device", "groups", "n")

    def __init__(self, tensors: Sequence[torch.Tensor | None]) -> None:
        self.n = len(tensors)
        by: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        self.device = torch.device("cpu")
        for i, t in enumerate(tensors):
            if t is None or t.is_sparse or t.numel() == 0 or \
                    t.element_size() not in _INT_OF_SIZE:
                continue
            by.setdefault((t.dtype, t.device), []).append(i)
            self.device = t.device
        self.groups: list[tuple[list[int], torch.Tensor, tuple[torch.Tensor, ...],
                                list[int]]] = []
        with torch.no_grad():
            for (dtype, dev), members in by.items():
                parts = [tensors[i].detach() for i in members]  # type: ignore[union-attr]
                lengths = [p.numel() for p in parts]
                layout = _layout(tuple(lengths), tuple(members), dtype, dev)
                self.groups.append((members, torch._utils._flatten_dense_tensors(
                    [layout[0], *parts]), layout, lengths))

    def digest(self, *, stats: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(int64 [n, 2] digests, float64 [n, 2] norm and sum |x| (0 for integer tensors), or
        None), on the snapshot's device (launched there: no host sync)."""
        n, device = self.n, self.device
        whole = len(self.groups) == 1 and len(self.groups[0][0]) == n  # the usual case
        digests = None if whole else torch.tensor(NO_TENSOR, dtype=torch.int64,
                                                  device=device).repeat(n, 1)
        out_stats = None if whole or not stats else torch.zeros((n, 2), dtype=torch.float64,
                                                                device=device)
        with torch.no_grad():
            for members, flat, (_, bounds, sizes, rows), lengths in self.groups:
                # the words after a leading 0 word; tensor k is words (start_k, end_k]
                words = flat.view(_INT_OF_SIZE[flat.element_size()]).to(torch.int64)
                # sum_k = c1[end] - c1[start]; the sum of the running sums within tensor k,
                # (c2[end] - c2[start]) - len_k * c1[start], weighs each word by its distance
                # from the tensor's end: positions within the tensor, whatever else is
                # digested with it
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
                    if flat.dtype.is_floating_point:
                        parts = list(torch.split(flat[1:], lengths))
                        norms = torch.stack(
                            [torch.stack(torch._foreach_norm(parts)),
                             torch.stack(torch._foreach_norm(parts, 1))], 1).double()
                    else:
                        norms = torch.zeros((k, 2), dtype=torch.float64, device=flat.device)
                    if out_stats is None:
                        out_stats = norms
                    else:
                        out_stats[rows] = norms
        if digests is None:  # (no tensor at all)
            digests = torch.empty((0, 2), dtype=torch.int64)
        if stats and out_stats is None:
            out_stats = torch.empty((0, 2), dtype=torch.float64)
        return digests, out_stats


def digest_tensors(tensors: Sequence[torch.Tensor | None], *, stats: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(int64 [n, 2] digests, float64 [n, 2] norm and sum |x| (0 for integer tensors), or
    None) of the tensors' current values, on their device (CPU when there are none)."""
    return Snapshot(tensors).digest(stats=stats)
