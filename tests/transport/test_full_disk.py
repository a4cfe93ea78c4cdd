"""A full disk: saves keep the previous file and say which path failed and why; a recording
session keeps delivering events, reports the failure once, and closes without raising."""

from __future__ import annotations

import errno
import io
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

import ddpviz
from ddpviz import atomic
from ddpviz import events as ev
from ddpviz.atomic import SaveError
from ddpviz.report.html import write_report
from ddpviz.session.connect import disconnect
from ddpviz.traces import fileformat as tracefile
from ddpviz.traces.trace import Trace
from ddpviz.transport import Sender


class _FullDisk(io.RawIOBase):
    """A file on a disk with `room` bytes left: writes beyond it fail with ENOSPC."""

    def __init__(self, real: Any, room: list[int]) -> None:
        self._real, self._room = real, room

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        if len(data) > self._room[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room[0] -= len(data)
        return int(self._real.write(data))

    def fileno(self) -> int:
        return int(self._real.fileno())

    def close(self) -> None:
        self._real.close()
        super().close()


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Files ddpviz opens for writing share `room[0]` bytes of space (set by the test)."""
    room = [1 << 40]
    real_open = open

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not any(c in mode for c in "wxa+"):
            return real_open(path, mode, *args, **kwargs)
        raw = _FullDisk(real_open(path, mode.replace("t", "") if "b" in mode else mode + "b",
                                  buffering=0), room)
        return io.BufferedWriter(raw) if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw))

    monkeypatch.setattr(tracefile, "open", opener, raising=False)  # TraceWriter's file
    monkeypatch.setattr(atomic, "open", opener, raising=False)
    return room


def _trace(n: int) -> Trace:
    t = Trace(meta={"run": "x"})
    t.extend([ev.GradReady(r, 0, 1000 + s, s, s % 7, 0) for r in (0, 1) for s in range(n)])
    return t


def _tmp_left(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith((".tmp", ".part"))]


def test_a_save_on_a_full_disk_keeps_the_old_trace_and_names_the_path(
        tmp_path: Path, full_disk: list[int]) -> None:
    path = tmp_path / "run.ddpviz"
    good = _trace(100)
    good.save(path)
    before = path.read_bytes()
    full_disk[0] = 2000  # room for the header and part of the events
    with pytest.raises(SaveError) as info:
        _trace(5000).save(path)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).startswith(f"ddpviz: could not save {path}: No space left on device;"
                                      " the previous file (if any) is unchanged.")
    assert "Free some space" in str(info.value)
    assert path.read_bytes() == before
    assert Trace.load(path).events() == good.events()
    assert _tmp_left(tmp_path) == []
    full_disk[0] = 1 << 40  # space again: the save goes through and replaces it
    _trace(5000).save(path)
    assert len(Trace.load(path)) == 10_000


@pytest.mark.parametrize("kind", ["report", "chrome"])
def test_report_and_chrome_export_on_a_full_disk_keep_the_old_file(
        tmp_path: Path, full_disk: list[int], kind: str) -> None:
    path = tmp_path / f"out.{kind}"
    path.write_text("the previous version")
    full_disk[0] = 100
    with pytest.raises(SaveError, match=rf"^ddpviz: could not save {path}: No space left"):
        if kind == "report":
            write_report(_trace(200), path)
        else:
            _trace(200).to_chrome_trace(path)
    assert path.read_text() == "the previous version"
    assert _tmp_left(tmp_path) == []


def test_a_save_into_a_missing_directory_says_where(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "run.ddpviz"
    with pytest.raises(SaveError, match=rf"^ddpviz: could not save {path}: No such file"):
        _trace(3).save(path)


def test_a_recording_session_on_a_full_disk_keeps_delivering_and_closes_cleanly(
        tmp_path: Path, full_disk: list[int]) -> None:
    record = tmp_path / "live.ddpviz"
    _trace(10).save(record)
    before = record.read_bytes()
    got: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = ddpviz.listen(show=False, record=record)
        session.subscribe(got.append)
        iterated: list[Any] = []
        worker = threading.Thread(target=lambda: iterated.extend(session.events()))
        worker.start()
        full_disk[0] = 3000  # the disk fills up while the run streams
        with Sender(session.connect_string, 0, batch=64) as sender:
            tap = ev.Tap(sender, 0)
            for i in range(2000):
                tap.emit(ev.GradReady, i, 0)
        assert session.wait(ranks=1, timeout=30)
        session.close()  # must not raise
        worker.join(10)
    assert not worker.is_alive()  # the iterator ended
    assert [e.seq for e in got] == list(range(2000))
    assert [e.seq for e in iterated] == list(range(2000))
    assert len(session.trace) == 2000
    assert isinstance(session.record_error, SaveError)
    assert session.record_error.errno == errno.ENOSPC
    ours = [w for w in caught if "could not save" in str(w.message)]
    assert len(ours) == 1  # reported once
    assert str(ours[0].message).startswith(f"ddpviz: could not save {record}: No space left")
    assert record.read_bytes() == before  # the earlier recording survives
    assert _tmp_left(tmp_path) == []
    disconnect()


def test_a_recording_session_renames_its_file_into_place_at_close(tmp_path: Path) -> None:
    record = tmp_path / "live.ddpviz"
    with ddpviz.listen(show=False, record=record) as session:
        with Sender(session.connect_string, 0) as sender:
            tap = ev.Tap(sender, 0)
            for i in range(50):
                tap.emit(ev.GradReady, i, 0)
        assert session.wait(ranks=1, timeout=30)
        part = tmp_path / "live.ddpviz.part"
        assert part.exists() and not record.exists()  # crash-safe stream under .part
        assert len(Trace.load(part)) == 50
    assert record.exists() and not part.exists()
    assert session.record_error is None
    assert [e.seq for e in Trace.load(record).events(0)] == list(range(50))


def test_a_file_sender_on_a_full_disk_counts_every_event_it_did_not_write(
        tmp_path: Path, full_disk: list[int]) -> None:
    # Issue 23: of 80,000 events, the 61,440 in the buffer when the disk filled were neither
    # written nor counted, and the warning spoke of a connect string.
    path = tmp_path / "rank0.ddpviz"
    full_disk[0] = 1_000_000
    produced = 80_000
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sender = Sender.to_file(path, 0, capacity=1 << 17)
        tap = ev.Tap(sender, 0)
        for i in range(produced):
            tap.emit(ev.GradReady, i, 0)
        sender.close()
    assert isinstance(sender.error, OSError) and sender.error.errno == errno.ENOSPC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the file ends mid-frame: its loader says so
        written = [e for e in Trace.load(path).events() if type(e) is not ev.EventsDropped]
    assert 0 < len(written) < produced
    assert len(written) + sender.stats.dropped == produced
    said = " ".join(str(w.message) for w in caught)
    assert f"to {path} stopped" in said and "free space there" in said
    assert "connect string" not in said


def test_drops_pending_when_the_sender_fails_are_counted_once(
        tmp_path: Path, full_disk: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # The buffer is full and the drops since its last marker are pending when the disk turns
    # out full: they were counted as they happened, and were counted a second time when the
    # sender stopped (a CI run: 12,288 written + 74,862 "dropped" of 80,000 events).
    release = threading.Event()
    write = _FullDisk.write

    def write_when_released(self: _FullDisk, b: Any) -> int:
        release.wait(30)
        return write(self, b)

    monkeypatch.setattr(_FullDisk, "write", write_when_released)
    full_disk[0] = 0
    produced = 1_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sender = Sender.to_file(tmp_path / "rank0.ddpviz", 0, capacity=64)
        tap = ev.Tap(sender, 0)
        for i in range(produced):  # 64 buffered, the rest dropped while the first write waits
            tap.emit(ev.GradReady, i, 0)
        release.set()
        sender.close()
    assert isinstance(sender.error, OSError) and sender.error.errno == errno.ENOSPC
    assert sender.stats.sent == 0
    assert sender.stats.dropped == produced
