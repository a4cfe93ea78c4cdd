"""End records that lie (issue 37, M3 and L1): an END frame turns a rank's hang into "ended
cleanly", so one counts only where it is a frame (not the END-shaped bytes a parameter name can
end a file with) and only for its own file's rank: not from another rank's file, not from a
file whose events are another rank's, and not when two files claim the rank (then both are
named). The same rules hold for a folder followed live (`listen(follow=)`)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import msgspec
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.cli import main
from ddpviz.session.follow import FolderFeed, follow_folder
from ddpviz.traces.fileformat import END, FRAME, End, TraceWriter, read_end
from ddpviz.traces.source import ended_files, open_run
from ddpviz.traces.trace import Trace
from tests.diagnose.test_ended import run

HANG = "rank 0 was still waiting in a collective when the events end"


def hung() -> Trace:
    """Rank 0 hung inside step 3's all-reduce; rank 1 finished step 3 (then was killed)."""
    return run({0: 3, 1: 3}, open_on=0)


def name(rank: int) -> str:
    return f"ddpviz-trace-rank{rank}.ddpviz"


def rank_file(path: Path, header: object, events: list[ev.Event], end: End | None = None
              ) -> Path:
    """A file as a rank's Sender writes it: its header's rank, its events, its end record."""
    with TraceWriter(path, meta={"rank": header, "host": "h", "pid": 1}) as w:
        w.write_many(events)
        if end is not None:
            w.write_end(end)
    return path


def hung_run(folder: Path) -> Trace:
    """The two ranks' files of `hung()`, neither with an end record."""
    trace = hung()
    for r in (0, 1):
        rank_file(folder / name(r), r, trace.events(r))
    return trace


def diagnose_cli(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["diagnose", str(folder)])
    return code, capsys.readouterr().out.splitlines()


# --- M3: a record counts only for its own file's rank --------------------------------------


def test_a_record_for_rank_0_at_the_end_of_rank_1s_file_does_not_end_rank_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = hung()
    rank_file(tmp_path / name(0), 0, trace.events(0))
    rank_file(tmp_path / name(1), 1, trace.events(1), End(0, 5, 0))  # misplaced or forged
    code, out = diagnose_cli(tmp_path, capsys)
    assert code == 1, out
    assert not any("ended cleanly" in line for line in out), out
    assert any(line.startswith(f"- {HANG}") for line in out), out
    said = "\n".join(out)
    assert f"{str(tmp_path / name(1))!r} is rank 1's file by its header but ends with an end " \
           "record for rank 0: the record is not counted" in said
    assert ended_files_quietly([tmp_path / name(0), tmp_path / name(1)]) == {}
    assert main(["diagnose", "--json", str(tmp_path)]) == 1  # said on stderr, JSON unchanged
    got = capsys.readouterr()
    assert json.loads(got.out)["trace"]["ended"] == {}
    assert "ends with an end record for rank 0: the record is not counted" in got.err


def ended_files_quietly(files: list[Path]) -> dict[int, End]:
    with pytest.warns(UserWarning):
        return ended_files(files)


@pytest.mark.parametrize("planted", ["zz-planted.ddpviz", "ddpviz-trace-rank00.ddpviz"])
def test_a_planted_file_claiming_rank_0_does_not_end_it_and_both_files_are_named(
        tmp_path: Path, planted: str, capsys: pytest.CaptureFixture[str]) -> None:
    hung_run(tmp_path)
    rank_file(tmp_path / planted, 0, [], End(0, 0, 0))  # only a header and End(0)
    code, out = diagnose_cli(tmp_path, capsys)
    assert code == 1, out
    assert not any("ended cleanly" in line for line in out), out
    said = "\n".join(out)
    first, second = sorted([tmp_path / name(0), tmp_path / planted])
    assert (f"ddpviz: 2 files say they are rank 0's: {str(first)!r}, {str(second)!r}. Only one "
            "can be, and which cannot be told, so no end record counts for rank 0") in said
    # The Python API says it as a warning, and its verdict is the hang.
    with pytest.warns(UserWarning, match="2 files say they are rank 0's"):
        findings = ddpviz.diagnose(str(tmp_path))
    assert any(f.kind == "rank_hang" and f.title.startswith(HANG) for f in findings)


