"""`listen(follow=DIR)` against busy, big, planted and shrinking files (issue #37, third pass):
the attach returns while a job keeps writing, the history read does work linear in its
frames, a bad last frame is not read again at every poll, and a file shrinking mid-poll loses
no frame. Files are written here by hand or with TraceWriter, as in test_follow.py; work is
counted (calls, bytes read), never timed."""

from __future__ import annotations

import os
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ddpviz import events as ev
from ddpviz.session import follow
from ddpviz.session.follow import FolderFeed, follow_folder
from ddpviz.session.live import Session
from ddpviz.traces.fileformat import EVENTS, FRAME, TraceWriter

HOUR = 3600.0
LIMIT = 60.0  # bounds a broken attach only


@pytest.fixture(params=[True, False], ids=["kept-open", "reopened-each-poll"])
def kept_open(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setattr(follow, "MAX_OPEN", 0)
    return bool(request.param)


def name(rank: int) -> str:
    return f"ddpviz-trace-rank{rank}.ddpviz"


def steps(rank: int, first: int, last: int) -> list[ev.Event]:
    """Forward/backward events of steps first..last-1 of `rank`, numbered from 3 * first."""
    out: list[ev.Event] = []
    for step in range(first, last):
        seq = 3 * step
        out.append(ev.ForwardStarted(rank, step, 1000 * step, seq))
        out.append(ev.BackwardStarted(rank, step, 1000 * step + 10, seq + 1))
        out.append(ev.BackwardFinished(rank, step, 1000 * step + 20, seq + 2))
    return out


def writer(folder: Path, rank: int) -> TraceWriter:
    return TraceWriter(folder / name(rank), meta={"rank": rank, "host": "h", "pid": 1})


def frame(events: list[ev.Event]) -> bytes:
    payload = msgspec.msgpack.encode(events)
    return FRAME.pack(EVENTS, len(payload), zlib.crc32(payload)) + payload


def feed_of(session: Session) -> FolderFeed:
    feed = session.collector
    assert isinstance(feed, FolderFeed)
    return feed


# --- M4: the attach returns while the job writes -----------------------------------------------

def test_the_attach_returns_while_every_poll_finds_a_new_frame(tmp_path: Path) -> None:
    # The busiest job: each delivery makes the job append another frame, so every poll finds
    # something new. Reading until a poll finds nothing would end only when the job stops
    # (here after BOUND frames); the history is what the files held at the call.
    bound = 500
    writers = [writer(tmp_path, r) for r in (0, 1)]
    for r, w in enumerate(writers):
        w.write_many(steps(r, 0, 2))
        w.flush()
    step = [2, 2]

    def busy_job(chunk: list[ev.Event]) -> None:
        r = chunk[0].rank
        if step[r] < 2 + bound:
            writers[r].write_many(steps(r, step[r], step[r] + 1))
            writers[r].flush()
            step[r] += 1

    feed = FolderFeed(tmp_path, interval=HOUR)
    session = Session(feed)
    feed.subscribe(busy_job, batch=True)
    try:
        feed.start()
        appended = sum(step) - 4
        assert appended < 10, f"the attach read on while the job wrote ({appended} frames)"
        assert {r: session.trace.events(r) for r in (0, 1)} == {r: steps(r, 0, 2)
                                                                for r in (0, 1)}
        written = list(step)
        feed.poll()  # what came after arrives live (and the job writes on)
        assert {r: session.trace.events(r) for r in (0, 1)} == {r: steps(r, 0, written[r])
                                                                for r in (0, 1)}
    finally:
        session.close()
        for w in writers:
            w.close()


def test_listen_follow_returns_while_a_writer_thread_keeps_writing(tmp_path: Path) -> None:
    # Issue #37 M4 scaled to a test: the job appends a frame every 2 ms while each poll takes
    # longer (a subscriber spending 10 ms on each chunk, as a busy notebook may): every poll
    # finds something new. The attach runs on a thread, bounded: a broken one fails here.
    ranks = 4
    writers = [writer(tmp_path, r) for r in range(ranks)]
    for r, w in enumerate(writers):
        w.write_many(steps(r, 0, 3))
        w.flush()
    done = threading.Event()

    def job() -> None:
        step = 3
        while not done.wait(0.002):
            for r, w in enumerate(writers):
                if done.is_set():
                    break
                w.write_many(steps(r, step, step + 1))
                w.flush()
            step += 1

    feed = FolderFeed(tmp_path, interval=HOUR)
    session = Session(feed)
    feed.subscribe(lambda chunk: done.wait(0.01), batch=True)
    attach = threading.Thread(target=feed.start, daemon=True)
    writing = threading.Thread(target=job, daemon=True)
    writing.start()
    try:
        attach.start()
        attach.join(LIMIT)
        returned = not attach.is_alive()
    finally:
        feed._stop.set()  # ends a broken attach's loop too
        attach.join(LIMIT)
        done.set()
        writing.join(LIMIT)
        session.close()
        for w in writers:
            w.close()
    assert returned, f"listen(follow=) did not return in {LIMIT:.0f} s while the job wrote"
    assert all(len(session.trace.events(r)) >= 9 for r in range(ranks))  # the history


# --- M5: the history read is linear ---------------------------------------------------------

def test_the_history_read_does_work_linear_in_files_times_frames(tmp_path: Path) -> None:
    # Every call made while the history is read (Python and C, counted by a profile hook):
    # twice the files, twice the calls. Merging every file's clock records at every chunk
    # made it files x frames (the issue: 57.6 M dict.update calls at 1,200 files).
    def calls(files: int, frames: int) -> int:
        folder = tmp_path / str(files)
        folder.mkdir()
        for r in range(files):
            with writer(folder, r) as w:
                w.write_clock(r, 5, 1)  # a file's own clock record
                for i in range(frames):
                    w.write_many(steps(r, i, i + 1))
                    w.flush()
        feed = FolderFeed(folder, interval=HOUR)
        session = Session(feed)
        count = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal count
            count += 1

        sys.setprofile(profile)
        try:
            feed.start()
        finally:
            sys.setprofile(None)
        assert len(session.trace) == 3 * files * frames
        assert session.stats.clock == {r: (5, 1) for r in range(files)}
        session.close()
        return count

    small, big = calls(100, 5), calls(200, 5)
    assert big / small < 2.4, f"{small:,} calls for 100 files, {big:,} for 200"


# --- L3: a bad last frame is read once per state of the file -------------------------------

@pytest.mark.parametrize("then", ["finished", "grown"])
def test_a_planted_bad_last_frame_is_not_read_again_until_the_file_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_open: bool, then: str) -> None:
    # Issue #37 L3 scaled down: a sparse file whose last frame claims 16 MiB (MAX_FRAME in the
    # issue) and fails its checksum. Its ctime counts as settled at once here (SETTLE_NS 0).
    monkeypatch.setattr(follow, "SETTLE_NS", 0, raising=False)
    big = 16 << 20
    with writer(tmp_path, 0) as w:
        w.write_many(steps(0, 0, 1))
    path = tmp_path / name(0)
    start = path.stat().st_size
    with open(path, "ab") as f:
        f.write(FRAME.pack(EVENTS, big, 1))  # (not the checksum of its zeros)
    os.truncate(path, start + FRAME.size + big)  # the payload: a hole of zeros
    read = 0
    pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        nonlocal read
        read += n
        return pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting)
    with pytest.warns(UserWarning, match=rf"its last frame, at byte {start:,}, fails its "
                      r"checksum and the file has not changed since") as said:
        session = follow_folder(tmp_path, interval=HOUR, show=False)
        feed = feed_of(session)
        assert session.trace.events(0) == steps(0, 0, 1)
        read = 0
        for _ in range(5):
            feed.poll()
        assert read < 4096, f"{read:,} bytes read by 5 polls of an unchanged file"
    assert len([w for w in said if "fails its checksum" in str(w.message)]) == 1  # said once
    with session:
        mtime = path.stat().st_mtime_ns
        if then == "finished":  # the file changes (a whole frame in its place): read again
            small = msgspec.msgpack.encode(steps(0, 1, 2))
            with open(path, "r+b") as f:
                f.seek(start)
                f.write(frame(steps(0, 1, 2)))
            os.truncate(path, start + FRAME.size + len(small))
            os.utime(path, ns=(mtime + 10**9, mtime + 10**9))  # (timestamps are coarse)
            feed.poll()
            assert session.trace.events(0) == steps(0, 0, 2)
            assert feed.problems == []
        else:  # bytes after it: the bad frame is damage now
            with open(path, "ab") as f:
                f.write(frame(steps(0, 2, 3)))
            os.utime(path, ns=(mtime + 10**9, mtime + 10**9))
            with pytest.warns(UserWarning, match=r"is corrupt: the frame at byte .* fails its "
                              r"checksum"):
                feed.poll()
            assert session.stats.rejected == {"damaged": 1}
            assert session.trace.events(0) == steps(0, 0, 1)


