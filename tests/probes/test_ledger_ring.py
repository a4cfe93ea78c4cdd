"""The ring of each rank's last collectives (ddpviz/probes/ledger_ring.py): what is written
reads back, wrap-around keeps the newest records, a foreign, truncated or hostile file is
rejected with bounded work, a SIGKILLed writer's last record survives, and the comparison over
rings is the live check's (collective_compare.py) on the same entries."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddpviz.engine import comm
from ddpviz.probes import collective_compare, ledger_ring
from ddpviz.probes.collective_compare import Entry, Mark, compare_at
from ddpviz.probes.ledger_ring import (
    GROUPS_BYTES,
    HEADER,
    RING_FILE,
    Ring,
    RingError,
    read_ring,
    read_rings,
    ring_findings,
)

ROOT = Path(__file__).resolve().parents[2]


def ring(folder: Path, rank: int, world: int = 2, **kw: int) -> Ring:
    return Ring(folder / RING_FILE.format(rank=rank), rank, world, job=kw.pop("job", 7), **kw)


def call(r: Ring, pos: int, n: int = 3, step: int = 0, op: str = "all_gather",
         site: str = "t.py:3 in log_metrics", span: int | None = 1) -> int:
    i = r.write("0", (0, 1), pos, step, -1, r.text("0", op, f"float32 x{n} into 2", site))
    if span is not None:
        r.span(i, span)
    return i


def mark(r: Ring, pos: int, step: int, bucket: int = -1) -> None:
    r.write("0", (0, 1), pos, step, bucket, r.text("0"))


def test_the_kinds_of_a_ddp_broadcast_agree_with_the_engines() -> None:
    assert (collective_compare.BUFFERS, collective_compare.EVALUATION) == (
        comm.BUFFERS, comm.EVALUATION)


def test_round_trip(tmp_path: Path) -> None:
    r = ring(tmp_path, 1)
    mark(r, 0, 0)
    call(r, 1, n=4, step=0)
    r.write("g7", (1, 3), 5, 0, 2, r.text("g7", "all_reduce", "float32 x9 max", "a.py:9 in f"),
            forward=comm.BUFFERS, asym=True)
    got = read_ring(tmp_path / RING_FILE.format(rank=1))
    assert (got.rank, got.world, got.job, got.written, got.skipped) == (1, 2, 7, 3, 0)
    assert got.groups == {"0": (0, 1), "g7": (1,)}  # (rank 3 is outside a world of 2)
    assert got.marks == {"0": [Mark(0, 0, -1)]}
    assert got.entries["0"] == [Entry(1, 1, "all_gather", "float32 x4 into 2",
                                      "t.py:3 in log_metrics", 0, False, -1, 0)]
    assert got.entries["g7"] == [Entry(5, -1, "all_reduce", "float32 x9 max", "a.py:9 in f",
                                       0, True, 2, comm.BUFFERS)]


def test_wrap_around_keeps_the_newest_records_in_order(tmp_path: Path) -> None:
    r = ring(tmp_path, 0, slots=8)
    for pos in range(30):
        call(r, pos, n=pos, span=None if pos == 29 else 1)
    r.span(3, 5)  # long overwritten: ignored
    got = read_ring(tmp_path / RING_FILE.format(rank=0))
    assert got.written == 30 and got.skipped == 0
    assert [e.pos for e in got.entries["0"]] == list(range(22, 30))
    assert [e.sig for e in got.entries["0"]] == [f"float32 x{n} into 2" for n in range(22, 30)]
    assert [e.span for e in got.entries["0"]] == [1] * 7 + [-1]


def test_a_long_text_is_cut_to_its_slot(tmp_path: Path) -> None:
    r = ring(tmp_path, 0, slot=128)
    call(r, 0, site="x" * 500 + ".py:1 in f", op="all_reduce" * 10)
    got = read_ring(tmp_path / RING_FILE.format(rank=0))
    assert got.skipped == 0 and got.entries["0"][0].site.endswith(".py:1 in f")


def _header(slot: int = 256, slots: int = 4, rank: int = 0, world: int = 2,
            written: int = 0, groups: int = 0, version: int = 1) -> bytes:
    return struct.pack("<8sIIIIII QQI", b"DDPVZRNG", version, rank, world, slot, slots, 0, 7,
                       written, groups).ljust(HEADER, b"\0")


@pytest.mark.parametrize(("data", "why"), [
    (b"", "not a ddpviz ring"),
    (b"PK\x03\x04" + bytes(200), "not a ddpviz ring"),
    (_header(version=99) + bytes(GROUPS_BYTES + 1024), "format 99"),
    (_header(slot=1 << 31) + bytes(GROUPS_BYTES), "out of bounds"),
    (_header(slots=1 << 31) + bytes(GROUPS_BYTES), "out of bounds"),
    (_header(slots=0) + bytes(GROUPS_BYTES), "out of bounds"),
    (_header(rank=5, world=2) + bytes(GROUPS_BYTES + 1024), "out of bounds"),
    (_header(groups=1 << 30) + bytes(GROUPS_BYTES + 1024), "out of bounds"),
    (_header() + bytes(GROUPS_BYTES + 1000), "truncated"),  # 1024 of slots expected
    (_header() + bytes(GROUPS_BYTES + 5000), "truncated"),
])
def test_a_foreign_or_hostile_file_is_rejected(tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / RING_FILE.format(rank=0)
    path.write_bytes(data)
    with pytest.raises(RingError, match=why):
        read_ring(path)


def test_a_huge_file_is_read_only_up_to_the_bound(tmp_path: Path) -> None:
    path = tmp_path / RING_FILE.format(rank=0)
    with open(path, "wb") as f:  # sparse: 2 GiB said, nothing allocated
        f.write(_header())
        f.truncate(1 << 31)
    with pytest.raises(RingError, match="truncated or padded"):
        read_ring(path)


def test_damaged_slots_are_skipped_and_counted(tmp_path: Path) -> None:
    r = ring(tmp_path, 0, slots=8)
    for pos in range(6):
        call(r, pos)
    r.write("0", (0, 1), 6, 0, -1, b"\x94\xc1\xc1\xc1\xc1")  # undecodable msgpack
    path = tmp_path / RING_FILE.format(rank=0)
    data = bytearray(path.read_bytes())
    base = HEADER + GROUPS_BYTES
    struct.pack_into("<H", data, base + 1 * 256, 60000)  # a length past its slot
    struct.pack_into("<q", data, base + 2 * 256 + 6, 99)  # another record's index
    data[base + 3 * 256 + 40] ^= 0xFF  # a flipped byte in the text
    data[HEADER:HEADER + 4] = b"\xde\xad\xbe\xef"  # the group table
    path.write_bytes(bytes(data))
    got = read_ring(path)
    assert got.skipped == 4 and got.groups == {}
    assert [e.pos for es in got.entries.values() for e in es] == [0, 4, 5]


def test_random_bytes_never_escape_as_anything_but_a_ring_error(tmp_path: Path) -> None:
    rng = random.Random(0)
    path = tmp_path / RING_FILE.format(rank=0)
    good = ring(tmp_path, 0, slots=4)
    for pos in range(6):
        call(good, pos)
    template = path.read_bytes()
    for _ in range(300):
        data = bytearray(template)
        for _ in range(rng.randrange(1, 40)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data))]
        path.write_bytes(bytes(data))
        try:
            got = read_ring(path)
        except RingError:
            continue
        assert got.written >= 0 and sum(map(len, got.entries.values())) <= 4


def test_read_rings_leaves_out_foreign_misnamed_and_other_jobs_files(tmp_path: Path) -> None:
    a, b = ring(tmp_path, 0), ring(tmp_path, 1)
    call(a, 0)
    call(b, 0)
    (tmp_path / RING_FILE.format(rank=2)).write_bytes(b"hello")
    old = tmp_path / "old"
    old.mkdir()
    call(ring(old, 3, world=4, job=1), 0)
    os.replace(old / RING_FILE.format(rank=3), tmp_path / RING_FILE.format(rank=3))
    os.utime(tmp_path / RING_FILE.format(rank=3), (time.time() - 100, time.time() - 100))
    misnamed = ring(old, 0, job=7)
    os.replace(old / RING_FILE.format(rank=0), tmp_path / RING_FILE.format(rank=5))
    del misnamed
    rings = read_rings(tmp_path)
    assert sorted(rings.rings) == [0, 1]
    said = "\n".join(rings.skipped)
    assert "rank2.ring is not a ddpviz ring" in said
    assert "rank3.ring is another job's ring" in said
    assert "rank5.ring says it is rank 0's ring" in said


def _histories(entries: dict[int, list[Entry]], marks: dict[int, list[Mark]]) -> dict:
    class H:
        def __init__(self, r: int) -> None:
            self.by_pos = {e.pos: e for e in entries.get(r, [])}
            self.marks = marks.get(r, [])
            self.gap = False
    return {r: H(r) for r in (0, 1)}


def test_the_rings_compare_as_the_live_check_does(tmp_path: Path) -> None:
    """A size mismatch at a site used before, and one rank's Python call where the other is
    in DDP's bucket all-reduce: the ring's finding is compare_at's on the same entries."""
    for case in ("size", "unmatched"):
        folder = tmp_path / case
        folder.mkdir()
        r0, r1 = ring(folder, 0), ring(folder, 1)
        for step in range(3):
            for r in (r0, r1):
                mark(r, 2 * step, step)
                call(r, 2 * step + 1, step=step)
        mark(r0, 6, 3)
        mark(r1, 6, 3)
        if case == "size":
            call(r0, 7, n=3, step=3, span=None)
            call(r1, 7, n=4, step=3, span=None)
            bad = 7
        else:
            call(r0, 6, step=3, op="all_reduce", site="t.py:9 in debug_print", span=None)
            mark(r1, 6, 3, bucket=0)
            bad = 6
        rings = read_rings(folder)
        found = ring_findings(rings)
        assert len(found) == 1, found
        entries = {r: rings.rings[r].entries["0"] for r in (0, 1)}
        marks = {r: rings.rings[r].marks["0"] for r in (0, 1)}
        live = compare_at("0", (0, 1), _histories(entries, marks), bad,
                          after=ledger_ring.AFTER)
        assert found[0] == live
        assert found[0].kind == ("collective_mismatch" if case == "size"
                                 else "unmatched_collective")
        if case == "unmatched":
            assert "DDP's all-reduce of bucket 0 at step 3" in str(found[0])


