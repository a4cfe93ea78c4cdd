"""One tensor across ranks, compared from each rank's bounded summary (torch-free).

A paused rank answers an inspect with a `Summary` of one tensor (never the tensor): shape,
dtype, norms, non-finite counts and positions, a 64-bin finiteness map, a digest of its bytes and
256 chunk digests. `compare` reads many ranks' summaries as few:
- bitwise groups: ranks whose tensors have the same digest over the same shape and dtype (the
  only "equal" ddpviz says; a rank that sent no digest is "not compared", never equal);
- outliers first: every group but the largest, smallest first, then the largest;
- the first differing chunk of each outlier group against the largest group (chunk digests),
  which a second, bounded fetch turns into the first differing element (`first_difference`);
- norms as a spread across ranks, and the ranks holding NaN or Inf with where.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ddpviz.findings import format_ranks
from ddpviz.model.rank_groups import Spread, ValueGroup, spread, value_groups


class Summary(NamedTuple):
    """One rank's tensor, summarised on the rank (the fields of an `Inspected` reply)."""

    rank: int
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    norm: float  # L2 norm of the finite elements (NaN when the rank could not say)
    max_abs: float  # of the finite elements
    n_nan: int
    n_posinf: int
    n_neginf: int
    nonfinite_at: tuple[tuple[int, ...], ...]  # first 16 non-finite positions (multi-index)
    finiteness: tuple[float, ...]  # up to 64 fractions of non-finite elements per bin
    digest: str  # blake2b-128 of the bytes, hex; "" when not computed
    chunk_elements: int  # elements per chunk (the last may hold fewer)
    chunk_digests: tuple[str, ...]  # up to 256 digests, chunk i = elements [i*ce, (i+1)*ce)
    head: tuple[float, ...]  # the first 8 values

    @classmethod
    def of(cls, reply: Any) -> Summary:
        """Read the summary an `Inspected` reply carries.

        Args:
            reply: an `Inspected` event (its rank in `reply.rank`).

        Returns:
            The rank's Summary.
        """
        return cls(reply.rank, tuple(reply.shape), reply.dtype, reply.device, reply.numel,
                   reply.norm, reply.max_abs, reply.n_nan, reply.n_posinf, reply.n_neginf,
                   tuple(tuple(p) for p in reply.nonfinite_at), tuple(reply.finiteness),
                   reply.digest, reply.chunk_elements, tuple(reply.chunk_digests),
                   tuple(reply.head))

    @property
    def nonfinite(self) -> int:
        """How many elements are NaN or infinite."""
        return self.n_nan + self.n_posinf + self.n_neginf

    @property
    def key(self) -> tuple[str, tuple[int, ...], str]:
        """What bitwise equality compares (the digest of bytes of one shape and dtype)."""
        return (self.digest, self.shape, self.dtype)


class ChunkDifference(NamedTuple):
    """Where one group of ranks first differs from the largest group."""

    ranks: tuple[int, ...]  # the differing group
    against: tuple[int, ...]  # the largest group
    chunk: int  # the first chunk whose digests differ
    start: int  # its first element (flat index)
    stop: int  # one past its last element


class Comparison(NamedTuple):
    """A tensor on every rank that answered, compared."""

    summaries: dict[int, Summary]
    groups: tuple[ValueGroup[tuple[str, tuple[int, ...], str]], ...]  # outliers first
    uncompared: tuple[int, ...]  # ranks without a digest: never called equal to anything
    mismatched: tuple[str, ...]  # shape/dtype disagreements, in words
    differences: tuple[ChunkDifference, ...]  # per outlier group, against the largest group
    norms: Spread | None
    nonfinite: dict[int, Summary]  # the ranks holding NaN or Inf

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.summaries))

    @property
    def all_equal(self) -> bool:
        """True only when every rank's digest was compared and all are the same."""
        return len(self.groups) == 1 and not self.uncompared and len(self.summaries) > 0

    def verdict(self) -> str:
        """What was observed, in one line: bitwise equal, or how the ranks split."""
        if not self.summaries:
            return "no rank answered"
        if self.all_equal:
            n = len(self.summaries)
            return (f"bitwise equal on all {n} ranks (one digest)" if n > 1
                    else "one rank answered: nothing to compare")
        parts = []
        if len(self.groups) > 1:
            parts.append(f"{len(self.groups)} different values: "
                         + "; ".join(f"{format_ranks(g.ranks)}" for g in self.groups))
        if self.uncompared:
            parts.append(f"{format_ranks(self.uncompared)} sent no digest (not compared)")
        if self.mismatched:
            parts.extend(self.mismatched)
        return " · ".join(parts) if parts else "one group"


