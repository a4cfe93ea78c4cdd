"""Bitwise digests of many tensors at once, on their own device (See [Note: replica digests]).

A tensor's digest is two int64 numbers over its raw bytes, read as integers of its element
size: the sum of the words and the sum of word x position (wrapping). Equal bytes give equal
digests on every rank; -0.0 vs 0.0 and two NaN payloads differ, and so does any single changed
word (the plain sum) or two swapped words (the weighted one). Beside it, three float64 numbers
per tensor (sum, sum of squares, max |x|) say how large a difference is.

The work is a handful of torch ops per dtype, whatever the number of tensors: the tensors are
concatenated (one C++ call), then segment sums via a cumulative sum. A tensor of 0 elements,
or one that is None or sparse, gets the digest NO_TENSOR.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NO_TENSOR = (0, -1)  # the digest of a missing (None), empty or sparse tensor
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def digest_tensors(tensors: Sequence[torch.Tensor | None], *, stats: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(int64 [n, 2] digests, float64 [n, 3] sum / sum of squares / max |x| or None), on the
    device of the tensors (CPU when there are none). Reads the tensors' current values; launch
    only (no host sync): copy the results to the host off the training thread."""
    n = len(tensors)
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    device = torch.device("cpu")
    for i, t in enumerate(tensors):
        if t is None or t.is_sparse or t.numel() == 0 or t.element_size() not in _INT_OF_SIZE:
            continue
        groups.setdefault((t.dtype, t.device), []).append(i)
        device = t.device
    digests = torch.empty((n, 2), dtype=torch.int64, device=device)
    digests[:, 0] = NO_TENSOR[0]
    digests[:, 1] = NO_TENSOR[1]
    out_stats = torch.zeros((n, 3), dtype=torch.float64, device=device) if stats else None
    with torch.no_grad():
        for (dtype, dev), members in groups.items():
            parts = [tensors[i].detach() for i in members]  # type: ignore[union-attr]
            flat = torch._utils._flatten_dense_tensors(parts)
            words = flat.view(_INT_OF_SIZE[flat.element_size()]).to(torch.int64)
            lengths = torch.tensor([p.numel() for p in parts], dtype=torch.int64)
            ends = torch.cumsum(lengths, 0).to(dev)
            starts = ends - lengths.to(dev)
            zero = torch.zeros(1, dtype=torch.int64, device=dev)
            plain = torch.cat([zero, torch.cumsum(words, 0)])
            position = torch.arange(1, words.numel() + 1, dtype=torch.int64, device=dev)
            weighted = torch.cat([zero, torch.cumsum(words * position, 0)])
            rows = torch.tensor(members, dtype=torch.int64, device=dev)
            digests = digests.to(dev)
            sums = plain[ends] - plain[starts]
            digests[rows, 0] = sums
            # positions from 1 within each tensor: a tensor's digest does not depend on which
            # other tensors were digested with it
            digests[rows, 1] = weighted[ends] - weighted[starts] - starts * sums
            if out_stats is not None and (dtype.is_floating_point or not dtype.is_complex):
                values = flat.to(torch.float64) if not dtype.is_complex else flat.abs().double()
                out_stats = out_stats.to(dev)
                seg = lengths.to(dev)
                out_stats[rows, 0] = torch.segment_reduce(values, "sum", lengths=seg, initial=0)
                out_stats[rows, 1] = torch.segment_reduce(values * values, "sum", lengths=seg,
                                                          initial=0)
                out_stats[rows, 2] = torch.segment_reduce(values.abs(), "max", lengths=seg,
                                                          initial=0)
    return digests, out_stats