def test_agreeing_rings_and_a_rank_without_a_ring_say_nothing(tmp_path: Path) -> None:
    r0, r1 = ring(tmp_path, 0), ring(tmp_path, 1)
    for step in range(300):  # wrapped many times over
        for r in (r0, r1):
            mark(r, 2 * step, step)
            call(r, 2 * step + 1, step=step, span=None if step == 299 else 1)
    assert ring_findings(read_rings(tmp_path)) == []
    r2 = ring(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, 0)
    call(r2, 5, n=9, span=None)  # rank 1 has no ring in that folder: nothing to compare
    assert ring_findings(read_rings(tmp_path / "x")) == []


WRITER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from ddpviz.probes.ledger_ring import Ring
    r = Ring(Path(sys.argv[1]), 0, 2, job=7)
    for pos in range(int(sys.argv[2])):
        r.write("0", (0, 1), pos, pos // 2, -1,
                r.text("0", "all_gather", f"float32 x{pos} into 2", "t.py:3 in log_metrics"))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_sigkilled_writers_last_record_is_readable(tmp_path: Path) -> None:
    path = tmp_path / RING_FILE.format(rank=0)
    done = subprocess.run([sys.executable, "-c", WRITER, str(path), "1001"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    got = read_ring(path)
    assert got.written == 1001
    last = got.entries["0"][-1]
    assert (last.pos, last.sig, last.span) == (1000, "float32 x1000 into 2", -1)


def test_rings_older_than_the_job_are_left_out(tmp_path: Path) -> None:
    for rank in (0, 1):
        call(ring(tmp_path, rank), 0, n=3 + rank, span=None)
    assert len(ring_findings(read_rings(tmp_path))) == 1  # (they differ)
    later = read_rings(tmp_path, since=time.time() + 60)
    assert later.rings == {} and all("older than the job" in s for s in later.skipped)
    assert ring_findings(later) == []


def test_a_ring_that_cannot_be_made_steps_aside_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_ring, "_said", [])
    assert ledger_ring.open_ring(str(tmp_path / "no" / "such"), 0, 2) is None
    assert ledger_ring.open_ring(str(tmp_path / "no" / "such"), 0, 2) is None
    err = capsys.readouterr().err
    assert err.count("ddpviz: stopped writing the ring") == 1 and "job runs on" in err, err
