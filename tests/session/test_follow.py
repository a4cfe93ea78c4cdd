"""`ddpviz.listen(follow=DIR)`: per-rank trace files followed as they grow (session/follow.py).

The files are written here with TraceWriter, as a recording job's ranks write them; the feed is
polled by hand (`session.collector.poll()`, its own thread set to a poll an hour) so that every
step is deterministic: no timing window anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import msgspec
import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.session import follow
from ddpviz.session.follow import FolderFeed, follow_folder
from ddpviz.session.live import Session
from ddpviz.traces.fileformat import EVENTS, FRAME, MAGIC, End, TraceWriter, read_end
from ddpviz.traces.trace import Trace
from ddpviz.transport import Sender
from ddpviz.transport.codec import boot_id
from tests.polling import eventually

HOUR = 3600.0


@pytest.fixture(params=[True, False], ids=["kept-open", "reopened-each-poll"])
def kept_open(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways a file is followed: its descriptor kept open between polls, or (beyond
    follow.MAX_OPEN files) opened for each poll."""
    if not request.param:
        monkeypatch.setattr(follow, "MAX_OPEN", 0)
    return bool(request.param)


def name(rank: int) -> str:
    return f"ddpviz-trace-rank{rank}.ddpviz"


def steps(rank: int, first: int, last: int, seq: int = 0) -> list[ev.Event]:
    """Forward/backward events of steps first..last-1 of `rank`, seq numbers from `seq`."""
    out: list[ev.Event] = []
    for step in range(first, last):
        out.append(ev.ForwardStarted(rank, step, 1000 * step, seq))
        out.append(ev.BackwardStarted(rank, step, 1000 * step + 10, seq + 1))
        out.append(ev.BackwardFinished(rank, step, 1000 * step + 20, seq + 2))
        seq += 3
    return out


def writer(folder: Path, rank: int) -> TraceWriter:
    return TraceWriter(folder / name(rank), meta={"rank": rank, "host": "h", "pid": 1})


def attached(folder: Path) -> Session:
    return follow_folder(folder, interval=HOUR, show=False)


def poll(session: Session) -> int:
    feed = session.collector
    assert isinstance(feed, FolderFeed)
    return feed.poll()


def by_rank(session: Session) -> dict[int, list[ev.Event]]:
    return {r: session.trace.events(r) for r in session.trace.ranks}


def test_history_then_new_events_then_a_rank_that_starts_late(tmp_path: Path,
                                                              kept_open: bool) -> None:
    w0, w1 = writer(tmp_path, 0), writer(tmp_path, 1)
    for r, w in ((0, w0), (1, w1)):
        w.write_many(steps(r, 0, 3))
        w.flush()
    with attached(tmp_path) as session:
        assert by_rank(session) == {0: steps(0, 0, 3), 1: steps(1, 0, 3)}  # the history
        seen: list[ev.Event] = []
        session.subscribe(seen.extend, batch=True)
        w0.write_many(steps(0, 3, 5, seq=9))
        w0.flush()
        assert poll(session) == 6
        assert seen == steps(0, 3, 5, seq=9)
        w2 = writer(tmp_path, 2)  # a rank whose file appears after the attach
        w2.write_many(steps(2, 0, 1))
        w2.flush()
        poll(session)
        assert by_rank(session) == {0: steps(0, 0, 5), 1: steps(1, 0, 3), 2: steps(2, 0, 1)}
        stats = session.stats
        assert stats.received == {0: 15, 1: 9, 2: 3} and stats.gaps == {0: 0, 1: 0, 2: 0}
        assert sorted(stats.peers) == [0, 1, 2]
    for w in (w0, w1, w2):
        w.close()


def test_the_polling_thread_delivers_and_stops_on_close(tmp_path: Path) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 1))
    w.flush()
    session = follow_folder(tmp_path, interval=0.01, show=False)
    w.write_many(steps(0, 1, 2, seq=3))
    w.flush()
    assert session.wait(events=6, timeout=120)
    feed = session.collector
    assert isinstance(feed, FolderFeed)
    session.close()
    assert feed._thread is not None and not feed._thread.is_alive()
    w.write_many(steps(0, 2, 3, seq=6))  # after the detach: not read
    w.close()
    assert len(session.trace) == 6


