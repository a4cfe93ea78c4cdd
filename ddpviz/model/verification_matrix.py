"""The verification matrix as plain data: one row per parameter or buffer, one status per rank.

Built from each rank's ParamsBuilt (what DDP reduces and syncs there) and the verification
result (VerificationPassed, or VerificationFailed's mismatches, which also carry the fields
ParamsBuilt lacks: strides, requires_grad, buffer shapes). A cell is "same" (the rank agrees
with the most common value of every field), "differs", "missing" (the rank has no such entry)
or "pending" (the rank has not reported yet). Pure functions: no widgets here.

Sized by what the file holds, never by rows x ranks: a row keeps the cells of the ranks it names
(its ParamsBuilt entries and mismatch values, `Row.known`); every other rank's cell follows from
the rank alone (`Matrix.base`: missing where the rank's ParamsBuilt lacks the row, same where it
passed verification, else pending), so a world size of 131,072 costs a count, not 131,072
cells per row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

from ddpviz import events as ev
from ddpviz.findings import format_ranks, group_ranks
from ddpviz.model.event_model import RankState

CellStatus = Literal["same", "differs", "missing", "pending"]
MatrixState = Literal["waiting", "verifying", "passed", "failed", "unverified"]

# The order fields are compared and shown in (verification's order, then ParamsBuilt's extras).
FIELD_ORDER = ("present", "name", "order", "index", "shape", "stride", "dtype", "device",
               "requires_grad", "sparse_grad", "count", "cuda_device")
_LABEL = {"order": "index"}


class Row(NamedTuple):
    """One parameter or buffer across ranks."""

    kind: Literal["param", "buffer"]
    position: int  # index on the lowest rank holding it
    name: str
    known: dict[int, CellStatus]  # the cells of the ranks this row names
    values: dict[int, dict[str, str]]  # rank -> field -> value, for ranks holding it
    differing: tuple[str, ...]  # fields whose values differ across ranks
    counts: dict[CellStatus, int]  # ranks per status, over all of the matrix's ranks
    base: Mapping[int, CellStatus]  # the matrix's (shared): cells of ranks not in `known`
    ranks: tuple[int, ...]  # the matrix's (shared)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"

    def cell(self, rank: int) -> CellStatus:
        """`rank`'s status in this row."""
        found = self.known.get(rank)
        return found if found is not None else self.base.get(rank, "pending")

    @property
    def cells(self) -> tuple[CellStatus, ...]:
        """Per rank, in `Matrix.ranks` order (one per rank: for a few ranks; views use
        `cell`, `counts` and `ranks_with`)."""
        return tuple(self.cell(r) for r in self.ranks)

    def ranks_with(self, status: CellStatus) -> list[int]:
        """The ranks whose cell is `status`, sorted."""
        if status == "pending":
            return [r for r in self.ranks if self.cell(r) == "pending"]
        found = {r for r, c in self.known.items() if c == status}
        found |= {r for r, c in self.base.items() if c == status and r not in self.known}
        return sorted(found)

    @property
    def status(self) -> CellStatus:
        """The worst cell: missing > differs > pending > same."""
        for s in ("missing", "differs", "pending"):
            if self.counts.get(s):
                return s
        return "same"


class Matrix(NamedTuple):
    ranks: tuple[int, ...]
    world_size: int | None
    rows: tuple[Row, ...]  # parameters in index order, then buffers
    state: MatrixState
    digest: str  # VerificationPassed's digest ("" otherwise)
    notes: tuple[str, ...]  # count and GPU-sharing mismatches, which belong to no row
    verdict: str  # the one-line summary, plain text
    base: Mapping[int, CellStatus] = {}  # cells of the reporting ranks in rows not naming them


def describe(values: Mapping[str, str]) -> str:
    """'shape=(16, 8) dtype=float32 ...' in FIELD_ORDER."""
    return " ".join(f"{_LABEL.get(f, f)}={values[f]}" for f in FIELD_ORDER
                    if f in values and f != "present") or "present"


def _shape(shape: Sequence[int]) -> str:
    return str(tuple(shape))


