"""A replicas_diverged finding's per-tensor groups (issue #37, M6): the replica view once read
them back from the detail text and listed every rank of "ranks 0-100000000" (a 3 KB trace
reached MemoryError at 3.9 GB). Findings now carry them as data (`Finding.tensors`, rank
spans, bounded by limits.py) that survives files and the wire and agrees with the text; older
traces' text is read as spans cut at the rank bound. Bombs open in a child process under a
2 GiB address-space cap and a time cap."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.findings import Finding, replica_groups, tensor_groups
from ddpviz.limits import MAX_WORLD_SIZE
from ddpviz.probes.replica_verdict import RankState, judge
from ddpviz.traces.trace import Trace, TraceError
from ddpviz.transport.codec import Codec, WireError, make_header
from ddpviz.widgets.replica_matrix import replica_matrix
from tests.security.bombs import write
from tests.widgets.streams import synthetic_run

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 2 << 30
TIME_CAP_S = 120  # the dashboard opens in seconds on an idle machine
SECRET = b"0123456789abcdef0123456789abcdef"
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight"]

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from ddpviz.traces.trace import Trace
from ddpviz.model.event_model import EventModel
from ddpviz.widgets.replica_matrix import replica_matrix
trace = Trace.load(sys.argv[1])
d = trace.dashboard()
model = EventModel()
model.feed(trace)
m = replica_matrix(model.findings())
print(json.dumps({"columns": [label for label, _ in m.columns],
                  "rows": [r.name for r in m.rows], "findings": len(d.findings)}))
"""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _open_in_child(path: Path) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          preexec_fn=_cap_memory, capture_output=True, text=True,
                          timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return shown


def _trace_with(finding: Finding) -> list[ev.Event]:
    events = synthetic_run(2, 2, 1)
    events.append(ev.FindingReported(0, 0, events[-1].t_ns + 1, 10_000, finding))
    return events


def text_only(detail: tuple[str, ...], world_size: int = 2) -> Finding:
    """A replicas_diverged finding as traces before `Finding.tensors` hold it: text only."""
    return Finding(kind="replicas_diverged", severity="error", title="replicas diverged",
                   ranks=(1,), name="w", field="parameter", step=0, world_size=world_size,
                   detail=detail)


def issue_trace(path: Path) -> Path:
    """The issue's trace: one detail line claiming ranks 0-100000000 (3 KB)."""
    line = "w: ranks 0-100000000: norm 1, sum |x| 1; rank 1: norm 2, sum |x| 2"
    return write(path, _trace_with(text_only((line,))))


def _state(values: list[int]) -> RankState:
    return RankState(params=[(v, v) for v in values],
                     param_stats=[(float(v), 1.0) for v in values],
                     grads=[(1, 1)] * len(values), grad_stats=[(0.0, 0.0)] * len(values),
                     buffers=[(5, 5)], buffer_stats=[(1.0, 1.0)], buffer_names=["bn.mean"],
                     synced=True)


def judged(world: int, odd: dict[int, list[int]]) -> Finding:
    states = {r: _state(odd.get(r, [1, 2, 3])) for r in range(world)}
    found = judge(7, states, param_names=NAMES, broadcast_buffers=True, last_agreed=6,
                  precise=False, world_size=world)
    assert found is not None
    return found


@pytest.mark.timeout(TIME_CAP_S + 60)
def test_the_issue_trace_opens_in_the_dashboard_within_the_caps(tmp_path: Path) -> None:
    path = issue_trace(tmp_path / "ranks.ddpviz")
    assert path.stat().st_size < 4_000
    shown = _open_in_child(path)
    # the claim is cut at the rank bound, kept as spans: two columns, not 10**8 cells
    assert shown["columns"] == [f"0, 2-{MAX_WORLD_SIZE - 1}", "1"]
    assert shown["rows"] == ["w"]  # (the panel's words: tests/browser/test_lab_trace_view.py)


def test_text_is_read_as_spans_cut_at_the_rank_bound() -> None:
    top = MAX_WORLD_SIZE - 1
    assert tensor_groups("w: ranks 0-100000000: a; rank 1: b") == (
        "w", [(((0, top),), "a"), (((1, 1),), "b")])
    assert tensor_groups("w: ranks 0-1,5,3-2," + "9" * 5000 + ": a") == (
        "w", [(((0, 1), (5, 5)), "a")])  # "3-2" and past the bound name no rank
    assert tensor_groups("w: ranks 0-x: a") is None
    assert tensor_groups("no ranks here") is None


