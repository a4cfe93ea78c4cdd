"""Coalesced state broadcast: walk-through step 3, and DDP's per-forward buffer sync.

Behaves like torch's `dist._broadcast_coalesced(process_group, tensors, buffer_size, src)`
(c10d comm.cpp): tensors are grouped into chunks by the bucket assignment with one limit,
`compute_bucket_assignment_by_size(tensors, [chunk_bytes])` (see `chunk_indices`), each chunk is
flattened and broadcast from `src` with at most 2 in flight, and every receiving rank copies the
result back into its tensors.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.events import (
    BroadcastChunkDone,
    BroadcastChunkSent,
    BroadcastFinished,
    BroadcastStarted,
    Tap,
)

# torch keeps at most this many broadcasts in flight, to bound the memory of flat copies.
MAX_IN_FLIGHT = 2


def chunk_indices(tensors: list[torch.Tensor], chunk_bytes: int) -> list[list[int]]:
    """`compute_bucket_assignment_by_size(tensors, [chunk_bytes])[0]`, lean enough for every
    forward's buffer sync: per (dtype, device) a chunk closes once it holds chunk_bytes or more
    (its last tensor may overflow it), and chunks are ordered by their first tensor. That sort
    makes the hash-table order of partly filled buckets (buckets.py's Note) irrelevant here."""
    closed: list[list[int]] = []
    filling: dict[tuple[torch.dtype, torch.device], tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        members, size = filling.get(key, ([], 0))
        members.append(i)
        size += t.numel() * t.element_size()
        if size >= chunk_bytes:
            closed.append(members)
            filling.pop(key, None)
        else:
            filling[key] = (members, size)
    chunks = closed + [members for members, _ in filling.values()]
    chunks.sort(key=lambda c: c[0])
    return chunks


class _Chunk:
    """One flattened chunk on its way: launched on creation, copied back by `finish`."""

    __slots__ = ("flat", "index", "nbytes", "tensors", "work")

    def __init__(self, index: int, tensors: list[torch.Tensor], group: dist.ProcessGroup,
                 src: int) -> None:
        self.index = index
        self.tensors = tensors
        # One tensor: a view when contiguous, so a receiving rank gets the data in place.
        self.flat = (tensors[0].reshape(-1) if len(tensors) == 1
                     else torch.cat([t.reshape(-1) for t in tensors]))
        self.nbytes = self.flat.numel() * self.flat.element_size()
        self.work = dist.broadcast(self.flat, group=group, group_src=src, async_op=True)

    def finish(self, receiving: bool, wait: Callable[[Any], None] | None = None) -> None:
        if self.work is not None:
            if wait is None:
                self.work.wait()
            else:
                wait(self.work)
        if not receiving:
            return
        offset = 0
        for t in self.tensors:
            n = t.numel()
            if n:
                out = self.flat[offset:offset + n].view(t.shape)
                if out.data_ptr() != t.data_ptr() or out.stride() != t.stride():
                    t.copy_(out)
            offset += n


def _check(tensors: list[torch.Tensor], group: dist.ProcessGroup, src: int,
           chunk_bytes: int) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ddpviz: broadcast_coalesced: item {i} is a {type(t).__name__}, not "
                            "a torch.Tensor; pass a list of tensors.")
        if t.layout != torch.strided:
            raise ValueError(f"ddpviz: broadcast_coalesced: tensor {i} has layout {t.layout}; "
                             "only dense tensors can be coalesced (torch: 'No support for "
                             "sparse tensors.'). Broadcast sparse tensors one by one.")
    if not 0 <= src < group.size():
        raise ValueError(f"ddpviz: broadcast_coalesced: src={src} is not a rank of the process "
                         f"group (size {group.size()}); pass src in [0, {group.size()}).")
    if chunk_bytes < 0:
        raise ValueError(f"ddpviz: broadcast_coalesced: chunk_bytes={chunk_bytes} is negative; "
                         "pass a byte count such as 250 * 2**20.")


def broadcast_coalesced(tensors: list[torch.Tensor], process_group: dist.ProcessGroup | None = None,
                        *, src: int = 0, chunk_bytes: int = 250 * 2**20,
                        tap: Tap | None = None, wait: Callable[[Any], None] | None = None
                        ) -> None:
    """Overwrite `tensors` on every rank with rank `src`'s values (collective; in place).

    Args:
        tensors: the same list (same dtypes, devices and sizes, in the same order) on every rank,
            e.g. DDP's parameters followed by its buffers. Parameters may require grad.
        process_group: the group to broadcast in; the default group if None.
        src: the sending rank, numbered within `process_group` (as torch's `src` here).
        chunk_bytes: the coalescing limit per flat buffer (torch's `buffer_size`, 250 MiB in DDP).
        tap: receives BroadcastStarted, a BroadcastChunkSent and a BroadcastChunkDone per chunk,
            and BroadcastFinished; nothing is built when None or disabled.
        wait: waits for each chunk's `Work` instead of `work.wait()` (the hang watchdog's).
    """
    group = dist.group.WORLD if process_group is None else process_group
    if group is None:
        raise RuntimeError("ddpviz: broadcast_coalesced needs a process group, and the default "
                           "one is not initialized. Call torch.distributed.init_process_group() "
                           "first, or pass process_group=.")
    _check(tensors, group, src, chunk_bytes)
    if not tensors:
        return
    chunks = chunk_indices(tensors, chunk_bytes)
    receiving = group.rank() != src
    tap = tap if tap is not None and tap.enabled else None
    start = 0.0
    total = 0
    if tap is not None:
        start = time.perf_counter()
        total = sum(t.numel() * t.element_size() for t in tensors)
        tap.emit(BroadcastStarted, src, len(tensors), total, len(chunks))
    in_flight: deque[_Chunk] = deque()
    with torch.no_grad():
        for index, members in enumerate(chunks):
            if len(in_flight) >= MAX_IN_FLIGHT:
                _finish(in_flight.popleft(), receiving, tap, wait)
            chunk = _Chunk(index, [tensors[i].detach() for i in members], group, src)
            in_flight.append(chunk)
            if tap is not None:
                first = chunk.tensors[0]
                tap.emit(BroadcastChunkSent, index, str(first.dtype).removeprefix("torch."),
                         str(first.device), chunk.nbytes, len(members))
        while in_flight:
            _finish(in_flight.popleft(), receiving, tap, wait)
    if tap is not None:
        tap.emit(BroadcastFinished, total, time.perf_counter() - start)


def _finish(chunk: _Chunk, receiving: bool, tap: Tap | None,
            wait: Callable[[Any], None] | None = None) -> None:
    chunk.finish(receiving, wait)
    if tap is not None:
        tap.emit(BroadcastChunkDone, chunk.index, chunk.nbytes)
