"""Cross-rank model verification: walk-through step 2.

torch only compares parameter counts, then sizes and strides against rank 0 (never dtypes), and
fails on one rank while the others hang. Here every rank describes its parameters and buffers,
the descriptions are exchanged with collectives whose sizes are known in advance (so differing
ranks can never hang or mis-size them), and every rank computes the same report and raises the
same `RankMismatchError`. See [Note: verification exchange].
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddpviz.engine.params import build_buffers, parameters_to_ignore
from ddpviz.errors import RankMismatchError
from ddpviz.events import (
    Mismatch,
    Tap,
    VerificationFailed,
    VerificationPassed,
    VerificationStarted,
)
from ddpviz.findings import Finding, fix_for, format_ranks, group_ranks
from ddpviz.model_mismatch import mismatch_findings, mismatch_title

# [Note: verification exchange]
# Every rank runs the same collectives whatever its model looks like:
#   1. all_gather of a fixed-size int64 row per rank: [n_params, n_buffers, digest of the
#      metadata, length of its JSON encoding, cuda index (-1 if none), host hash].
#   2. Only if the digests differ (or two ranks on one host use one GPU): all_gather of each
#      rank's JSON metadata in a uint8 tensor padded to the longest length, known from step 1.
# The branch taken depends only on gathered values, so all ranks take the same one. JSON, never
# pickle: a peer's bytes are data, not code. The digest covers exactly the fields compared
# below, so "digests equal" and "no mismatch" agree.

_HEAD = ("n_params", "n_buffers", "digest", "length", "cuda_index", "host")

# Field order in mismatch lists and message lines.
PARAM_FIELDS = ("shape", "stride", "dtype", "device", "requires_grad", "sparse_grad")
BUFFER_FIELDS = ("shape", "dtype", "device")
_FIELD_ORDER = ("present", "name", "order", *PARAM_FIELDS)
_LABEL = {"order": "index"}



class ParamMeta(NamedTuple):
    """One parameter as a rank sees it."""

    name: str  # dotted name of its first occurrence
    shape: tuple[int, ...] | None  # None: uninitialized (lazy) parameter
    stride: tuple[int, ...] | None
    dtype: str  # "float32"
    device: str  # full device ("cuda:1"); only its type is compared across ranks
    requires_grad: bool
    sparse_grad: bool  # from Embedding/EmbeddingBag(sparse=True)


class BufferMeta(NamedTuple):
    """One buffer as a rank sees it."""

    name: str
    shape: tuple[int, ...] | None  # None: uninitialized (lazy) buffer
    dtype: str
    device: str


class RankMetadata(NamedTuple):
    """What one rank's module looks like to verification."""

    rank: int
    host: str | None  # hostname; None for other ranks when the cheap path skipped the exchange
    cuda_index: int  # index of the first CUDA tensor of the module, -1 if it has none
    params: tuple[ParamMeta, ...]  # all named_parameters() minus ignored ones, in order
    buffers: tuple[BufferMeta, ...]  # named_buffers() minus ignored ones, in order


@dataclass(frozen=True)
class ModelComparison:
    """The outcome of `verify_module_across_ranks`; identical on every rank except `rank`.
    (`ddpviz.VerificationReport`, preflight's, wraps it with the findings.)"""

    world_size: int
    rank: int  # the rank (in the process group) that built this report
    digest: str  # hex digest of this rank's metadata
    mismatches: tuple[Mismatch, ...]  # empty when every rank has the same model
    metadata: tuple[RankMetadata, ...]  # per rank; on the cheap path copies of this rank's own
    collectives: int  # collectives the exchange used: 1 when all digests matched, else 2

    @property
    def ok(self) -> bool:
        """Whether every rank has the same model (no mismatch)."""
        return not self.mismatches

    def message(self) -> str:
        """The text of the error raised on mismatch (a one-line summary when ok).

        Returns:
            The house-style message naming each parameter or buffer that differs and what
            each group of ranks has; when ok, "ddpviz: the model is the same on all N ranks
            (P parameters, B buffers)."
        """
        if self.ok:
            own = self.metadata[self.rank] if self.metadata else None
            counts = (f" ({len(own.params)} parameters, {len(own.buffers)} buffers)"
                      if own is not None else "")
            return f"ddpviz: the model is the same on all {self.world_size} ranks{counts}."
        return format_mismatches(self.mismatches, self.world_size, self.metadata)

    def findings(self) -> list[Finding]:
        """The mismatches in diagnose()'s vocabulary.

        Returns:
            One error `Finding` per difference (kind, parameter, ranks, field); empty when
            ok.
        """
        return mismatch_findings(self.mismatches, self.world_size)

    def raise_if_failed(self) -> None:
        """Raise `RankMismatchError` when any rank differs (every rank raises the same)."""
        if not self.ok:
            raise RankMismatchError(self.message(), self.findings(), report=self)


