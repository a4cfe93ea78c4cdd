"""One tensor, summarized for the notebook (`Inspected`) or cut into bounded raw parts
(`Fetched`): never a whole model unasked, every reply bounded (ddpviz.limits)."""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

import torch

from ddpviz.events import FINITENESS_BINS, HEAD_VALUES, MAX_CHUNK_DIGESTS, MAX_NONFINITE_AT
from ddpviz.limits import MAX_BLOB
from ddpviz.probes.nonfinite import nonfinite

PART_BYTES = MAX_BLOB // 4 * 3  # raw bytes of one Fetched part (base64 fits MAX_BLOB)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().reshape(-1)


def _bytes(flat: torch.Tensor) -> memoryview:
    return memoryview(flat.view(torch.uint8).numpy().data) if flat.numel() else memoryview(b"")


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for d in reversed(shape):
        out.append(index % d if d else 0)
        index = index // d if d else 0
    return tuple(reversed(out))


def summarize(t: torch.Tensor) -> dict[str, Any]:
    """The `Inspected` fields of `t` (see ddpviz.events.Inspected). An all-finite fp32/fp64
    tensor (the usual case) costs a sum, a min/max, a norm and the digests, with no copy (10M
    elements: see benchmarks/bench_debugger.py inspect)."""
    shape = tuple(t.shape)
    flat = _flat(t)
    n = flat.numel()
    n_nan = n_pos = n_neg = 0
    bad: torch.Tensor | None = None
    if flat.is_complex() or (flat.is_floating_point() and bool(nonfinite(flat))):
        bad = ~torch.isfinite(flat)
        n_nan = int(torch.isnan(flat).sum())
        if not flat.is_complex():
            n_pos = int(torch.isposinf(flat).sum())
            n_neg = int(torch.isneginf(flat).sum())
    finite = flat if bad is None else flat[~bad]
    norm, max_abs = _norm_max(finite)
    nonfinite_n = n_nan + n_pos + n_neg
    at = [_unravel(int(i), shape) for i in torch.nonzero(bad)[:MAX_NONFINITE_AT, 0].tolist()] \
        if bad is not None and nonfinite_n else []
    bins = min(FINITENESS_BINS, n)
    finiteness: tuple[float, ...] = ()
    if bins:
        edges = [n * i // bins for i in range(bins + 1)]
        counts = torch.cumsum(bad.to(torch.int64), 0) if bad is not None and nonfinite_n \
            else None
        finiteness = tuple(
            0.0 if counts is None else
            float(int(counts[edges[i + 1] - 1]) - (int(counts[edges[i] - 1]) if edges[i] else 0))
            / max(1, edges[i + 1] - edges[i])
            for i in range(bins))
    raw = _bytes(flat)
    chunk = max(1, math.ceil(n / MAX_CHUNK_DIGESTS)) if n else 0
    size = flat.element_size()
    chunk_digests = tuple(_chunk_digest(raw[i * size:(i + chunk) * size])
                          for i in range(0, n, chunk)) if n else ()
    head = tuple(float(v.real) if flat.is_complex() else float(v)
                 for v in flat[:HEAD_VALUES].tolist())
    return {"shape": shape, "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device), "numel": n, "norm": norm, "max_abs": max_abs,
            "n_nan": n_nan, "n_posinf": n_pos, "n_neginf": n_neg, "nonfinite_at": tuple(at),
            "finiteness": finiteness,
            "digest": hashlib.blake2b(raw, digest_size=16).hexdigest(),
            "chunk_elements": chunk, "chunk_digests": chunk_digests, "head": head}


def _chunk_digest(data: memoryview) -> str:
    """A chunk's digest (compared across ranks only, to find the first differing chunk):
    SHA-1, which OpenSSL computes at 2-3x blake2b's speed here, cut to 128 bits."""
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()[:32]


def _norm_max(finite: torch.Tensor) -> tuple[float, float]:
    """The L2 norm and the largest |x| of these finite values, in fp64 (0.0 for none). fp32 and
    fp64 in place: torch reduces them on the CPU with a double accumulator; the others (and a
    norm too large for the tensor's own type) through an fp64 copy of |x|."""
    if not finite.numel():
        return 0.0, 0.0
    if finite.dtype in (torch.float32, torch.float64):
        lo, hi = torch.aminmax(finite)
        norm = float(torch.linalg.vector_norm(finite))
        if math.isfinite(norm):
            return norm, max(-float(lo), float(hi))
    values = finite.abs().double()
    return float(torch.linalg.vector_norm(values)), float(values.max())


def fetch_range(t: torch.Tensor, chunk: int, start: int, stop: int,
                max_elements: int) -> tuple[int, int]:
    """The flat element range [start, stop) a Fetch asks for; ValueError saying how to narrow
    it when it is out of range or above `max_elements`."""
    n = t.numel()
    if chunk >= 0:
        size = max(1, math.ceil(n / MAX_CHUNK_DIGESTS)) if n else 0
        start, stop = chunk * size, min(n, (chunk + 1) * size)
        if start >= n:
            raise ValueError(f"chunk {chunk} is past the end: the tensor has "
                             f"{math.ceil(n / max(size, 1))} chunks of {size} elements")
    else:
        stop = n if stop == 0 else stop
        if not 0 <= start <= stop <= n:
            raise ValueError(f"the range [{start}, {stop}) is not within the tensor's {n} "
                             "elements; ask for start <= stop <= numel")
    if stop - start > max_elements:
        raise ValueError(
            f"the fetch has {stop - start} elements, more than max_elements={max_elements}: "
            f"fetch a slice (start=..., stop=..., at most {max_elements} elements) or one chunk "
            f"(chunk=i, as Inspected.chunk_digests numbers them), or raise max_elements")
    return start, stop


def parts(t: torch.Tensor, start: int, stop: int) -> list[tuple[int, str]]:
    """Flat elements [start, stop) of `t` as (first element, base64 bytes) parts, each at most
    PART_BYTES raw bytes (a whole number of elements)."""
    flat = _flat(t)[start:stop]
    size = max(1, flat.element_size())
    per = max(1, PART_BYTES // size)
    raw = _bytes(flat)
    out = [(start + i, base64.b64encode(raw[i * size:(i + per) * size]).decode())
           for i in range(0, flat.numel(), per)]
    return out or [(start, "")]