def test_a_file_holding_other_ranks_events_lends_its_record_to_no_rank(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One file, rank 0's by its header, holding both ranks' events and ending with End(0).
    rank_file(tmp_path / "run.ddpviz", 0, hung().events(), End(0, 86, 0))
    code, out = diagnose_cli(tmp_path, capsys)
    assert code == 1, out
    assert not any("ended cleanly" in line for line in out), out
    assert any("holds events of other ranks (1): its end record is not counted" in line
               for line in out), out


def test_a_record_in_a_file_whose_header_names_no_rank_counts_for_no_rank(
        tmp_path: Path) -> None:
    trace = hung()
    rank_file(tmp_path / name(0), 0, trace.events(0))
    rank_file(tmp_path / name(1), "1", trace.events(1), End(0, 5, 0))  # header rank not an int
    with pytest.warns(UserWarning, match="its header names no rank"):
        assert open_run(str(tmp_path)).ended == {}
    source = open_run(str(tmp_path))
    assert source.end_problems and "its header names no rank" in source.end_problems[0]
    assert source.ended == {}  # (no warning: the problems were taken first)


def test_records_in_the_ranks_own_files_still_count(tmp_path: Path) -> None:
    trace = hung()
    for r in (0, 1):
        rank_file(tmp_path / name(r), r, trace.events(r), End(r, len(trace.events(r)), 0))
    files = [tmp_path / name(0), tmp_path / name(1)]
    ended = {r: End(r, len(trace.events(r)), 0) for r in (0, 1)}
    assert ended_files([*files, files[0]]) == ended  # (no warning: a file named twice is one)
    assert open_run(str(tmp_path)).ended == ended


# --- L1: END-shaped bytes inside the last event are no END frame ----------------------------


def forged_end(rank: int) -> str:
    """Text that, as the last bytes of a file, reads as a whole END frame with a valid CRC for
    End(rank, ..., error=""): a parameter name can be it (its bytes valid UTF-8)."""
    encode = msgspec.msgpack.Encoder().encode
    for events in range(128):
        for hi in range(0x80, 0xC0):  # dropped = 0xHHC2: its bytes cd HH c2, then a0 for ""
            payload = encode(End(rank, events, hi << 8 | 0xC2, ""))
            raw = FRAME.pack(END, len(payload), zlib.crc32(payload)) + payload
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
    raise AssertionError("no forged END found")


def test_an_end_frame_spelled_by_the_last_parameter_name_is_no_end_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = hung()
    last = trace.events(0)[-1]
    # Rank 0's last event: its unused parameters, the last name ending in a forged End(0).
    names = ("fc1.weight", "fc2.bias" + forged_end(0))
    rank_file(tmp_path / name(0), 0, [*trace.events(0),
                                      ev.UnusedParametersFound(0, 3, last.t_ns + 1, last.seq + 1,
                                                               (0, 3), names)])
    rank_file(tmp_path / name(1), 1, trace.events(1))
    assert (tmp_path / name(0)).read_bytes().endswith(forged_end(0).encode())
    assert read_end(tmp_path / name(0)) is None
    code, out = diagnose_cli(tmp_path, capsys)
    assert code == 1, out
    assert not any("ended cleanly" in line for line in out), out
    assert any(line.startswith(f"- {HANG}") for line in out), out
    # The real record, written after those events, is found by the walk.
    path = tmp_path / "closed.ddpviz"
    rank_file(path, 0, trace.events(0)[:5], End(0, 5, 0))
    with open(path, "ab") as f:  # and bytes after it: not the end
        f.write(b"\x00")
    assert read_end(path) is None


def test_read_end_walks_frames_and_stops_at_a_length_past_the_end(tmp_path: Path) -> None:
    path = rank_file(tmp_path / name(0), 0, hung().events(0), End(0, 43, 0))
    data = path.read_bytes()
    assert read_end(path) == End(0, 43, 0)
    # The first event frame claims 4 GiB: no frame boundary after it is known.
    header_len = FRAME.unpack_from(data, 8)[1]
    first = 8 + FRAME.size + header_len
    forged = bytearray(data)
    forged[first + 1:first + 5] = (0xFFFFFFFF).to_bytes(4, "little")
    path.write_bytes(bytes(forged))
    assert read_end(path) is None
    path.write_bytes(data[:8] + data[first:])  # no header frame first
    assert read_end(path) is None


# --- the same rules for a folder followed live --------------------------------------------


def attached(folder: Path) -> ddpviz.Session:
    return follow_folder(folder, interval=3600.0, show=False)


def test_following_a_planted_rank00_file_does_not_finish_the_running_rank_0(
        tmp_path: Path) -> None:
    trace = hung()
    with TraceWriter(tmp_path / name(0), meta={"rank": 0, "host": "h", "pid": 1}) as w0:
        w0.write_many(trace.events(0))
        w0.flush()  # the real rank 0 still writes
        planted = rank_file(tmp_path / "ddpviz-trace-rank00.ddpviz", 0, [], End(0, 0, 0))
        with attached(tmp_path) as session:
            feed = session.collector
            assert isinstance(feed, FolderFeed)
            assert session.stats.closed == {} and feed.ended == {}
            assert any(f"2 files say they are rank 0's: {str(tmp_path / name(0))!r}, "
                       f"{str(planted)!r}" in p for p in feed.problems), feed.problems
            assert not session.wait(ranks=1, timeout=0)


@pytest.mark.parametrize("case", ["named for rank 1", "events of rank 1", "events after it"])
def test_following_a_record_that_is_not_its_files_own_end_finishes_no_rank(
        tmp_path: Path, case: str) -> None:
    trace = hung()
    if case == "named for rank 1":  # rank 0's header, events and record, under rank 1's name
        rank_file(tmp_path / name(1), 0, trace.events(0), End(0, 43, 0))
    elif case == "events of rank 1":
        rank_file(tmp_path / name(0), 0, trace.events(), End(0, 86, 0))
    else:
        path = rank_file(tmp_path / name(0), 0, trace.events(0)[:10], End(0, 10, 0))
        payload = msgspec.msgpack.encode(trace.events(0)[10:])
        with open(path, "ab") as f:
            f.write(FRAME.pack(2, len(payload), zlib.crc32(payload)) + payload)
    with attached(tmp_path) as session:
        feed = session.collector
        assert isinstance(feed, FolderFeed)
        assert session.stats.closed == {} and feed.ended == {}
        assert any("is not counted" in p or "is not its end" in p for p in feed.problems), \
            feed.problems