def test_a_bad_last_frame_of_a_file_just_written_is_read_at_every_poll(
        tmp_path: Path) -> None:
    # A file changed moments ago may change again within its timestamps' resolution: its bad
    # last frame is read again at every poll until the change settles (follow.SETTLE_NS).
    with writer(tmp_path, 0) as w:
        w.write_many(steps(0, 0, 1))
    path = tmp_path / name(0)
    start = path.stat().st_size
    good = frame(steps(0, 1, 2))
    with open(path, "ab") as f:
        f.write(good[:FRAME.size] + bytes(len(good) - FRAME.size))
    with follow_folder(tmp_path, interval=HOUR, show=False) as session:
        feed = feed_of(session)
        feed.poll()
        with open(path, "r+b") as f:  # the same size, within the same timestamp tick maybe
            f.seek(start)
            f.write(good)
        feed.poll()
        assert session.trace.events(0) == steps(0, 0, 2)


# --- L4: a file shrinking under a poll ---------------------------------------------------------

@pytest.mark.parametrize("cut", ["in-C-header", "in-C-payload", "in-B"])
def test_a_file_shrinking_between_fstat_and_pread_loses_no_frame(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_open: bool, cut: str) -> None:
    # Issue #37 L4, deterministic: the file is truncated for real between the poll's fstat
    # and its pread of frame C, after frames A and B were read in the same poll.
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 1))  # A
    w.flush()
    path = tmp_path / name(0)
    with follow_folder(tmp_path, interval=HOUR, show=False) as session:
        feed = feed_of(session)
        at_b = path.stat().st_size
        w.write_many(steps(0, 1, 2))  # B
        w.flush()
        at_c = path.stat().st_size
        w.write_many(steps(0, 2, 3))  # C
        w.flush()
        to = {"in-C-header": at_c + 4, "in-C-payload": at_c + FRAME.size + 3,
              "in-B": at_b + 5}[cut]
        target = at_c + FRAME.size if cut == "in-C-payload" else at_c
        pread = os.pread

        def shrinking(fd: int, n: int, offset: int) -> bytes:
            if offset == target:
                os.truncate(path, to)
            return pread(fd, n, offset)

        monkeypatch.setattr(os, "pread", shrinking)
        delivered = feed.poll()
        monkeypatch.setattr(os, "pread", pread)
        tail = next(iter(feed._tails.values()))
        assert delivered == 3 and session.trace.events(0) == steps(0, 0, 2)  # A, B
        assert tail.pos == at_c  # past B, not past C
        if cut == "in-B":  # shrunk below what was read: truncated, said once
            with pytest.warns(UserWarning, match=r"was truncated while it was followed"):
                feed.poll()
            assert session.stats.rejected == {"truncated": 1}
        else:  # C torn by the shrink: waited for; written again, read
            assert feed.poll() == 0 and feed.problems == []
            with open(path, "r+b") as f:
                f.seek(at_c)
                f.write(frame(steps(0, 2, 3)))
            assert feed.poll() == 3
        assert session.trace.events(0) == steps(0, 0, 2 if cut == "in-B" else 3)
    w.close()


