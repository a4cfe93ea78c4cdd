"""Sessions in one process: listen/connect, replaying subscribers, iterators, recording."""

from __future__ import annotations

import stat
import threading

import pytest

import ddpviz
from ddpviz import events as ev
from ddpviz.session.connect import disconnect
from ddpviz.traces.trace import Trace
from ddpviz.transport import Sender


@pytest.fixture(autouse=True)
def _no_leftover_connection():
    yield
    disconnect()
    ev.set_default_emitter(None)


def test_listen_shows_where_the_connect_string_is_never_the_secret(capsys):
    with ddpviz.listen() as session:
        out = capsys.readouterr().out
        secret = session.collector.secret
        assert secret not in out and session.connect_string not in out
        assert session.collector.address in out and "127.0.0.1" in out
        path = session.connect_file
        assert path is not None and f'DDPVIZ_CONNECT="$(cat {path})"' in out
        assert path.read_text().strip() == session.connect_string
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert session.env == {"DDPVIZ_CONNECT": session.connect_string}
        assert session.collector.host == "127.0.0.1"
        assert secret not in repr(session) and secret not in repr(session.collector)
    assert not path.exists() and not path.parent.exists()


def test_connect_installs_a_sender_as_default_emitter(monkeypatch):
    with ddpviz.listen(show=False) as session:
        monkeypatch.setenv("DDPVIZ_CONNECT", session.connect_string)
        monkeypatch.setenv("RANK", "3")
        sender = ddpviz.connect()
        assert ddpviz.connect() is sender and ev.default_emitter() is sender
        tap = ev.Tap(ev.default_emitter(), 3)
        for i in range(50):
            tap.emit(ev.GradReady, i, 0)
        disconnect()
        assert ev.default_emitter() is None
        assert session.wait(ranks=1, timeout=10)
        assert [e.seq for e in session.trace.events(3)] == list(range(50))


def test_connect_without_the_variable_records_locally(monkeypatch, tmp_path):
    monkeypatch.delenv("DDPVIZ_CONNECT", raising=False)
    monkeypatch.setenv("DDPVIZ_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    tap = ev.Tap(ddpviz.connect(), 1)
    for i in range(20):
        tap.emit(ev.GradReady, i, 0)
    disconnect()
    trace = ddpviz.Trace.load(tmp_path / "ddpviz-trace-rank1.ddpviz")
    assert [e.param for e in trace.events(1)] == list(range(20))  # type: ignore[attr-defined]


def test_bad_rank_variable_is_a_user_error(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        ddpviz.connect()


def test_replaying_subscribers_and_iterators_see_everything_once(tmp_path):
    record = tmp_path / "live.ddpviz"
    with ddpviz.listen(show=False, record=record) as session:
        sender = Sender(session.connect_string, 0, batch=16)
        tap = ev.Tap(sender, 0)
        for i in range(100):
            tap.emit(ev.GradReady, i, 0)
        assert session.wait(events=100, timeout=10)
        replayed: list[ev.Event] = []
        session.subscribe(replayed.append, replay=True)
        from_iter: list[ev.Event] = []

        def consume() -> None:
            for e in session.events(replay=True):
                from_iter.append(e)

        worker = threading.Thread(target=consume)
        worker.start()
        for i in range(100):
            tap.emit(ev.GradReady, i, 1)
        sender.close()
        assert session.wait(ranks=1, timeout=10)
    worker.join(10)  # the iterator ended with the session
    assert not worker.is_alive()
    assert [e.seq for e in replayed] == list(range(200))
    assert [e.seq for e in from_iter] == list(range(200))
    assert Trace.load(record).events(0) == session.trace.events(0)
    assert Trace.load(record).clock == {0: (0, 0)}


def test_binds_loopback_by_default_and_a_busy_port_is_a_clear_error():
    import zmq

    with ddpviz.listen(show=False) as session:
        endpoint = session.collector._sock.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes) and endpoint.startswith(b"tcp://127.0.0.1:")
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{session.collector.port}"):
            ddpviz.listen(port=session.collector.port, show=False)
