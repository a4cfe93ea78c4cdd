"""The viewer's verification matrix (extension/src/verificationMatrix.ts) is Python's
(`build_matrix` in ddpviz/model/verification_matrix.py, over `Trace.model()`): the same rows,
cells per rank, values, differing fields, notes and verdict, for the same `.ddpviz` files,
parsed and folded in node. Runs: identical ranks, a shape planted on one rank, a missing
parameter, a rank not heard from, buffers that differ, init_sync=False, 256 ranks with one odd
rank, a model of 1,000 parameters, random constructors (every kind of defect a rank's list can
have) and a real 2-rank gloo run. The columns (ranks grouped above MANY_RANKS) and the rows
drawn (bounded, the differing ones kept) equal the deleted VerificationView's rules, restated
here; and the drawn table (a stand-in DOM) has a cell per row and column with its status and a
title naming the values."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ddpviz import events as ev
from ddpviz.events import Mismatch
from ddpviz.model.rank_groups import MANY_RANKS
from ddpviz.model.verification_matrix import Matrix, Row, build_matrix
from ddpviz.traces.trace import Trace
from tests.extension.mirror import run_typescript
from tests.model.random_constructors import random_constructor
from tests.widgets.streams import Plant, synthetic_run

MAX_ROWS = 40  # verificationMatrix.ts's (the deleted VerificationView's max_rows)
MAX_COLUMNS = 64

# A stand-in for the browser's document: h() only creates elements, sets attributes and
# appends children; the tree comes back as [tag, attrs, children] with strings as text.
_DOM = """(() => {
  const el = tag => ({ tag, attrs: {}, children: [],
    setAttribute(k, v) { this.attrs[k] = String(v); },
    append(x) { this.children.push(x); } });
  globalThis.document = { createElement: el };
  const tree = x => typeof x === 'string' ? x : [x.tag, x.attrs, x.children.map(tree)];
  return tree;
})()"""

OUT = """cases.map(c => {
  const model = new (load('./eventModel').TraceModel)(
    load('./trace').parseTrace(new Uint8Array(fs.readFileSync(c.path)), c.path));
  const m = g.verificationMatrix(model);
  const tree = """ + _DOM + """;
  const drawn = c.draw ? g.renderVerificationMatrix(model) : null;
  return {
    ranks: m.ranks, world: m.worldSize, state: m.state, digest: m.digest, notes: m.notes,
    verdict: m.verdict, base: [...m.base].sort((a, b) => a[0] - b[0]),
    rows: m.rows.map(r => [r.kind, r.position, r.name, r.differing,
      Object.fromEntries(r.counts), r.status, m.ranks.map(k => r.cell(k)),
      m.ranks.map(k => { const v = r.values(k); return v ? Object.fromEntries(v) : null; })]),
    columns: g.matrixColumns(m), shown: g.shownRows(m).map(r => r.key),
    limits: [g.MAX_ROWS, g.MAX_COLUMNS],
    drawn: drawn === null ? null : tree(drawn) };
})"""


def python_side(m: Matrix) -> dict[str, Any]:
    def values(row: Row, r: int) -> dict[str, str] | None:
        v = row.values.get(r)
        return None if v is None else dict(v)

    return {
        "ranks": list(m.ranks), "world": m.world_size, "state": m.state, "digest": m.digest,
        "notes": list(m.notes), "verdict": m.verdict,
        "base": [[r, c] for r, c in sorted(m.base.items())],
        "rows": [[row.kind, row.position, row.name, list(row.differing), dict(row.counts),
                  row.status, list(row.cells), [values(row, r) for r in m.ranks]]
                 for row in m.rows],
        "columns": [list(g) for g in columns(m)],
        "shown": [row.key for row in shown_rows(m)],
    }


def columns(m: Matrix, many: int = MANY_RANKS) -> list[tuple[int, ...]]:
    """The deleted VerificationView.columns(), grouped above `many` ranks: groups of ranks
    identical on every row (cell and differing fields' values), by lowest rank."""
    if len(m.ranks) <= many:
        return [(r,) for r in m.ranks]
    odd = [row for row in m.rows if row.differing or row.status != "same"]
    departs: dict[int, list[tuple[int, str]]] = {}
    for i, row in enumerate(odd):
        blank = "|" * max(len(row.differing) - 1, 0)
        for r, cell in row.known.items():
            entry = cell + "|" + "|".join(row.values.get(r, {}).get(f, "")
                                          for f in row.differing)
            if entry != m.base.get(r, "pending") + "|" + blank:
                departs.setdefault(r, []).append((i, entry))
    groups: dict[tuple[object, ...], list[int]] = {}
    for r in m.ranks:
        groups.setdefault((m.base.get(r, "pending"), *departs.get(r, ())), []).append(r)
    return sorted((tuple(rs) for rs in groups.values()), key=lambda g: g[0])


def shown_rows(m: Matrix, most: int = MAX_ROWS) -> list[Row]:
    """The deleted VerificationView.shown_rows(): every row not "same" first, in order, then
    as many "same" rows as fit, in order."""
    rows = m.rows
    if len(rows) <= most:
        return list(rows)
    bad = [i for i, row in enumerate(rows) if row.status != "same"][:most]
    good = [i for i, row in enumerate(rows) if row.status == "same"][: most - len(bad)]
    return [rows[i] for i in sorted(bad + good)]


def _buffers_differ() -> list[ev.Event]:
    params = (ev.ParamInfo(0, "fc.weight", (4, 4), "float32", "cpu", False),)
    bad = Mismatch("buffer", 0, "bn.running_mean", "shape", (("(4,)", (0, 2)), ("(5,)", (1,))))
    out: list[ev.Event] = []
    for r in range(3):
        out += [ev.ParamsBuilt(r, -1, 10 + r, 0, params, ("bn.running_mean", "bn.n"), ()),
                ev.VerificationStarted(r, -1, 20 + r, 1, 3, 1, 2),
                ev.VerificationFailed(r, -1, 30 + r, 2, 3, (bad,))]
    return out


def _unverified() -> list[ev.Event]:
    """init_sync=False: parameters built and buckets assigned, no verification; rank 1 lists
    one parameter more."""
    params = [ev.ParamInfo(i, f"w{i}", (3, i + 1), "float32", "cpu", False) for i in range(3)]
    out: list[ev.Event] = []
    for r in range(2):
        mine = params + ([ev.ParamInfo(3, "extra", (2,), "float32", "cpu", False)] if r else [])
        out += [ev.ParamsBuilt(r, -1, 10 + r, 0, tuple(mine), (), ()),
                ev.BucketAssigned(r, -1, 20 + r, 1, ((0, 1, 2),), (1 << 20,), False)]
    return out


def _real_rank(rank: int, world_size: int, odd: bool) -> list[ev.Event]:
    """ddpviz's DDP on a model with a buffer; with `odd`, rank 1's second layer is wider (its
    verification fails, and the constructor raises on every rank)."""
    import torch
    from torch import nn

    import ddpviz

    torch.manual_seed(0)
    width = 17 if odd and rank == 1 else 16
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, width))
    events: list[ev.Event] = []
    try:
        ddp = ddpviz.DistributedDataParallel(model, emitter=events.append)
    except RuntimeError:
        return events
    ddp(torch.randn(4, 8)).sum().backward()
    return events