# --- describing the local module --------------------------------------------------------------


def _shape(t: torch.Tensor) -> tuple[int, ...] | None:
    if isinstance(t, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer)):
        return None
    return tuple(t.shape)


def _stride(t: torch.Tensor) -> tuple[int, ...] | None:
    if _shape(t) is None or t.layout != torch.strided:
        return None
    return tuple(t.stride())


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def describe_module(module: nn.Module, ignore: set[str] | None = None, *, rank: int = 0,
                    host: str | None = None) -> RankMetadata:
    """This rank's description of `module`; never raises on odd tensors (a rank that raised here
    would leave the others waiting in the exchange)."""
    ignore = parameters_to_ignore(module) if ignore is None else ignore
    params: list[ParamMeta] = []
    seen: set[int] = set()
    for module_name, sub in module.named_modules():
        sparse = isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and bool(sub.sparse)
        for param_name, p in sub.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{module_name}.{param_name}" if module_name else param_name
            # State sync skips ignored dotted names; the reducer matches the ignore list
            # against f"{module_name}.{param_name}" (".w" for root parameters), so it still
            # reduces a root parameter listed as "w". Check whatever either of them uses.
            reduced = p.requires_grad and f"{module_name}.{param_name}" not in ignore
            if name in ignore and not reduced:
                continue
            params.append(ParamMeta(name, _shape(p), _stride(p), _dtype(p), str(p.device),
                                    bool(p.requires_grad), sparse))
    buffers = tuple(BufferMeta(n, _shape(b), _dtype(b), str(b.device))
                    for n, b in build_buffers(module, ignore))
    cuda = next((t.device.index for t in (*module.parameters(), *module.buffers())
                 if t.device.type == "cuda"), None)
    return RankMetadata(rank, socket.gethostname() if host is None else host,
                        -1 if cuda is None else int(cuda), tuple(params), buffers)


def _device_type(device: str) -> str:
    return device.split(":", 1)[0]


def _canonical(meta: RankMetadata) -> bytes:
    """The compared part of the metadata, as bytes (what the digest covers)."""
    params = [(p.name, p.shape, p.stride, p.dtype, _device_type(p.device), p.requires_grad,
               p.sparse_grad) for p in meta.params]
    buffers = [(b.name, b.shape, b.dtype, _device_type(b.device)) for b in meta.buffers]
    return json.dumps([params, buffers], separators=(",", ":")).encode()


def _int64_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def encode_metadata(meta: RankMetadata) -> bytes:
    """JSON bytes of the metadata (the payload of the second exchange)."""
    return json.dumps(meta, separators=(",", ":")).encode()


def _tuple(x: Any) -> tuple[int, ...] | None:
    return None if x is None else tuple(int(v) for v in x)


def decode_metadata(data: bytes) -> RankMetadata:
    """Inverse of `encode_metadata`."""
    rank, host, cuda_index, params, buffers = json.loads(data.decode())
    return RankMetadata(
        int(rank), host, int(cuda_index),
        tuple(ParamMeta(str(n), _tuple(s), _tuple(st), str(d), str(dev), bool(rg), bool(sp))
              for n, s, st, d, dev, rg, sp in params),
        tuple(BufferMeta(str(n), _tuple(s), str(d), str(dev)) for n, s, d, dev in buffers),
    )


# --- comparing ranks (pure; every rank runs it on the same data) ------------------------------


def _fmt(field: str, value: Any) -> str:
    if field in ("shape", "stride"):
        return "uninitialized" if value is None else str(tuple(value))
    if field == "device":
        return _device_type(value)
    if field == "name":
        return repr(value)
    return str(value)