@pytest.mark.parametrize("cut", [-FRAME.size + 3, 0, 5])  # in the frame header, after, mid-payload
def test_a_torn_last_frame_waits_for_its_end(tmp_path: Path, cut: int, kept_open: bool) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 2))
    w.flush()
    path = tmp_path / name(0)
    payload = msgspec.msgpack.encode(steps(0, 2, 3, seq=6))
    frame = FRAME.pack(EVENTS, len(payload), zlib.crc32(payload)) + payload
    split = FRAME.size + cut
    with open(path, "ab") as f:
        f.write(frame[:split])
    with attached(tmp_path) as session:
        assert by_rank(session) == {0: steps(0, 0, 2)}  # the complete frames, no error
        assert poll(session) == 0
        with open(path, "ab") as f:
            f.write(frame[split:])
        assert poll(session) == 3
        assert by_rank(session) == {0: steps(0, 0, 3)}
        assert session.collector.problems == []  # type: ignore[union-attr]
    w.close()


def test_a_last_frame_failing_its_checksum_is_waited_for_then_read(tmp_path: Path) -> None:
    # A shared filesystem may show the new size before the bytes: zeros where the payload goes.
    w = writer(tmp_path, 0)
    w.flush()
    path = tmp_path / name(0)
    payload = msgspec.msgpack.encode(steps(0, 0, 1))
    head = FRAME.pack(EVENTS, len(payload), zlib.crc32(payload))
    with open(path, "ab") as f:
        f.write(head + bytes(len(payload)))
    start = path.stat().st_size - len(payload)
    with attached(tmp_path) as session:
        assert len(session.trace) == 0
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(payload)
        poll(session)
        assert by_rank(session) == {0: steps(0, 0, 1)}
    w.close()


def test_a_file_truncated_while_followed_is_left_with_a_clear_message(
        tmp_path: Path, kept_open: bool) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 2))
    w.flush()
    with attached(tmp_path) as session:
        os.truncate(tmp_path / name(0), 20)
        with pytest.warns(UserWarning, match=r"was truncated while it was followed.*"
                          r"\n.*6 events read before are kept"):
            poll(session)
        assert by_rank(session) == {0: steps(0, 0, 2)}
        assert session.stats.rejected == {"truncated": 1}
        poll(session)  # said once
        assert len(session.collector.problems) == 1  # type: ignore[union-attr]
    w.close()


def test_a_file_replaced_by_a_new_job_is_read_to_its_end_and_not_mixed_in(
        tmp_path: Path, kept_open: bool) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 2))
    w.flush()
    with attached(tmp_path) as session:
        w.write_many(steps(0, 2, 3, seq=6))  # the old job's last events, not polled yet
        w.flush()
        new = tmp_path / "new.tmp"
        with TraceWriter(new, meta={"rank": 0}) as w2:
            w2.write_many(steps(0, 0, 9))
        os.replace(new, tmp_path / name(0))  # how a new job's rank puts its file in place
        # Kept open, the old file is read to its end; reopened for each poll, its unread rest
        # is out of reach (the name holds the new file now): either way nothing new is mixed in.
        old = steps(0, 0, 3) if kept_open else steps(0, 0, 2)
        with pytest.warns(UserWarning, match=rf"was replaced by a new file.*\n.*{len(old)} "
                          "events"):
            poll(session)
        assert by_rank(session) == {0: old}
        with writer(tmp_path, 1) as w3:  # the new job's other rank: not picked up either
            w3.write_many(steps(1, 0, 1))
        poll(session)
        assert session.trace.ranks == [0]
        assert session.stats.rejected == {"replaced": 1}
    w.close()