PLANTED: dict[str, Any] = {
    "identical": lambda: synthetic_run(3, 6, 1),
    "shape": lambda: synthetic_run(3, 6, 1, plant=Plant(shape={1: (2, (5, 16))})),
    "missing": lambda: synthetic_run(2, 6, 1, plant=Plant(missing={1: 3})),
    "pending": lambda: [e for e in synthetic_run(2, 4, 1) if e.rank == 0 and e.step == -1][:2],
    "buffers": _buffers_differ,
    "unverified": _unverified,
    "nothing": lambda: [ev.ForwardStarted(0, 0, 1_000, 0)],
    "20 ranks": lambda: synthetic_run(20, 4, 0, buffers=("bn.n",),
                                      plant=Plant(shape={7: (0, (3, 16))})),
    "256 ranks": lambda: synthetic_run(256, 20, 0, plant=Plant(shape={128: (4, (3, 16))})),
    "large model": lambda: synthetic_run(4, 1000, 0, plant=Plant(shape={2: (777, (1, 16))})),
}


def _save(events: list[ev.Event], path: Path) -> str:
    return str(Trace(events).save(path))


def _compare(paths: list[str], draw: bool = False) -> list[dict[str, Any]]:
    got = run_typescript("verificationMatrix.ts", OUT,
                         [{"path": p, "draw": draw} for p in paths])
    for path, ts in zip(paths, got, strict=True):
        model = Trace.load(path).model()
        py = python_side(build_matrix(model.construction(), model.world_size))
        drawn = ts.pop("drawn")
        assert ts.pop("limits") == [MAX_ROWS, MAX_COLUMNS]
        for key in py:
            assert ts[key] == py[key], (path, key)
        ts["drawn"] = drawn
    return got


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("vm")
    paths = [_save(make(), root / f"{i}.ddpviz") for i, make in enumerate(PLANTED.values())]
    return dict(zip(PLANTED, _compare(paths, draw=True), strict=True))