def _compare_fields(kind: str, index: int, name: str, entries: Mapping[int, Any],
                    fields: Sequence[str]) -> list[Mismatch]:
    out: list[Mismatch] = []
    for field in fields:
        if field == "stride" and out and out[-1].field == "shape":
            continue  # different shapes have different strides; saying so adds only noise
        values = {r: _fmt(field, getattr(e, field)) for r, e in entries.items()}
        if len(set(values.values())) > 1:
            out.append(Mismatch(kind, index, name, field, group_ranks(values)))
    return out


def _renamed_positions(lists: Sequence[Sequence[Any]], common: set[str],
                       holders: Mapping[str, list[int]]) -> list[int]:
    """Positions where every rank has a name not held by all ranks, each name held exactly by
    the ranks that have it at that position: the same entry under different names."""
    positions = []
    for i in range(min(len(entries) for entries in lists)):
        at = {r: entries[i].name for r, entries in enumerate(lists)}
        if any(n in common for n in at.values()) or len(set(at.values())) < 2:
            continue
        if all(holders[n] == [r for r in at if at[r] == n] for n in set(at.values())):
            positions.append(i)
    return positions


def _compare_lists(kind: str, lists: Sequence[Sequence[Any]],
                   fields: Sequence[str]) -> list[Mismatch]:
    """Mismatches of one kind ("param" or "buffer"), aligned by name: an entry missing on some
    ranks is reported as exactly that, not as a shift of every later index."""
    world_size = len(lists)
    out: list[Mismatch] = []
    counts = {r: len(entries) for r, entries in enumerate(lists)}
    if len(set(counts.values())) > 1:
        noun = "parameters" if kind == "param" else "buffers"
        out.append(Mismatch("count", -1, noun, "count",
                            group_ranks({r: str(n) for r, n in counts.items()})))
    position = [{e.name: i for i, e in enumerate(entries)} for entries in lists]
    holders: dict[str, list[int]] = {}
    for r, entries in enumerate(lists):
        for e in entries:
            holders.setdefault(e.name, []).append(r)
    common = {n for n, rs in holders.items() if len(rs) == world_size}

    blocks: list[tuple[int, str, list[Mismatch]]] = []
    renamed: set[str] = set()
    for i in _renamed_positions(lists, common, holders):
        at_i = {r: lists[r][i] for r in range(world_size)}
        renamed.update(e.name for e in at_i.values())
        name = at_i[0].name
        names = group_ranks({r: _fmt("name", e.name) for r, e in at_i.items()})
        blocks.append((i, name, [Mismatch(kind, i, name, "name", names),
                                 *_compare_fields(kind, i, name, at_i, fields)]))

    sequences = [[e.name for e in entries if e.name in common] for entries in lists]
    reordered = any(s != sequences[0] for s in sequences)
    common_position = [{n: i for i, n in enumerate(s)} for s in sequences]
    for name, ranks in holders.items():
        if name in renamed:
            continue
        index = position[ranks[0]][name]
        found: list[Mismatch] = []
        if len(ranks) < world_size:
            present = {r: "present" if r in ranks else "missing" for r in range(world_size)}
            found.append(Mismatch(kind, index, name, "present", group_ranks(present)))
        elif reordered and len({common_position[r][name] for r in ranks}) > 1:
            found.append(Mismatch(kind, index, name, "order",
                                  group_ranks({r: str(position[r][name]) for r in ranks})))
        found += _compare_fields(kind, index, name,
                                 {r: lists[r][position[r][name]] for r in ranks}, fields)
        if found:
            blocks.append((index, name, found))
    for _, _, found in sorted(blocks, key=lambda b: (b[0], b[1])):
        out += found
    return out


def _shared_gpus(metadata: Sequence[RankMetadata]) -> list[Mismatch]:
    where = {m.rank: (m.host, m.cuda_index) for m in metadata if m.cuda_index >= 0}
    if len(set(where.values())) == len(where):
        return []
    values = {r: f"cuda:{i} on {h}" for r, (h, i) in where.items()}
    return [Mismatch("device", -1, "", "cuda_device", group_ranks(values))]


def compare_ranks(metadata: Sequence[RankMetadata]) -> tuple[Mismatch, ...]:
    """Every difference across the ranks' metadata (index r = rank r): counts, names present on
    some ranks only, renames, registration order, then per-field differences; then GPU sharing.
    """
    return (*_compare_lists("param", [m.params for m in metadata], PARAM_FIELDS),
            *_compare_lists("buffer", [m.buffers for m in metadata], BUFFER_FIELDS),
            *_shared_gpus(metadata))


