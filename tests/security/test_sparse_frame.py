"""A declared frame length never sizes a buffer before the file is known to hold those bytes
(issue #37, L2): a sparse 4.25 GiB file (4 KiB on disk) whose frame claims 4 GiB gave
MemoryError under a 4 GiB cap, from a buffer allocated before the frame's checksum was
checked. Each load runs in a child process under that cap (RLIMIT_AS) and a time cap, and
gives a TraceError; legitimate big frames, read a window at a time, load as before."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from ddpviz import events as ev
from ddpviz.traces import fileformat
from ddpviz.traces.fileformat import EVENTS, FRAME, HEADER, MAGIC, TraceWriter
from ddpviz.traces.trace import Trace, TraceError

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 4 << 30  # the cap: the interpreter with ddpviz.traces is ~0.2 GB of it
TIME_CAP_S = 300  # each child takes seconds (a checksum over 4 GiB of holes) on an idle machine
CLAIM = (1 << 32) - 1  # the most a frame can claim (its length is a u32): 4 GiB
SIZE = 17 << 28  # 4.25 GiB: the claimed bytes are all inside the file

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from ddpviz.traces.trace import Trace, TraceError
try:
    Trace.load(sys.argv[1])
except TraceError as e:
    partial = e.partial
    print(json.dumps(["TraceError", str(e), len(partial) if partial is not None else None]))
else:
    print(json.dumps(["loaded"]))
"""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _zeros_crc(n: int) -> int:
    """The CRC-32 (zlib's) of n zero bytes (what a sparse file reads as), without reading them:
    one zero bit is a linear map of the CRC register over GF(2) (a 32x32 matrix, as zlib's
    crc32_combine builds it), raised to the power 8n by squaring. Checked against zlib.crc32
    over real zero bytes in test_the_crc_of_zeros_is_zlibs."""

    def times(matrix: list[int], vector: int) -> int:
        out, i = 0, 0
        while vector:
            if vector & 1:
                out ^= matrix[i]
            vector, i = vector >> 1, i + 1
        return out

    op = [0xEDB88320] + [1 << i for i in range(31)]  # one zero bit: bit i moves to i-1
    register, bits = 0xFFFFFFFF, 8 * n  # zlib's register starts inverted
    while bits:
        if bits & 1:
            register = times(op, register)
        op = [times(op, column) for column in op]
        bits >>= 1
    return register ^ 0xFFFFFFFF


@pytest.mark.parametrize("n", [0, 1, 3, 1000, (1 << 20) + 7])
def test_the_crc_of_zeros_is_zlibs(n: int) -> None:
    assert _zeros_crc(n) == zlib.crc32(bytes(n))


def _sparse(path: Path, head: bytes, kind: int, crc: int) -> Path:
    """`head`, then a frame of `kind` claiming CLAIM bytes with this CRC, then holes up to
    SIZE bytes (only `head` and the frame header are on disk)."""
    with open(path, "wb") as f:
        f.write(head + FRAME.pack(kind, CLAIM, crc))
        f.truncate(SIZE)
    if path.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this filesystem does not keep sparse files sparse")
    return path


def _load_capped(path: Path) -> list[object]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          preexec_fn=_cap_memory, capture_output=True, text=True,
                          timeout=TIME_CAP_S)
    assert proc.returncode == 0, proc.stderr[-3000:]  # (MemoryError: an uncaught traceback)
    outcome: list[object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome[0] == "TraceError" and str(outcome[1]).startswith("ddpviz: "), outcome
    return outcome


@pytest.mark.timeout(TIME_CAP_S + 60)
@pytest.mark.parametrize("crc", [0, 1], ids=["crc-matches", "crc-fails"])
def test_a_first_frame_claiming_4_gib_of_a_sparse_file_is_a_trace_error(tmp_path: Path,
                                                                       crc: int) -> None:
    """The issue's file: a header frame of zeros. 2**32 - 1 zero bytes have the CRC 0 (the
    CRC's period), so with a zero checksum the frame is all there: it is more than the cap
    allows. With another checksum it is refused before any buffer is sized by it."""
    path = _sparse(tmp_path / "sparse.ddpviz", MAGIC, HEADER, crc)
    assert path.stat().st_size == SIZE
    message = str(_load_capped(path)[1])
    if crc == 0:
        assert _zeros_crc(CLAIM) == 0
        assert f"the frame at byte 8 holds {CLAIM:,} bytes, more than this process" in message
    else:
        assert "frame at byte 8 is not a complete header frame" in message


@pytest.mark.timeout(TIME_CAP_S + 60)
def test_a_4_gib_frame_of_holes_whose_checksum_matches_is_a_trace_error(tmp_path: Path
                                                                         ) -> None:
    """The checksum of the holes is right: the frame is really in the file, and its buffer is
    more than the cap allows. That is said, with the events before it in `.partial`."""
    good = tmp_path / "good.ddpviz"
    with TraceWriter(good, meta={"run": "x"}) as w:
        w.write_many([ev.GradReady(0, 0, 1_000 + i, i, i, 0) for i in range(100)])
    path = _sparse(tmp_path / "sparse.ddpviz", good.read_bytes(), EVENTS, 0)
    outcome = _load_capped(path)
    where = good.stat().st_size
    assert f"the frame at byte {where:,} holds {CLAIM:,} bytes" in str(outcome[1])
    assert "more than this process can allocate; 100 events were read" in str(outcome[1])
    assert outcome[2] == 100


def test_big_frames_read_in_pieces_load_as_read_whole_and_fail_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames bigger than the read window (4 KiB here: frames over 1 MiB) have their checksum
    read a piece at a time before the frame is read: the same events, the same errors."""
    path = tmp_path / "t.ddpviz"
    with TraceWriter(path, meta={"run": "x"}, chunk=25_000) as w:
        for r in range(3):  # one frame of ~1.8 MB per rank
            w.write_many([ev.GradReady(r, s // 50, 10**9 + s, s, s % 50, 0)
                          for s in range(25_000)])
    whole = Trace.load(path)
    assert [len(whole.events(r)) for r in range(3)] == [25_000] * 3
    monkeypatch.setattr(fileformat, "WHOLE_BELOW", 1)  # read from the file, a window at a time
    monkeypatch.setattr(fileformat, "WINDOW", 4096)  # (frames over 1 MiB: checked in pieces)
    assert Trace.load(path) == whole
    data = bytearray(path.read_bytes())
    second = len(MAGIC)
    for _ in range(2):  # the header, then the first event frame
        second += FRAME.size + FRAME.unpack_from(data, second)[1]
    assert FRAME.unpack_from(data, second)[1] > 1 << 20
    data[second + FRAME.size + 1_500_000] ^= 0xFF  # deep inside the second event frame
    bad = tmp_path / "bad.ddpviz"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=f"frame at byte {second} fails its checksum"):
        Trace.load(bad)
    torn = tmp_path / "torn.ddpviz"
    torn.write_bytes(path.read_bytes()[:-3])
    with pytest.warns(UserWarning, match="torn frame"):
        loaded = Trace.load(torn)
    assert loaded.truncated and loaded.events(1) == whole.events(1) and not loaded.events(2)
