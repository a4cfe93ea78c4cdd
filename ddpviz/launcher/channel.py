"""Framed messages on the private pipes between the kernel and each rank it spawned.

A frame is an 8-byte big-endian length and a cloudpickle payload. Both ends are our own
processes on an anonymous pipe (never a network port), so unpickling here is safe; the event
stream, which does cross a socket, uses ddpviz.transport's codec instead.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import cloudpickle

_HEADER = struct.Struct(">Q")


def send(fd: int, message: Any) -> None:
    """Write one message; blocks until the whole frame is in the pipe."""
    payload = cloudpickle.dumps(message)
    view = memoryview(_HEADER.pack(len(payload)) + payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def recv(fd: int) -> Any | None:
    """Read one message, or None when the other end closed the pipe."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _read_exactly(fd, size)
    if payload is None:
        return None
    return cloudpickle.loads(payload)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