def test_the_planted_runs_give_pythons_matrix(planted: dict[str, dict[str, Any]]) -> None:
    # (equality with Python is checked in the fixture; here: the runs plant what they say)
    cells = {r[2]: r[6] for r in planted["shape"]["rows"]}
    assert cells["1.weight"] == ["same", "differs", "same"]
    assert all(c == ["same"] * 3 for n, c in cells.items() if n != "1.weight")
    assert "parameter 2 '1.weight' shape differs" in planted["shape"]["verdict"]
    cells = {r[2]: r[6] for r in planted["missing"]["rows"]}
    assert cells["1.bias"] == ["same", "missing"] and cells["2.weight"] == ["same", "same"]
    assert planted["missing"]["notes"] == ["count of parameters: rank 0: 6; rank 1: 5"]
    assert {tuple(r[6]) for r in planted["pending"]["rows"]} == {("same", "pending")}
    assert planted["pending"]["verdict"].startswith("… verifying across 2 ranks: 0 of 2")
    assert [r[6] for r in planted["buffers"]["rows"] if r[2] == "bn.running_mean"] == \
        [["same", "differs", "same"]]
    assert planted["unverified"]["state"] == "unverified"
    assert planted["nothing"]["rows"] == [] and planted["nothing"]["drawn"] is None
    assert planted["256 ranks"]["columns"] == [[*range(128), *range(129, 256)], [128]]
    assert planted["20 ranks"]["columns"] == [[*range(7), *range(8, 20)], [7]]
    large = planted["large model"]
    assert len(large["shown"]) == MAX_ROWS and "param:388.bias" in large["shown"]


def _find(node: Any, pred: Any) -> list[Any]:
    if isinstance(node, str):
        return []
    found = [node] if pred(node) else []
    for child in node[2]:
        found += _find(child, pred)
    return found


def _text(node: Any) -> str:
    return node if isinstance(node, str) else "".join(_text(c) for c in node[2])


def _cls(node: Any) -> list[str]:
    return node[1].get("class", "").split()


