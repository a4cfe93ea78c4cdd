"""The dashboard's Perfetto buttons (ddpviz/widgets/perfetto_button.py): nothing is sent until the
front end asks; asked, the kernel answers with the run as it is then, as one `.ddpviz` file in a
message buffer that loads back as the same events, or with a message saying why not (a run over
the bound); messages that are not its front end's are ignored. The click itself, the handshake
and the Chrome trace are tested in Chromium (tests/browser/test_perfetto.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpviz.traces.trace import Trace
from ddpviz.widgets import trace_view
from ddpviz.widgets.dashboard import Dashboard
from ddpviz.widgets.perfetto_button import PerfettoButton
from tests.widgets.streams import synthetic_run


class Sent:
    """What the widget sent to its front end."""

    def __init__(self, button: PerfettoButton, monkeypatch: pytest.MonkeyPatch) -> None:
        self.messages: list[tuple[dict[str, Any], list[bytes]]] = []
        monkeypatch.setattr(button, "send", lambda content, buffers=None: self.messages.append(
            (content, list(buffers or []))))


def ask(button: PerfettoButton, content: Any) -> None:
    button._on_request(button, content, [])


def test_asked_it_sends_the_run_as_it_is_then(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    events = synthetic_run(2, steps=3)
    button = PerfettoButton(events[:10], name="my run")
    sent = Sent(button, monkeypatch)
    assert sent.messages == []  # nothing until asked
    button._source = events  # (a live run grows: the answer is the run when asked)
    ask(button, {"kind": "chrome", "id": 7})
    ((content, buffers),) = sent.messages
    assert content == {"kind": "trace", "id": 7, "name": "my run"}
    path = tmp_path / "sent.ddpviz"
    path.write_bytes(buffers[0])
    got, want = Trace.load(path), Trace(events)
    assert {r: list(got.events(r)) for r in got.ranks} == {
        r: list(want.events(r)) for r in want.ranks}


def test_a_run_over_the_bound_is_refused_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    button = PerfettoButton(Trace(synthetic_run(2, steps=3)))
    sent = Sent(button, monkeypatch)
    monkeypatch.setattr(trace_view, "MAX_BYTES", 100)
    ask(button, {"kind": "chrome", "id": 1})
    ((content, buffers),) = sent.messages
    assert content["kind"] == "error" and content["id"] == 1 and buffers == []
    assert "MiB a TraceView sends to the browser" in content["message"]


def test_other_messages_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    button = PerfettoButton(Trace(synthetic_run(2, steps=1)))
    sent = Sent(button, monkeypatch)
    for content in (None, "chrome", {"kind": "other", "id": 1}, {"kind": "chrome"},
                    {"kind": "chrome", "id": "1"}, {"kind": "chrome", "id": True}):
        ask(button, content)
    assert sent.messages == []


def test_the_dashboard_has_the_buttons_for_its_source(tmp_path: Path) -> None:
    path = Trace(synthetic_run(2, steps=2)).save(tmp_path / "run.ddpviz")
    board = Dashboard(path)
    assert isinstance(board.perfetto, PerfettoButton) and board.perfetto.name == "run.ddpviz"
    assert board.perfetto in board.children
    board.close()
    empty = Dashboard()  # events fed by hand: no run to send
    assert empty.perfetto is None
    empty.close()
