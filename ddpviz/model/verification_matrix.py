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
cells per row. Ranks that list the same parameters share their cells and values too (one entry
per class of such ranks: see [Note: matrix by rank class]).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

from ddpviz import events as ev
from ddpviz.findings import format_ranks, group_ranks
from ddpviz.model.event_model import RankState

CellStatus = Literal["same", "differs", "missing", "pending"]
_V = TypeVar("_V")
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
    known: Mapping[int, CellStatus]  # the cells of the ranks this row names
    values: Mapping[int, dict[str, str]]  # rank -> field -> value, for ranks holding it
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


MAX_CLASSES = 8  # distinct parameter lists a rank's is compared with (past them: its own class)


def _rank_classes(states: Mapping[int, RankState]) -> list[tuple[ev.ParamsBuilt, list[int]]]:
    """The ranks with a ParamsBuilt, by the parameters and buffers it lists: (the lowest rank's
    event, the ranks listing the same), lowest rank first. A trace keeps one copy of a list
    every rank reports alike (ddpviz/traces/columns.py's Shared), so this is mostly an
    identity test."""
    classes: list[tuple[ev.ParamsBuilt, list[int]]] = []
    for r, s in sorted(states.items()):
        if s.params is None:
            continue
        built = s.params.event
        assert isinstance(built, ev.ParamsBuilt)
        for rep, members in classes[:MAX_CLASSES]:
            if _same(rep.params, built.params) and _same(rep.buffers, built.buffers):
                members.append(r)
                break
        else:
            classes.append((built, [r]))
    return classes


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return a is b or a == b


class _ByClass(Mapping[int, _V]):
    """A row's cells or values where every rank of a class (`_rank_classes`) has its class's:
    a row costs one entry per class, not one per rank. Reads like the dict of rank -> value
    it stands for (and equals it)."""

    __slots__ = ("_class_of", "_of", "_ranks")

    def __init__(self, class_of: Mapping[int, int], of: dict[int, _V],
                 ranks: tuple[int, ...]) -> None:
        self._class_of, self._of, self._ranks = class_of, of, ranks  # ranks: sorted

    def __getitem__(self, rank: int) -> _V:
        c = self._class_of.get(rank)
        if c is None or c not in self._of:
            raise KeyError(rank)
        return self._of[c]

    def get(self, rank: int, default: Any = None) -> Any:
        c = self._class_of.get(rank)
        return default if c is None else self._of.get(c, default)

    def __contains__(self, rank: object) -> bool:
        c = self._class_of.get(rank)  # type: ignore[call-overload]
        return c is not None and c in self._of

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)

    def __repr__(self) -> str:
        return repr(dict(self))


# [Note: matrix by rank class]
# A trace of 256 ranks x 10,000 parameters holds 2.56M (rank, parameter) entries, and building
# a dict of values per entry took ~20 s and 2 GB. Ranks whose ParamsBuilt lists the same
# parameters and buffers (every rank of a healthy run: one class) have the same values in every
# row, so a row that no verification mismatch names is computed per class: the fields that
# differ are grouped by value with each class weighted by its ranks (what `group_ranks` gives
# over the ranks themselves: most ranks first, ties by the lowest rank), and the row's `known`
# and `values` are `_ByClass` mappings. A row a mismatch names (a few) is built per rank as
# before. `build_matrix(..., grouped=False)` builds every row per rank: tests hold both equal.
def build_matrix(states: Mapping[int, RankState], world_size: int | None = None, *,
                 grouped: bool = True) -> Matrix:
    """The matrix for the constructor facts in `states` (from `EventModel.construction`).
    See [Note: matrix by rank class]; `grouped=False` builds every row rank by rank."""
    ranks = tuple(sorted(set(states) | set(range(world_size or 0))))
    first_index: dict[str, tuple[int, int]] = {}  # key -> (lowest rank, index there)
    kinds: dict[str, Literal["param", "buffer"]] = {}
    listed: dict[int, set[str]] = {}  # ranks whose ParamsBuilt we have -> keys they hold

    def note(key: str, kind: Literal["param", "buffer"], rank: int, index: int) -> None:
        kinds[key] = kind
        if key not in first_index or (rank, index) < first_index[key]:
            first_index[key] = (rank, index)

    classes = _rank_classes(states)
    class_values: list[dict[str, dict[str, str]]] = []  # class -> key -> values
    holding: dict[str, list[int]] = {}  # key -> the classes holding it, in class order
    class_of: dict[int, int] = {}
    for c, (built, members) in enumerate(classes):
        low = members[0]
        values: dict[str, dict[str, str]] = {}
        for p in built.params:
            key = f"param:{p.name}"
            note(key, "param", low, p.index)
            values[key] = {
                "index": str(p.index), "shape": _shape(p.shape), "dtype": p.dtype,
                "device": p.device.split(":")[0], "sparse_grad": str(p.sparse_grad)}
        for i, name in enumerate(built.buffers):
            key = f"buffer:{name}"
            note(key, "buffer", low, i)
            values[key] = {"index": str(i)}
        class_values.append(values)
        held = set(values)
        for key in values:
            holding.setdefault(key, []).append(c)
        for r in members:
            listed[r] = held
            class_of[r] = c

    def per_rank(key: str) -> dict[int, dict[str, str]]:
        """The row's values rank by rank (copies), lowest rank first."""
        return {r: dict(class_values[class_of[r]][key]) for r in sorted(
            r for c in holding.get(key, ()) for r in classes[c][1])}

    entries: dict[str, dict[int, dict[str, str]]] = {}  # rows built rank by rank

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
            holding_ranks = [r for v, rs in m.values for r in rs if v != "missing"]
            note(key, kind, min(holding_ranks) if holding_ranks else 0, m.index)
            row_values = entries.get(key)
            if row_values is None:
                row_values = entries[key] = per_rank(key)
            for value, rs in m.values:
                for r in rs:
                    row_values.setdefault(r, {})[m.field] = value
                    if m.field == "present" and value == "missing":
                        row_values[r] = {"present": "missing"}
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
    sizes = [len(members) for _, members in classes]
    members_of: dict[tuple[int, ...], tuple[int, ...]] = {}  # holding classes -> their ranks

    rows: list[Row] = []
    for key in sorted(first_index, key=lambda k: (kinds[k] != "param", first_index[k][1],
                                                   first_index[k][0], k)):
        kind = kinds[key]
        name = key.split(":", 1)[1]
        row_values = entries.get(key)
        if row_values is None and grouped:
            rows.append(_class_row(kind, first_index[key][1], name, holding.get(key, []),
                                   [class_values[c][key] for c in holding.get(key, [])],
                                   classes, sizes, class_of, members_of, base, base_counts,
                                   anonymous, ranks))
            continue
        if row_values is None:
            row_values = per_rank(key)
        rows.append(_rank_row(kind, first_index[key][1], name, row_values,
                              flagged.get(key, {}), base, base_counts, anonymous, rank_set,
                              ranks))

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