def test_an_unforeseen_error_mid_poll_keeps_the_frames_read_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the issue saw (struct.error out of FileTail.poll), as any error a reader did not
    # foresee: the frames read before it in the same poll are delivered, not dropped with
    # `pos` past them; the file is left with one message.
    w = writer(tmp_path, 0)
    w.write_many(steps(0, 0, 1))
    w.flush()
    path = tmp_path / name(0)
    with follow_folder(tmp_path, interval=HOUR, show=False) as session:
        feed = feed_of(session)
        w.write_many(steps(0, 1, 2))
        w.flush()
        at_c = path.stat().st_size
        w.write_many(steps(0, 2, 3))
        w.flush()
        pread = os.pread

        def failing(fd: int, n: int, offset: int) -> bytes:
            if offset == at_c:
                raise RuntimeError("unforeseen")
            return pread(fd, n, offset)

        monkeypatch.setattr(os, "pread", failing)
        with pytest.warns(UserWarning, match=r"failed at byte .*RuntimeError: unforeseen.*\n"
                          r"Please report this as a ddpviz bug"):
            delivered = feed.poll()
        assert delivered == 3 and session.trace.events(0) == steps(0, 0, 2)
        assert session.stats.received == {0: 6}
        assert session.stats.rejected == {"unreadable": 1}
    w.close()