@pytest.mark.parametrize("odd", [{1: [1, 9, 3], 2: [1, 8, 4]}, {5: [1, 9, 3], 30: [7, 2, 3]}])
def test_structured_groups_agree_with_the_text_and_survive_file_and_wire(
        tmp_path: Path, odd: dict[int, list[int]]) -> None:
    world = 3 if 2 in odd else 40
    found = judged(world, odd)
    assert found.tensors, "the replica check fills Finding.tensors"
    # the same groups as the detail lines (what traces before `tensors` are read from)
    from_text = [g for g in map(tensor_groups, found.detail) if g is not None]
    assert replica_groups(found) == from_text
    assert [name for name, _ in found.tensors] == [name for name, _ in from_text]
    # through a trace file
    loaded = Trace.load(write(tmp_path / "t.ddpviz", _trace_with(found)))
    reported = [e.finding for e in loaded if isinstance(e, ev.FindingReported)]
    assert reported == [found]
    # and through the wire
    codec = Codec(SECRET)
    report = ev.FindingReported(0, 7, 1, 0, found)
    frame = codec.decode(codec.encode(make_header("events", 0, "s", 0, count=1), [report]))
    assert [e.finding for e in frame.events] == [found]  # type: ignore[attr-defined]
    # the view reads the same matrix from either
    legacy = msgspec.structs.replace(found, tensors=())
    new, old = replica_matrix([found]), replica_matrix([legacy])
    assert new.columns == old.columns
    assert [(r.name, dict(r.cells), r.sizes) for r in new.rows] == \
        [(r.name, dict(r.cells), r.sizes) for r in old.rows]


def test_structured_groups_out_of_bounds_are_rejected_by_file_and_wire(tmp_path: Path) -> None:
    bad = [((("a", ((3, 1),)),),), ((("a", ((0, MAX_WORLD_SIZE),)),),)]
    for i, (held,) in enumerate(bad):
        finding = msgspec.structs.replace(text_only(()), tensors=(("w", held),))
        with pytest.raises(TraceError):
            Trace.load(write(tmp_path / f"bad{i}.ddpviz", _trace_with(finding)))
        codec = Codec(SECRET)
        parts = codec.encode(make_header("events", 0, "s", 0, count=1),
                             [ev.FindingReported(0, 0, 1, 0, finding)])
        with pytest.raises(WireError):
            codec.decode(parts)


@pytest.mark.timeout(TIME_CAP_S + 60)
def test_many_rows_over_many_spans_open_within_the_caps(tmp_path: Path) -> None:
    """Within the limits, but a product: 64 findings of 1,024 rows claiming every rank, plus a
    row splitting the ranks into 20,000 pieces (columns are grouped row by row)."""
    pieces = tuple(("x", ((r, r),)) for r in range(0, 40_000, 2))
    split = msgspec.structs.replace(text_only((), MAX_WORLD_SIZE),
                                    tensors=(("split", pieces),))
    everyone = (("a", ((0, MAX_WORLD_SIZE - 1),)),)
    rows = msgspec.structs.replace(text_only((), MAX_WORLD_SIZE),
                                   tensors=tuple((f"t{i}", everyone) for i in range(1024)))
    events = _trace_with(split)
    events += [ev.FindingReported(0, 0, events[-1].t_ns + 2 + i, 20_000 + i, rows)
               for i in range(64)]
    path = write(tmp_path / "rows.ddpviz", events)
    assert path.stat().st_size < 2_000_000
    shown = _open_in_child(path)
    assert len(shown["rows"]) == 1 + 64 * 1024  # type: ignore[arg-type]
    assert len(shown["columns"]) == 20_001  # type: ignore[arg-type]  # (the panel draws 64)


def _per_rank_matrix(findings: list[Finding], many: int = 16
                     ) -> tuple[list[dict[int, str]], list[str]]:
    """The matrix as the view built it before spans: a dict per row, rank by rank (small
    inputs only), columns by value_groups."""
    from ddpviz.model.rank_groups import rank_label, value_groups

    rows: list[dict[int, str]] = []
    world = 0
    for f in findings:
        world = max(world, f.world_size)
        for _, groups in replica_groups(f):
            cells: dict[int, str] = {}
            for k, (spans, _) in enumerate(groups):
                for lo, hi in spans:
                    cells.update(dict.fromkeys(range(lo, hi + 1), chr(ord("A") + k)))
            rows.append(cells)
    everyone = sorted(set().union(*rows, range(world)))
    if len(everyone) <= many:
        return rows, [str(r) for r in everyone]
    pattern = {r: tuple(row.get(r, "") for row in rows) for r in everyone}
    return rows, [rank_label(g.ranks) for g in value_groups(pattern)]


def test_spans_give_the_matrix_ranks_gave_overlaps_included() -> None:
    import random

    rng = random.Random(37)
    for _ in range(300):
        findings = []
        for _ in range(rng.randint(1, 3)):
            lines = []
            for t in range(rng.randint(1, 4)):
                groups = []
                for g in range(rng.randint(1, 4)):
                    items = []
                    for _ in range(rng.randint(1, 3)):
                        lo = rng.randint(0, 40)
                        items.append(f"{lo}-{lo + rng.randint(-2, 12)}" if rng.random() < 0.5
                                     else str(lo))
                    groups.append(f"ranks {','.join(items)}: v{g}")
                lines.append(f"t{t}: " + "; ".join(groups))
            findings.append(text_only(tuple(lines), rng.choice([0, 2, 20, 45])))
        m = replica_matrix(findings)
        rows, labels = _per_rank_matrix(findings)
        assert [dict(r.cells) for r in m.rows] == rows
        assert [label for label, _ in m.columns] == labels