def test_the_table_draws_a_cell_per_row_and_column(planted: dict[str, dict[str, Any]]) -> None:
    for ts in planted.values():
        if ts["drawn"] is None:
            continue
        (table,) = _find(ts["drawn"], lambda n: n[0] == "table" and "ddpviz-vm" in _cls(n))
        trs = _find(table, lambda n: n[0] == "tr" and "data-name" in n[1])
        assert [f"{tr[1]['data-kind']}:{tr[1]['data-name']}" for tr in trs] == ts["shown"]
        heads = _find(table, lambda n: n[0] == "th" and "data-ranks" in n[1])
        assert [int(h[1]["data-count"]) for h in heads] == [len(g) for g in ts["columns"]]
        rows = {f"{r[0]}:{r[2]}": r for r in ts["rows"]}
        for tr in trs:
            row = rows[f"{tr[1]['data-kind']}:{tr[1]['data-name']}"]
            assert tr[1]["data-status"] == row[5]
            tds = [td for td in tr[2] if "data-status" in td[1]]
            assert len(tds) == len(ts["columns"])
            for td, group in zip(tds, ts["columns"], strict=True):
                status = row[6][ts["ranks"].index(group[0])]
                assert td[1]["data-status"] == status and _cls(td) == [f"ddpviz-vm-{status}"]
                assert td[1]["title"]
        (verdict,) = _find(ts["drawn"], lambda n: "ddpviz-vm-verdict" in _cls(n))
        assert _text(verdict) == ts["verdict"] and verdict[1]["data-state"] == ts["state"]
    shape = planted["shape"]["drawn"]
    differs = _find(shape, lambda n: n[0] == "td" and n[1].get("data-status") == "differs")
    assert len(differs) == 1
    assert differs[0][1]["title"] == ("rank 1: index=2 shape=(5, 16) dtype=float32 device=cpu "
                                      "sparse_grad=False · differs in: shape")
    (detail,) = _find(shape, lambda n: "ddpviz-vm-detail" in _cls(n))
    assert detail[1]["data-name"] == "1.weight"
    assert "ranks 0,2: index=2 shape=(16, 16)" in _text(detail)
    assert "rank 1: index=2 shape=(5, 16)" in _text(detail)
    missing = _find(planted["missing"]["drawn"],
                    lambda n: n[0] == "td" and n[1].get("data-status") == "missing")
    assert [td[1]["title"] for td in missing] == ["rank 1: missing"]
    heads = _find(planted["256 ranks"]["drawn"], lambda n: n[0] == "th" and "title" in n[1])
    assert [_text(h) for h in heads] == ["255 ranks: 0-127, 129-255", "r128"]
    more = _find(planted["large model"]["drawn"], lambda n: "ddpviz-vm-more" in _cls(n))
    assert [_text(n) for n in more] == ["… and 960 more rows, the same on every rank"]


def test_random_constructors_give_pythons_matrix(tmp_path: Path) -> None:
    paths = []
    for seed in range(40):
        rng = random.Random(seed)
        world = rng.choice([1, 2, 3, 5, 12, 20])
        events = random_constructor(rng, world, someone=True)
        paths.append(_save(events, tmp_path / f"{seed}.ddpviz"))
    got = _compare(paths)
    assert {ts["state"] for ts in got} >= {"failed", "verifying"}
    assert any(len(ts["columns"]) > 2 and len(ts["ranks"]) > MANY_RANKS for ts in got)


def test_real_two_rank_runs_give_pythons_matrix(tmp_path: Path) -> None:
    from tests.dist.harness import run_ranks

    paths = []
    for odd in (False, True):
        ranks = run_ranks(_real_rank, 2, odd)
        paths.append(_save([*ranks[0], *ranks[1]], tmp_path / f"real{odd}.ddpviz"))
    healthy, odd_one = _compare(paths, draw=True)
    assert healthy["state"] == "passed"
    assert healthy["verdict"].startswith("✔ identical on all 2 ranks: 6 parameters, 3 buffers")
    assert odd_one["state"] == "failed", odd_one["verdict"]
    assert any(r[6] == ["same", "differs"] for r in odd_one["rows"]), odd_one["rows"]
