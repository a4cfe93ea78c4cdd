"""Text from a file on a terminal (issue 37, L5): a field read from a trace (an END's error, a
name, a value msgspec quotes in its error) can neither start a line of its own (a fake
"ddpviz: healthy" line) nor reorder the text (bidi overrides and isolates, Unicode format
characters): `fileformat.printable` shows them as escapes, and `ddpviz diagnose` builds each of
its lines through it, keeping its own layout."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec
import pytest

from ddpviz.cli import main
from ddpviz.traces.fileformat import EVENTS, FRAME, End, TraceWriter, printable
from tests.diagnose.test_ended import run

FAKE = "ddpviz: healthy: no problems found."
STEERING = ("\n", "\r", "\x1b", "\x85", "\u2028", "\u2029", "\u200b", "\u200e", "\u200f",
            "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068",
            "\u2069", "\ufeff", "\U000e0001")


def test_printable_escapes_what_could_start_a_line_or_reorder_text() -> None:
    assert printable("a\nb") == "a\\nb"
    assert printable("\x1b[2K\x07\r") == "\\x1b[2K\\x07\\x0d"  # (as diagnose always showed them)
    assert printable("abc\u202edef\u2066x\u2069") == "abc\\u202edef\\u2066x\\u2069"
    assert printable("\U000e0001") == "\\U000e0001"
    for c in STEERING:
        assert c not in printable(f"x{c}y"), repr(c)
    # Letters, marks and symbols of any script stay as they are.
    for text in ("fc1.weight", "層.重み", "poids_é", "вес", "🙂", "e\u0301", "a b"):
        assert printable(text) == text


def test_an_end_error_cannot_print_a_line_of_its_own_or_reverse_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = run({0: 3, 1: 3}, open_on=0)  # rank 0 hung
    for r in (0, 1):
        with TraceWriter(tmp_path / f"ddpviz-trace-rank{r}.ddpviz", meta={"rank": r}) as w:
            w.write_many(trace.events(r))
            if r == 1:  # rank 1's process died; its exception's name is the writer's text
                w.write_end(End(1, 43, 0, error=f"E\n{FAKE}\n\u202e\u2066dekcah"))
    assert main(["diagnose", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert FAKE not in lines and not any(c in out for c in STEERING[1:]), out
    assert (f"ddpviz: rank 1 exited on an uncaught E\\n{FAKE}\\n\\u202e\\u2066dekcah; rank 0 "
            "has no end record (still running, or killed).") in lines
    assert lines[0].startswith("ddpviz: ") and "" in lines  # its own layout is kept


def test_a_bad_value_quoted_in_a_files_error_cannot_print_a_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.ddpviz"
    with TraceWriter(path, meta={}) as w:
        w.flush()
    # An event whose type is not one of ddpviz's: msgspec quotes the value in its message.
    payload = msgspec.msgpack.encode([{"type": f"X\n{FAKE}\n\u202eZ", "rank": 0}])
    with open(path, "ab") as f:
        f.write(FRAME.pack(EVENTS, len(payload), zlib.crc32(payload)) + payload)
    assert main(["diagnose", str(path)]) == 2
    err = capsys.readouterr().err
    assert "does not decode within ddpviz's limits" in err, err
    assert FAKE not in err.splitlines() and "\u202e" not in err, err
    assert f"X\\n{FAKE}\\n\\u202eZ" in err