# --- the message --------------------------------------------------------------------------------


def _entry(metadata: Sequence[RankMetadata], rank: int, m: Mismatch,
           renamed: bool) -> ParamMeta | BufferMeta | None:
    if rank >= len(metadata):
        return None
    entries = metadata[rank].params if m.kind == "param" else metadata[rank].buffers
    for e in entries:
        if e.name == m.name:
            return e
    return entries[m.index] if renamed and 0 <= m.index < len(entries) else None


def _lines(block: Sequence[Mismatch],
           metadata: Sequence[RankMetadata]) -> list[tuple[str, tuple[int, ...]]]:
    """(description, ranks) per distinct description, most common first."""
    first = block[0]
    per_rank: dict[int, dict[str, str]] = {}
    for m in block:
        for value, ranks in m.values:
            for r in ranks:
                per_rank.setdefault(r, {})[m.field] = value
    if first.kind in ("count", "device"):
        suffix = f" {first.name}" if first.kind == "count" else ""
        return [(value + suffix, ranks) for value, ranks in first.values]
    renamed = any(m.field == "name" for m in block)
    described: dict[int, str] = {}
    for r, fields in per_rank.items():
        if fields.get("present") == "missing":
            described[r] = "missing"
            continue
        entry = _entry(metadata, r, first, renamed)
        if entry is not None:
            for context in ("shape", "dtype"):
                fields.setdefault(context, _fmt(context, getattr(entry, context)))
        described[r] = " ".join(f"{_LABEL.get(f, f)}={fields[f]}" for f in _FIELD_ORDER
                                if f in fields and f != "present")
    return [(d, rs) for d, rs in group_ranks(described)]


def format_mismatches(mismatches: Sequence[Mismatch], world_size: int,
                      metadata: Sequence[RankMetadata] = ()) -> str:
    """The error message: what differs (index, dotted name, world size), one line per distinct
    value with its ranks, then the fix."""
    blocks: list[list[Mismatch]] = []
    for m in mismatches:
        if blocks and (blocks[-1][0].kind, blocks[-1][0].index, blocks[-1][0].name) == (
                m.kind, m.index, m.name) and m.kind not in ("count", "device"):
            blocks[-1].append(m)
        else:
            blocks.append([m])
    rendered = []
    for block in blocks:
        lines = _lines(block, metadata)
        width = max(len(format_ranks(rs)) for _, rs in lines) + 1
        rendered.append((mismatch_title(block), [f"  {(format_ranks(rs) + ':').ljust(width)} {d}"
                                         for d, rs in lines]))
    if len(rendered) == 1:
        title, body = rendered[0]
        text = [f"ddpviz: {title} (world_size={world_size}):", *body]
    else:
        text = [f"ddpviz: the model differs across ranks in {len(rendered)} places "
                f"(world_size={world_size}):"]
        for title, body in rendered:
            text += [f"{title}:", *body]
    kinds = {m.kind for m in mismatches}
    if "device" in kinds:
        text.append(fix_for("gpu_shared"))
    if kinds - {"device"}:
        text.append(fix_for("param_mismatch"))
    return "\n".join(text)


# --- the exchange -----------------------------------------------------------------------------


def _process_group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    group = dist.group.WORLD if process_group is None else process_group
    if group is None:
        raise RuntimeError(
            "ddpviz: no process group to verify the model across: the default process group is "
            "not initialized. Call torch.distributed.init_process_group(...) first, or pass "
            "process_group=."
        )
    return group


