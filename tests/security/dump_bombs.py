"""Small hostile Flight Recorder dumps that once took gigabytes or hung the kernel where Ctrl-C
cannot reach it (issue #23): Python's unpickler sizes its memo by an index read from the file,
builds everything before any bound applies, and hashes a dict key however it is built; JSON
is parsed whole. Shared by tests/security/test_dump_bombs.py and benchmarks/bench_hostile.py.
Each returns the file's bytes (written as `fr_0`, a name the postmortem reads as rank 0)."""

from __future__ import annotations

import struct
from collections.abc import Callable


def memo_index() -> bytes:
    """9 bytes: LONG_BINPUT 0x0C000000 (pickle grows its memo list to that index: 3.3 GB)."""
    return b"\x80\x02Nr" + struct.pack("<I", 0x0C000000) + b"."


def list_flood(mib: int = 48) -> bytes:
    """One list of `mib` Mi empty lists (one byte each in the file, ~80 bytes in memory)."""
    return b"\x80\x02](" + b"]" * (mib << 20) + b"e."


def none_flood(mib: int = 200) -> bytes:
    """One list of `mib` Mi Nones: 8 bytes of memory per byte of file, and as many opcodes."""
    return b"\x80\x02](" + b"N" * (mib << 20) + b"e."


def tuple_dag_key(levels: int = 80) -> bytes:
    """A dict keyed by a tuple of two references to a tuple of two references to ... None:
    `levels` deep, 2**levels leaves to hash, in one C call (4 bytes per level)."""
    body = b"Nq\x00" + b"h\x00\x86q\x00" * levels
    return b"\x80\x02}" + body + b"Ns."


def json_empty_lists(mib: int = 64) -> bytes:
    """A JSON list of empty lists (3 bytes each in the file, ~80 bytes in memory)."""
    n = (mib << 20) // 3
    return b"[" + b"[]," * (n - 1) + b"[]]"


DUMP_BOMBS: dict[str, Callable[[], bytes]] = {
    "pickle memo index 0x0C000000": memo_index, "pickle list flood 48 MiB": list_flood,
    "pickle None flood 200 MiB": none_flood, "pickle tuple-DAG dict key": tuple_dag_key,
    "JSON empty lists 64 MiB": json_empty_lists,
}
