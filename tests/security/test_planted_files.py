"""Files ddpviz creates in shared folders: a symbolic link planted under the name a rank's trace
or a session's `.part` will take is never written through (its target is unchanged, the error
says what to do), and temporary files a killed save left behind are swept by the next save."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import ddpviz
from ddpviz import atomic
from ddpviz import events as ev
from ddpviz.atomic import LinkError
from ddpviz.traces.trace import Trace
from ddpviz.transport import Sender


def _plant(tmp_path: Path, name: str) -> tuple[Path, Path]:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / name
    link.symlink_to(victim)
    return link, victim


def test_a_rank_trace_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    link, victim = _plant(tmp_path, "ddpviz-trace-rank0.ddpviz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sender = Sender.to_file(link, 0)
        ev.Tap(sender, 0).emit(ev.GradReady, 1, 0)
        sender.close()
    assert victim.read_text() == "precious" and link.is_symlink()
    assert isinstance(sender.error, LinkError)
    said = " ".join(str(w.message) for w in caught)
    assert "is a symbolic link" in said and f"rm {link}" in said
    assert sender.stats.dropped == 1 and sender.stats.sent == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_rank_trace_replaces_a_regular_file_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "ddpviz-trace-rank0.ddpviz"
    path.write_text("an old run")
    with Sender.to_file(path, 0) as sender:
        tap = ev.Tap(sender, 0)
        for i in range(10):
            tap.emit(ev.GradReady, i, 0)
    assert [e.seq for e in Trace.load(path).events(0)] == list(range(10))


def test_a_recording_session_never_writes_through_a_planted_part_link(tmp_path: Path) -> None:
    record = tmp_path / "live.ddpviz"
    _link, victim = _plant(tmp_path, "live.ddpviz.part")
    with pytest.raises(LinkError, match=r"live\.ddpviz\.part: it is a symbolic link"):
        ddpviz.listen(show=False, record=record)
    assert victim.read_text() == "precious" and not record.exists()


def test_a_killed_saves_temporary_file_is_swept_by_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "run.ddpviz"
    t = Trace(meta={})
    t.extend([ev.GradReady(0, 0, 1000 + s, s, 0, 0) for s in range(1000)])
    # A save killed with -9 mid-write (its temporary file holds part of the trace).
    code = ("import os, sys; from ddpviz import atomic; from pathlib import Path\n"
            "tmp = atomic.temporary_path(Path(sys.argv[1])); tmp.write_bytes(b'x' * 100000)\n"
            "print(tmp, flush=True); os.kill(os.getpid(), 9)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout
    dead = Path(out.strip())
    assert dead.exists()
    live = atomic.temporary_path(path)  # a concurrent writer in a live process (this one)
    live.write_bytes(b"being written")
    other = path.with_name(f".{path.name}.123@otherhost.abcdef12.tmp")  # another host's
    other.write_bytes(b"being written elsewhere")
    old = path.with_name(f".{path.name}.0badc0de.tmp")  # an earlier version's, a day old
    old.write_bytes(b"abandoned")
    os.utime(old, (time.time() - 86400, time.time() - 86400))
    unrelated = tmp_path / ".other.ddpviz.1.abcdef12.tmp"
    unrelated.write_bytes(b"not ours")
    t.save(path)
    assert not dead.exists() and not old.exists()
    assert live.exists() and other.exists() and unrelated.exists()
    assert len(Trace.load(path)) == 1000