def build_matrix(states: Mapping[int, RankState], world_size: int | None = None) -> Matrix:
    """The matrix for the constructor facts in `states` (from `EventModel.construction`)."""
    ranks = tuple(sorted(set(states) | set(range(world_size or 0))))
    entries: dict[str, dict[int, dict[str, str]]] = {}  # key -> rank -> values
    first_index: dict[str, tuple[int, int]] = {}  # key -> (lowest rank, index there)
    kinds: dict[str, Literal["param", "buffer"]] = {}
    listed: dict[int, set[str]] = {}  # ranks whose ParamsBuilt we have -> keys they hold

    def note(key: str, kind: Literal["param", "buffer"], rank: int, index: int) -> None:
        kinds[key] = kind
        if key not in first_index or (rank, index) < first_index[key]:
            first_index[key] = (rank, index)

    for r, s in sorted(states.items()):
        if s.params is None:
            continue
        built = s.params.event
        assert isinstance(built, ev.ParamsBuilt)
        held = listed.setdefault(r, set())
        for p in built.params:
            key = f"param:{p.name}"
            held.add(key)
            note(key, "param", r, p.index)
            entries.setdefault(key, {})[r] = {
                "index": str(p.index), "shape": _shape(p.shape), "dtype": p.dtype,
                "device": p.device.split(":")[0], "sparse_grad": str(p.sparse_grad)}
        for i, name in enumerate(built.buffers):
            key = f"buffer:{name}"
            held.add(key)
            note(key, "buffer", r, i)
            entries.setdefault(key, {})[r] = {"index": str(i)}

    # The verification result: every rank computes the same one; take the lowest rank's.
    results = [s.verify_result.event for _, s in sorted(states.items())
               if s.verify_result is not None]
    failed = next((x for x in results if isinstance(x, ev.VerificationFailed)), None)
    passed = next((x for x in results if isinstance(x, ev.VerificationPassed)), None)
    verified = {r for r, s in states.items() if s.verify_result is not None}
    notes: list[str] = []
    flagged: dict[str, dict[int, set[str]]] = {}  # key -> rank -> fields it differs in
    if failed is not None:
        ranks = tuple(sorted(set(ranks) | set(range(failed.world_size))))
        for m in failed.mismatches:
            if m.kind in ("count", "device"):
                what = m.name if m.kind == "count" else "GPUs shared on one host"
                notes.append(f"{m.field} of {what}: " + "; ".join(
                    f"{format_ranks(rs)}: {v}" for v, rs in m.values))
                continue
            kind: Literal["param", "buffer"] = "param" if m.kind == "param" else "buffer"
            key = f"{kind}:{m.name}"
            holding = [r for v, rs in m.values for r in rs if v != "missing"]
            note(key, kind, min(holding) if holding else 0, m.index)
            per_rank = entries.setdefault(key, {})
            for value, rs in m.values:
                for r in rs:
                    per_rank.setdefault(r, {})[m.field] = value
                    if m.field == "present" and value == "missing":
                        per_rank[r] = {"present": "missing"}
            for value, rs in m.values if m.field == "present" else m.values[1:]:
                if m.field == "present" and value != "missing":
                    continue
                for r in rs:
                    flagged.setdefault(key, {}).setdefault(r, set()).add(m.field)

    # A rank's cell in a row that does not name it depends on the rank alone.
    base: dict[int, CellStatus] = {}
    for r in states:
        if r in listed:
            base[r] = "missing"  # its ParamsBuilt does not list the row
        elif r in verified and (passed is not None or failed is not None):
            base[r] = "same"  # verified, and no mismatch names this rank
        else:
            base[r] = "pending"
    rank_set = set(ranks)
    base_counts = Counter(base[r] for r in base if r in rank_set)
    anonymous = len(ranks) - sum(base_counts.values())  # ranks not heard from: pending

    rows: list[Row] = []
    for key in sorted(first_index, key=lambda k: (kinds[k] != "param", first_index[k][1],
                                                   first_index[k][0], k)):
        per_rank = entries.get(key, {})
        holders = {r: v for r, v in per_rank.items() if v.get("present") != "missing"}
        differing: set[str] = set()
        rank_fields: dict[int, set[str]] = {r: set(f) for r, f in flagged.get(key, {}).items()}
        # ParamsBuilt's index shifts after an entry missing on a rank; verification reports
        # true reorderings as "order", so the index alone never flags a cell
        all_fields = {f for v in holders.values() for f in v if f not in ("present", "index")}
        for f in all_fields:
            groups = group_ranks({r: v[f] for r, v in holders.items() if f in v})
            if len(groups) > 1:
                differing.add(f)
                for _, rs in groups[1:]:
                    for r in rs:
                        rank_fields.setdefault(r, set()).add(f)
        known: dict[int, CellStatus] = {}
        counts: Counter[CellStatus] = Counter(base_counts)
        counts["pending"] += anonymous
        for r in sorted((per_rank.keys() | rank_fields.keys()) & rank_set):
            fields = rank_fields.get(r, set())
            cell: CellStatus
            if per_rank.get(r, {}).get("present") == "missing" or "present" in fields:
                cell = "missing"
            elif r in holders:
                cell = "differs" if fields else "same"
            else:
                cell = base.get(r, "pending")
            known[r] = cell
            counts[base.get(r, "pending")] -= 1
            counts[cell] += 1
        if counts["missing"]:
            differing.add("present")
        for fields in rank_fields.values():
            differing |= fields
        kind = kinds[key]
        rows.append(Row(kind, first_index[key][1], key.split(":", 1)[1], known,
                        {r: dict(v) for r, v in per_rank.items()},
                        tuple(f for f in FIELD_ORDER if f in differing),
                        {c: n for c, n in counts.items() if n}, base, ranks))

    state: MatrixState
    if failed is not None:
        state = "failed"
    elif passed is not None and len(verified) >= len(ranks):
        state = "passed"
    elif any(s.verify_started is not None for s in states.values()) or verified:
        state = "verifying"
    elif any(s.broadcast_started is not None or s.maps for s in states.values()):
        state = "unverified"  # init_sync=False: DDP skipped verification and broadcast
    else:
        state = "waiting"
    matrix = Matrix(ranks, world_size if world_size is not None else (failed.world_size if failed
                    else None), tuple(rows), state, passed.digest if passed else "",
                    tuple(notes), "", base)
    return matrix._replace(verdict=verdict(matrix, states))


