"""The output relay without processes: line splitting, rank prefixes, partial lines, cell-end
markers, and writing under the launching cell's parent header from a reader thread."""

from __future__ import annotations

import contextvars
import io
import os
import time
from typing import Any

import pytest

from ddpviz.launcher.output import OutputTarget, PipeRelay, _split_lines


class CellStream(io.StringIO):
    """Mimics ipykernel's OutStream: the parent header is a ContextVar (new threads do not
    inherit it: they see the global one, i.e. the cell executing now)."""

    def __init__(self, msg_id: str) -> None:
        super().__init__()
        self._var: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("parent")
        self._var.set({"msg_id": msg_id})
        self.global_parent = {"msg_id": msg_id}
        self.writes: list[tuple[str, str]] = []

    @property
    def parent_header(self) -> dict[str, Any]:
        try:
            return self._var.get()
        except LookupError:
            return self.global_parent

    def set_thread_parent(self, parent: dict[str, Any]) -> contextvars.Token[dict[str, Any]]:
        return self._var.set(dict(parent))

    def reset_thread_parent(self, token: contextvars.Token[dict[str, Any]]) -> None:
        self._var.reset(token)

    def write(self, text: str) -> int:
        self.writes.append((self.parent_header["msg_id"], text))
        return len(text)


def relay_text(chunks: list[bytes], pause: float = 0.0, **kwargs: Any) -> list[str]:
    read, write = os.pipe()
    out, err = CellStream("cell"), CellStream("cell")
    relay = PipeRelay(read, 3, "stdout", OutputTarget(out, err), **kwargs)
    for chunk in chunks:
        os.write(write, chunk)
        time.sleep(pause)
    os.close(write)
    assert relay.join(5.0)
    return [text for _, text in out.writes]


@pytest.mark.parametrize(("data", "lines", "rest"), [
    (b"a\nb\r\nc", [b"a\n", b"b\r\n"], b"c"),
    (b"10%\r20%\rdone\n", [b"10%\r", b"20%\r", b"done\n"], b""),
    (b"half\r", [], b"half\r"),  # could be the start of \r\n: wait for the next read
    (b"", [], b""),
])
def test_split_lines_keeps_terminators_and_the_unfinished_rest(
        data: bytes, lines: list[bytes], rest: bytes) -> None:
    assert _split_lines(data) == (lines, rest)


def test_every_line_is_prefixed_once_even_when_split_across_reads() -> None:
    text = relay_text([b"one\ntw", b"o\nthree"], pause=0.0)
    assert "".join(text) == "[rank 3] one\n[rank 3] two\n[rank 3] three"


def test_a_partial_line_is_shown_after_silence_and_continued_without_a_new_prefix() -> None:
    text = relay_text([b"Password: ", b"ok\n"], pause=0.6)
    assert text == ["[rank 3] Password: ", "ok\n"]


def test_cell_end_markers_are_swallowed_and_reported() -> None:
    seen: list[str] = []
    text = relay_text([b"out\nno newline\x1eEND:7\n", b"after\n"], on_marker=seen.append,
                      marker_prefix="\x1eEND:")
    assert seen == ["7"]
    assert "".join(text) == "[rank 3] out\n[rank 3] no newline\n[rank 3] after\n"


def test_reader_threads_write_under_the_launching_cells_parent() -> None:
    out, err = CellStream("launching"), CellStream("launching")
    target = OutputTarget(out, err)
    out.global_parent = err.global_parent = {"msg_id": "a later cell"}  # the kernel moved on
    read, write = os.pipe()
    relay = PipeRelay(read, 0, "stderr", target)
    os.write(write, b"late\n")
    os.close(write)
    assert relay.join(5.0)
    assert err.writes == [("launching", "[rank 0] late\n")]
    assert out.writes == []