def verify_module_across_ranks(module: nn.Module, process_group: dist.ProcessGroup | None = None,
                               *, ignore: set[str] | None = None, tap: Tap | None = None,
                               raise_on_mismatch: bool = True) -> ModelComparison:
    """Check that every rank of `process_group` holds the same model (collective: call it on all
    ranks). Compares names, registration order, shapes, strides, dtypes, device types,
    requires_grad and sparse-gradient flags of the parameters, and names, order, shapes, dtypes
    and device types of the buffers; also that no two ranks on one host use the same GPU.

    Args:
        module: the module about to be wrapped.
        process_group: the group to verify across; the default group if None.
        ignore: names to skip (default: `module._ddp_params_and_buffers_to_ignore`).
        tap: receives VerificationStarted, then VerificationPassed or VerificationFailed.
        raise_on_mismatch: raise `RankMismatchError` on every rank when anything differs (the
            default); False returns the failed report instead.

    Returns:
        The `ModelComparison` (one all_gather when all ranks agree, two otherwise).

    Raises:
        RankMismatchError: on every rank, with the same message, if any rank differs.
    """
    group = _process_group(process_group)
    world_size, rank = group.size(), group.rank()
    local = describe_module(module, ignore, rank=rank)
    tap = tap if tap is not None and tap.enabled else None
    if tap is not None:
        tap.emit(VerificationStarted, world_size, len(local.params), len(local.buffers))
    payload = encode_metadata(local)
    digest = _int64_hash(_canonical(local))
    device = torch.device("cuda", local.cuda_index) if local.cuda_index >= 0 else torch.device(
        "cpu")
    head = torch.tensor([len(local.params), len(local.buffers), digest, len(payload),
                         local.cuda_index, _int64_hash((local.host or "").encode())],
                        dtype=torch.int64, device=device)
    heads = [torch.empty_like(head) for _ in range(world_size)]
    dist.all_gather(heads, head, group=group)
    rows = [dict(zip(_HEAD, h.tolist(), strict=True)) for h in heads]
    gpus = [(row["host"], row["cuda_index"]) for row in rows if row["cuda_index"] >= 0]
    if len({row["digest"] for row in rows}) == 1 and len(set(gpus)) == len(gpus):
        metadata = tuple(local._replace(rank=r, host=local.host if r == rank else None,
                                        cuda_index=rows[r]["cuda_index"])
                         for r in range(world_size))
        report = ModelComparison(world_size, rank, f"{digest & (2**64 - 1):016x}", (),
                                    metadata, 1)
    else:
        longest = max(row["length"] for row in rows)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        mine = mine.to(device)
        gathered = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(gathered, mine, group=group)
        metadata = tuple(decode_metadata(t[:rows[r]["length"]].cpu().numpy().tobytes())
                         for r, t in enumerate(gathered))
        report = ModelComparison(world_size, rank, f"{digest & (2**64 - 1):016x}",
                                    compare_ranks(metadata), metadata, 2)
    if tap is not None:
        if report.ok:
            tap.emit(VerificationPassed, world_size, report.digest)
        else:
            tap.emit(VerificationFailed, world_size, report.mismatches)
    if raise_on_mismatch:
        report.raise_if_failed()
    return report


# --- through the store, before torch's constructor (`ddpviz record`) ---------------------------


def compare_through_store(module: nn.Module, rank: int, world_size: int,
                          exchange: Callable[[str, str], list[str]]) -> ModelComparison:
    """The same comparison as `verify_module_across_ranks`, with no collective: `exchange(name,
    payload)` returns every rank's payload through the store (the watchdog's, so a missing rank
    is named, never waited for). Every rank posts the digest of its metadata; only when the
    digests differ does every rank post (and read) the metadata itself, so a healthy job reads
    world_size short strings. Used by `ddpviz record` before torch's constructor, which checks
    only counts and rank 0's sizes and fails on one rank while the others hang."""
    local = describe_module(module, rank=rank)
    digest = f"{_int64_hash(_canonical(local)) & (2**64 - 1):016x}"
    digests = exchange("model-digest", digest)
    if len(set(digests)) == 1:
        metadata = tuple(local._replace(rank=r) for r in range(world_size))
        return ModelComparison(world_size, rank, digest, (), metadata, 0)
    payloads = exchange("model", encode_metadata(local).decode())
    metadata = tuple(decode_metadata(p.encode()) for p in payloads)
    return ModelComparison(world_size, rank, digest, compare_ranks(metadata), metadata, 0)


def breaks_torch(report: ModelComparison) -> bool:
    """Would torch's DDP constructor fail (or hang) on these models? It checks the number of
    reduced parameters and their sizes and strides against rank 0, then broadcasts every
    parameter and buffer coalesced by dtype: any difference in that layout fails on some rank
    while others wait. Differences it accepts (names, registration order with the same
    layout) are findings, not errors."""
    if any(m.kind in ("count", "device") for m in report.mismatches):
        return True

    def layout(meta: RankMetadata) -> tuple[list[Any], list[Any]]:
        return ([(p.shape, p.stride, p.dtype, p.requires_grad) for p in meta.params],
                [(b.shape, b.dtype) for b in meta.buffers])

    first = layout(report.metadata[0])
    return any(layout(m) != first for m in report.metadata[1:])