def test_a_corrupt_frame_mid_file_stops_that_file_with_a_clear_message(tmp_path: Path) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 1))
    w.flush()
    at = (tmp_path / name(0)).stat().st_size
    w.write_many(steps(0, 1, 2, seq=3))
    w.flush()
    w.write_many(steps(0, 2, 3, seq=6))
    w.flush()
    with open(tmp_path / name(0), "r+b") as f:
        f.seek(at + FRAME.size + 2)
        f.write(b"\xff")
    with pytest.warns(UserWarning, match=r"is corrupt: the frame at byte .* fails its checksum"
                      r".*\n.*3 events before it are kept"):
        session = attached(tmp_path)
    with session:
        assert by_rank(session) == {0: steps(0, 0, 1)}
        assert session.stats.rejected == {"damaged": 1}
    w.close()


def test_a_hostile_frame_length_is_refused_without_sizing_memory(tmp_path: Path) -> None:
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 1))
    w.flush()
    with open(tmp_path / name(0), "ab") as f:
        f.write(FRAME.pack(EVENTS, 0xFFFFFFFF, 0) + b"x" * 64)
    with pytest.warns(UserWarning, match=r"claims 4,294,967,295 bytes, more than any ddpviz "
                      r"frame"):
        session = attached(tmp_path)
    with session:
        assert len(session.trace) == 3
    w.close()


def test_a_link_or_fifo_planted_under_a_trace_name_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.ddpviz"
    with TraceWriter(secret, meta={"rank": 0}) as w:
        w.write_many(steps(0, 0, 1))
    os.symlink(secret, tmp_path / name(0))
    os.mkfifo(tmp_path / name(1))  # would block a plain open()
    with pytest.warns(UserWarning, match=r"Only regular files are followed") as caught:
        session = attached(tmp_path)
    with session:
        assert len(session.trace) == 0
        assert session.stats.rejected == {"unreadable": 2}
    assert len(caught) == 2


def test_detach_and_reattach_lose_and_double_nothing(tmp_path: Path, kept_open: bool) -> None:
    w0, w1 = writer(tmp_path, 0), writer(tmp_path, 1)
    for r, w in ((0, w0), (1, w1)):
        w.write_many(steps(r, 0, 2))
        w.flush()
    first = attached(tmp_path)
    w0.write_many(steps(0, 2, 4, seq=6))
    w0.flush()
    poll(first)
    before = by_rank(first)
    first.close()
    w1.write_many(steps(1, 2, 4, seq=6))
    w1.flush()
    second = attached(tmp_path)
    w0.write_many(steps(0, 4, 5, seq=12))
    w0.flush()
    poll(second)
    w0.close()
    w1.close()
    final = Trace.merge([Trace.load(tmp_path / name(r)) for r in (0, 1)])
    after = by_rank(second)
    assert after == {r: final.events(r) for r in (0, 1)}
    assert all(after[r][:len(before[r])] == before[r] for r in before)
    assert by_rank(first) == before  # closed: it did not move
    second.close()


def test_the_dashboard_of_an_attached_session_shows_the_history(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    with writer(tmp_path, 0) as w0, writer(tmp_path, 1) as w1:
        w0.write_many(steps(0, 0, 3))
        w1.write_many(steps(1, 0, 3))
    with attached(tmp_path) as session:
        board = session.dashboard()
        assert board.events_sent == 18 and board.live == "running"
        assert len(ddpviz.Trace.from_bytes(board.trace).of_type(ev.ForwardStarted)) == 6
        assert eventually(lambda: board.status.get("connected") == 2, 30), board.status
        board.close()


def test_attach_to_a_missing_folder_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no folder .* to attach to.\nPass the folder"):
        ddpviz.listen(follow=tmp_path / "nope", show=False)


def test_attach_prints_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    with writer(tmp_path, 0) as w:
        w.write_many(steps(0, 0, 2))
    with ddpviz.listen(follow=tmp_path) as session:
        assert session.trace.events() == steps(0, 0, 2)
    out = capsys.readouterr().out
    assert "attached to" in out and "6 events from 1 ranks" in out


def test_listen_follow_refuses_the_socket_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"binds nothing, so port, secret do not apply"):
        ddpviz.listen(port=5555, secret="x", follow=tmp_path)