def verdict(m: Matrix, states: Mapping[int, RankState]) -> str:
    """One line: what the verification concluded (or how far it got)."""
    n_params = sum(r.kind == "param" for r in m.rows)
    n_buffers = len(m.rows) - n_params
    world = m.world_size or len(m.ranks)
    bad = [r for r in m.rows if r.status in ("differs", "missing")]
    if m.state == "failed":
        head = f"✘ the model differs across {world} ranks: "
        parts = []
        if bad:
            first = bad[0]
            what = "parameter" if first.kind == "param" else "buffer"
            fields = ", ".join(f for f in first.differing if f != "present")
            missing = first.ranks_with("missing")
            how = "missing on " + format_ranks(missing) if missing else f"{fields} differs"
            parts.append(f"{what} {first.position} '{first.name}' {how}")
            if len(bad) > 1:
                more = len(bad) - 1
                parts.append(f"{more} more row{'s differ' if more > 1 else ' differs'}")
        parts += list(m.notes)
        return head + "; ".join(parts)
    if m.state == "passed":
        return (f"✔ identical on all {world} ranks: {n_params} parameters, {n_buffers} buffers "
                f"(digest {m.digest})")
    if m.state == "verifying":
        done = sorted(r for r, s in states.items() if s.verify_result is not None)
        return (f"… verifying across {world} ranks: {len(done)} of {world} have a result "
                f"({n_params} parameters, {n_buffers} buffers)")
    if m.state == "unverified":
        same = not bad
        return (f"{'✔' if same else '✘'} init_sync=False: no verification ran; the parameter "
                f"lists {'agree' if same else 'differ'} on the {len(m.ranks)} ranks that "
                "reported")
    if m.rows:
        return f"… parameters built on {format_ranks(sorted(states))}; waiting for verification"
    return "… waiting for the ranks to build DistributedDataParallel"
