"""A launch's folder and event stream (launcher/resources.py): an interrupt held back while
they are made is raised once they are, and leaves nothing open behind it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ddpviz.launcher import resources
from ddpviz.launcher.stream import EventStream


def test_an_interrupt_while_the_resources_are_made_closes_them_before_it_is_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[EventStream] = []

    def interrupted(session: object) -> EventStream:
        stream = EventStream(None)  # a private session: a collector with its thread
        made.append(stream)
        signal.raise_signal(signal.SIGINT)  # on this thread now (os.kill: maybe another, later)
        return stream

    monkeypatch.setattr(resources, "EventStream", interrupted)
    folders: list[Path] = []
    real_dir = resources.PrivateDir

    def tracked() -> object:
        d = real_dir()
        folders.append(d.path)
        return d

    monkeypatch.setattr(resources, "PrivateDir", tracked)
    # as in a kernel: SIGINT raises KeyboardInterrupt (a test process started in the background
    # by a non-interactive shell inherits SIGINT ignored, and then an interrupt raises nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            resources.run_resources(2, None)
    finally:
        signal.signal(signal.SIGINT, previous)
    (stream,) = made
    collector = stream.session.collector
    assert collector.closed  # its socket closed and its thread joined, not left to the GC
    assert not folders[0].exists()
