"""Relays each rank's stdout/stderr into the notebook, live, every line prefixed "[rank r] ".

One reader thread per pipe. In a Jupyter kernel, output written from a thread lands in whichever
cell is executing *now* (ipykernel keeps the parent message in a ContextVar that new threads do
not inherit), so the target captures the launching cell's parent header and every reader thread
re-installs it with `set_thread_parent`: late output still lands in the cell that launched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

# A partial line (a prompt, a progress bar without "\n") is shown after this much silence.
_PARTIAL_AFTER_S = 0.2
_CHUNK = 1 << 16
_EOL = re.compile(rb"\r\n|\n|\r")
_write_lock = threading.Lock()  # one line at a time, whichever rank it comes from


class OutputTarget:
    """Where rank output goes: the stdout/stderr of the cell that was running when captured."""

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.parents = {name: _parent_header(s) for name, s in self.streams.items()}

    @classmethod
    def capture(cls) -> OutputTarget:
        """The current sys.stdout/sys.stderr (in a kernel: the current cell's output)."""
        return cls(sys.stdout, sys.stderr)

    def write(self, name: str, text: str) -> None:
        stream = self.streams[name]
        setter = getattr(stream, "set_thread_parent", None)
        parent = self.parents[name]
        with _write_lock:
            token = setter(parent) if setter is not None and parent is not None else None
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass  # the notebook closed the stream (kernel shutting down): drop the text
            finally:
                reset = getattr(stream, "reset_thread_parent", None)
                if token is not None and reset is not None:
                    reset(token)


def _parent_header(stream: TextIO) -> dict[str, Any] | None:
    header = getattr(stream, "parent_header", None)
    return dict(header) if isinstance(header, dict) and header else None


class PipeRelay:
    """Reads one pipe until EOF and writes its text, prefixed per line, to a target.

    `marker` (optional) is a line the rank writes to mark a point in its output (the end of a
    %%ddp cell); it is swallowed and reported to `on_marker` instead of being shown.
    """

    def __init__(self, fd: int, rank: int, name: str, target: OutputTarget,
                 on_marker: Callable[[str], None] | None = None,
                 marker_prefix: str | None = None) -> None:
        self.fd = fd
        self.prefix = f"[rank {rank}] "
        self.name = name
        self.target = target
        self._on_marker = on_marker
        self._marker_prefix = marker_prefix
        self._at_line_start = True
        self._waiting = False  # in select(): everything read so far was written on
        self._thread = threading.Thread(target=self._pump, name=f"ddpviz-rank{rank}-{name}",
                                        daemon=True)
        self._thread.start()

    def retarget(self, target: OutputTarget) -> None:
        """Send what follows to another cell (the magic does this at every cell)."""
        self.target = target

    def join(self, timeout: float) -> bool:
        """Wait for EOF on the pipe; True when the reader finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def caught_up(self, timeout: float) -> bool:
        """Wait until every byte already in the pipe was read and written on (the rank wrote
        it before some point the kernel learnt of another way, e.g. its park); True when so
        within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                unread = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD,
                                                        b"\0\0\0\0"))[0]
            except OSError:  # closed: nothing more will come
                return True
            if unread == 0 and self._waiting:
                return True
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return not self._thread.is_alive()
            time.sleep(0.005)

    def _pump(self) -> None:
        pending = b""
        try:
            while True:
                wait = _PARTIAL_AFTER_S if pending else None
                self._waiting = not pending  # (a partial line is shown after a pause)
                ready, _, _ = select.select([self.fd], [], [], wait)
                self._waiting = False
                if not ready:  # silence after a partial line: show it now
                    self._emit(pending.decode(errors="replace"), complete=False)
                    pending = b""
                    continue
                chunk = os.read(self.fd, _CHUNK)
                if not chunk:
                    break
                pending += chunk
                lines, pending = _split_lines(pending)
                for line in lines:
                    self._line(line.decode(errors="replace"))
            if pending:
                self._emit(pending.decode(errors="replace"), complete=False)
        except (OSError, ValueError):
            pass  # the fd was closed under us while stopping
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def _line(self, line: str) -> None:
        if self._marker_prefix is not None and self._on_marker is not None:
            stripped = line.rstrip("\r\n")
            at = stripped.find(self._marker_prefix)
            if at >= 0:
                if at:  # text the rank wrote without a newline before the marker
                    self._emit(stripped[:at] + "\n", complete=True)
                self._on_marker(stripped[at + len(self._marker_prefix):])
                return
        self._emit(line, complete=True)

    def _emit(self, text: str, *, complete: bool) -> None:
        if not text:
            return
        out = self.prefix + text if self._at_line_start else text
        self._at_line_start = complete
        self.target.write(self.name, out)


def _split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (ending in \\n, \\r\\n or a bare \\r, kept) and the unfinished rest."""
    lines: list[bytes] = []
    start = 0
    for match in _EOL.finditer(data):
        if match.end() == len(data) and match.group() == b"\r":
            break  # maybe the CR of a CRLF split across two reads: wait for more
        lines.append(data[start:match.end()])
        start = match.end()
    return lines, data[start:]