def test_a_rank_whose_writer_exited_counts_as_finished(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    for rank, pid in ((0, int(gone.stdout)), (1, os.getpid())):
        with TraceWriter(tmp_path / name(rank),
                         meta={"rank": rank, "pid": pid, "boot": boot_id()}) as w:
            w.write_many(steps(rank, 0, 1))
    with attached(tmp_path) as session:
        poll(session)  # a poll that finds nothing new looks at the writer
        assert session.stats.closed == {0: (3, 0)}  # rank 1's writer (this process) lives
        assert session.wait(ranks=1, timeout=0) and not session.wait(ranks=2, timeout=0)
        with open(tmp_path / name(0), "ab") as f:  # written after all: no longer finished
            payload = msgspec.msgpack.encode(steps(0, 1, 2, seq=3))
            f.write(FRAME.pack(EVENTS, len(payload), zlib.crc32(payload)) + payload)
        poll(session)
        assert session.stats.closed == {} and len(session.trace.events(0)) == 6


def test_a_rank_whose_file_ends_with_its_end_record_is_finished_on_any_node(
        tmp_path: Path, kept_open: bool) -> None:
    # Rank 0 wrote through a Sender that closed (its file's end record); its writer, this
    # process, still runs, as a rank on another node would seem to: only the record says it.
    sender = Sender.to_file(tmp_path / name(0), 0)
    for e in steps(0, 0, 2):
        sender(e)
    sender.flush()
    with writer(tmp_path, 1) as w1:  # rank 1: killed, or still running: no end record
        w1.write_many(steps(1, 0, 2))
    with attached(tmp_path) as session:
        feed = session.collector
        assert isinstance(feed, FolderFeed)
        assert session.stats.closed == {} and feed.ended == {}
        sender.close()
        poll(session)
        assert session.stats.closed == {0: (6, 0)}
        assert feed.ended == {0: End(0, 6, 0)}
        assert session.wait(ranks=1, timeout=0) and not session.wait(ranks=2, timeout=0)
        assert "(1 finished)" in repr(session)
        assert [f.kind for f in ddpviz.diagnose(session)] == []
    # Older readers skip the record (an unknown frame kind): the file loads as it did.
    assert Trace.load(tmp_path / name(0)).events() == steps(0, 0, 2)
    assert read_end(tmp_path / name(0)) == End(0, 6, 0)
    assert read_end(tmp_path / name(1)) is None


def test_an_end_record_naming_another_rank_is_not_this_files_end(tmp_path: Path) -> None:
    with writer(tmp_path, 0) as w:
        w.write_many(steps(0, 0, 1))
        w.write_end(End(5, 3, 0))
    with attached(tmp_path) as session:
        assert session.stats.closed == {}
        assert session.collector.ended == {}  # type: ignore[union-attr]


def test_read_end_needs_a_whole_end_record_at_the_very_end(tmp_path: Path) -> None:
    path = tmp_path / name(0)
    with writer(tmp_path, 0) as w:
        w.write_many(steps(0, 0, 1))
        w.write_end(End(0, 3, 0, error="E" * 500))  # a long name is clipped: still found
    assert read_end(path) == End(0, 3, 0, error="E" * 64)
    data = path.read_bytes()
    for cut in (1, 5, 20):
        path.write_bytes(data[:-cut])  # torn: the writer died writing it
        assert read_end(path) is None
    path.write_bytes(data + b"\x00")  # something after it: not the end
    assert read_end(path) is None
    path.write_bytes(data[:len(MAGIC)])
    assert read_end(path) is None


def test_the_dashboard_of_an_attached_session_counts_ranks_that_ended(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    with Sender.to_file(tmp_path / name(0), 0) as sender:
        for e in steps(0, 0, 2):
            sender(e)
    with attached(tmp_path) as session:
        board = session.dashboard()
        assert eventually(lambda: (board.status.get("connected"), board.status.get("finished"))
                          == (1, 1), 30), board.status
        board.close()