def compare(summaries: Mapping[int, Summary]) -> Comparison:
    """Compare one tensor's summaries across ranks ({rank: Summary})."""
    by_rank = dict(sorted(summaries.items()))
    digested = {r: s.key for r, s in by_rank.items() if s.digest}
    uncompared = tuple(r for r, s in by_rank.items() if not s.digest)
    groups = value_groups(digested)  # largest first
    ordered = (*reversed(groups[1:]), *groups[:1])  # outliers (smallest) first, largest last
    mismatched = []
    for field in ("shape", "dtype"):
        held = value_groups({r: str(getattr(s, field)) for r, s in by_rank.items()})
        if len(held) > 1:
            mismatched.append(f"{field} differs: " + "; ".join(
                f"{format_ranks(g.ranks)} {g.value}" for g in held))
    differences = []
    if len(groups) > 1:
        ref = by_rank[groups[0].ranks[0]]
        for g in groups[1:]:
            other = by_rank[g.ranks[0]]
            chunk = first_differing_chunk(ref, other)
            if chunk is not None:
                start, stop = chunk_range(ref, chunk)
                differences.append(ChunkDifference(g.ranks, groups[0].ranks, chunk, start,
                                                   stop))
    norms = spread(s.norm for s in by_rank.values() if not math.isnan(s.norm))
    nonfinite = {r: s for r, s in by_rank.items() if s.nonfinite}
    return Comparison(by_rank, tuple(ordered), uncompared, tuple(mismatched),
                      tuple(differences), norms, nonfinite)


def first_differing_chunk(a: Summary, b: Summary) -> int | None:
    """The first chunk whose digests differ between two ranks' tensors of one shape and dtype;
    None when the chunks cannot say (a different shape or dtype, no chunk digests, or every
    chunk equal though the digests differ, which a correct rank never sends)."""
    if a.shape != b.shape or a.dtype != b.dtype or not a.chunk_digests or len(
            a.chunk_digests) != len(b.chunk_digests) or a.chunk_elements != b.chunk_elements:
        return None
    return next((i for i, (x, y) in enumerate(zip(a.chunk_digests, b.chunk_digests,
                                                  strict=True)) if x != y), None)


def chunk_range(s: Summary, chunk: int) -> tuple[int, int]:
    """The flat element range [start, stop) of chunk `chunk` of `s`'s tensor."""
    start = chunk * s.chunk_elements
    return start, min(start + s.chunk_elements, s.numel)


def unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """A flat (row-major) element index as a multi-index into `shape`."""
    if not shape:
        return ()
    out = []
    for dim in reversed(shape):
        flat, i = divmod(flat, dim) if dim else (flat, 0)
        out.append(i)
    return tuple(reversed(out))


class ElementDifference(NamedTuple):
    """The first element where the ranks' fetched bytes differ."""

    flat: int  # flat index in the tensor
    position: tuple[int, ...]  # multi-index
    values: dict[int, float]  # rank -> the value there (bfloat16 and the like as float)


# torch dtype name -> numpy dtype of the same bytes (little-endian, as Fetched sends them)
_NUMPY = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4",
          "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "?", "uint16": "<u2",
          "uint32": "<u4", "uint64": "<u8", "complex64": "<c8", "complex128": "<c16"}


def element_size(dtype: str) -> int:
    """Bytes per element of a torch dtype name ("float32", "torch.bfloat16", ...)."""
    name = dtype.removeprefix("torch.")
    if name == "bfloat16":
        return 2
    if name.startswith("float8"):
        return 1
    if name not in _NUMPY:
        raise ValueError(f"ddpviz: cannot read tensors of dtype {dtype!r} in the notebook.\n"
                         "Inspect it instead (digests and norms are computed on the rank).")
    return np.dtype(_NUMPY[name]).itemsize


def decode(data: bytes, dtype: str) -> np.ndarray:
    """Raw little-endian bytes of a tensor of `dtype` as a flat numpy array (bfloat16 as
    float32, exactly; float8 kinds as their raw bytes, uint8)."""
    name = dtype.removeprefix("torch.")
    if name == "bfloat16":
        return (np.frombuffer(data, "<u2").astype("<u4") << 16).view("<f4")
    if name.startswith("float8"):
        return np.frombuffer(data, "u1")
    return np.frombuffer(data, _NUMPY.get(name, "u1"))


def first_difference(data: Mapping[int, bytes], dtype: str, start: int,
                     shape: Sequence[int]) -> ElementDifference | None:
    """The first element at which the ranks' fetched bytes (each the same flat slice of one
    tensor of `dtype`, beginning at element `start`) differ bitwise; None when they all
    agree. Bitwise: NaN equals NaN of the same bits, and -0.0 differs from 0.0."""
    ranks = sorted(data)
    if len(ranks) < 2:
        return None
    size = element_size(dtype)
    rows = {r: np.frombuffer(data[r][: len(data[r]) // size * size], f"V{size}") for r in ranks}
    n = min(len(a) for a in rows.values())
    ref = rows[ranks[0]][:n]
    differs = np.zeros(n, dtype=bool)
    for r in ranks[1:]:
        differs |= rows[r][:n] != ref
    hits = np.flatnonzero(differs)
    if hits.size:
        i = int(hits[0])
    elif any(len(a) != n for a in rows.values()):  # a shorter slice: it differs past its end
        i = n
    else:
        return None
    values = {r: _value(data[r], dtype, i) for r in ranks if len(rows[r]) > i}
    return ElementDifference(start + i, unravel(start + i, shape), values)


def _value(data: bytes, dtype: str, i: int) -> float:
    size = element_size(dtype)
    x = decode(data[i * size:(i + 1) * size], dtype)[0]
    return complex(x) if np.iscomplexobj(x) else float(x)  # type: ignore[return-value]