def _rank_row(kind: Literal["param", "buffer"], position: int, name: str,
              per_rank: dict[int, dict[str, str]], flagged: dict[int, set[str]],
              base: dict[int, CellStatus], base_counts: Counter[CellStatus], anonymous: int,
              rank_set: set[int], ranks: tuple[int, ...]) -> Row:
    """One row from its values rank by rank (a row a mismatch names, or grouped=False)."""
    holders = {r: v for r, v in per_rank.items() if v.get("present") != "missing"}
    differing: set[str] = set()
    rank_fields: dict[int, set[str]] = {r: set(f) for r, f in flagged.items()}
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
    return Row(kind, position, name, known, {r: dict(v) for r, v in per_rank.items()},
               tuple(f for f in FIELD_ORDER if f in differing),
               {c: n for c, n in counts.items() if n}, base, ranks)


def _class_row(kind: Literal["param", "buffer"], position: int, name: str, holding: list[int],
               values: list[dict[str, str]], classes: list[tuple[ev.ParamsBuilt, list[int]]],
               sizes: list[int], class_of: dict[int, int],
               members_of: dict[tuple[int, ...], tuple[int, ...]],
               base: dict[int, CellStatus], base_counts: Counter[CellStatus], anonymous: int,
               ranks: tuple[int, ...]) -> Row:
    """One row no mismatch names, class by class: what `_rank_row` gives for the ranks of
    the classes `holding` it (`values`: each one's). See [Note: matrix by rank class]."""
    differing: set[str] = set()
    class_fields: dict[int, set[str]] = {}
    if len(holding) > 1:
        all_fields = {f for v in values for f in v if f not in ("present", "index")}
        for f in all_fields:
            by_value: dict[str, list[int]] = {}
            for c, v in zip(holding, values, strict=True):
                if f in v:
                    by_value.setdefault(v[f], []).append(c)
            if len(by_value) > 1:
                differing.add(f)
                groups = sorted(by_value.values(), key=lambda cs: (
                    -sum(sizes[c] for c in cs), min(classes[c][1][0] for c in cs)))
                for cs in groups[1:]:
                    for c in cs:
                        class_fields.setdefault(c, set()).add(f)
    counts: Counter[CellStatus] = Counter(base_counts)
    counts["pending"] += anonymous
    cells: dict[int, CellStatus] = {}
    for c in holding:
        cell: CellStatus = "differs" if c in class_fields else "same"
        cells[c] = cell
        counts["missing"] -= sizes[c]  # the base of a rank with a ParamsBuilt
        counts[cell] += sizes[c]
    if counts["missing"]:
        differing.add("present")
    key = tuple(holding)
    members = members_of.get(key)
    if members is None:
        members = members_of[key] = tuple(sorted(r for c in holding for r in classes[c][1]))
    return Row(kind, position, name, _ByClass(class_of, cells, members),
               _ByClass(class_of, dict(zip(holding, values, strict=True)), members),
               tuple(f for f in FIELD_ORDER if f in differing),
               {c: n for c, n in counts.items() if n}, base, ranks)


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
