"""The ranks' side of a live session: `ddpviz.connect()` and `disconnect()`.

`connect()` runs on a rank (under torchrun, a launcher, or by hand): it reads DDPVIZ_CONNECT and
installs a `Sender` as the process-wide default emitter; without the variable it records to a
local per-rank trace file instead, so nothing is lost. The notebook's side is live.py.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import sys
import threading
from pathlib import Path

from ddpviz import events
from ddpviz.envvars import ENV_CONNECT, ENV_TRACE_DIR, TRACE_FILE
from ddpviz.transport.codec import parse_connect_string
from ddpviz.transport.sender import Sender

_connected: Sender | None = None
_previous_emitter: events.Emitter | None = None
_connect_lock = threading.Lock()


def connect(*, rank: int | None = None, trace_dir: str | os.PathLike[str] | None = None,
            capacity: int = 1 << 16, batch: int = 1024) -> Sender:
    """On a rank: stream this process's events to the notebook session in DDPVIZ_CONNECT.

    Installs a Sender as the process-wide default emitter (so call it before building
    `ddpviz.DistributedDataParallel`); it is flushed and closed at exit. Without DDPVIZ_CONNECT
    the events go to `ddpviz-trace-rank{R}.ddpviz` in DDPVIZ_TRACE_DIR (or `trace_dir`, or the
    current directory); load them with `ddpviz.Trace.load`. Calling it again returns the same
    Sender.

    Args:
        rank: this process's rank (default: $RANK as set by torchrun, else the initialized
            process group's rank, else 0).
        trace_dir: where the fallback trace file goes.
        capacity, batch: see `Sender`.

    Returns:
        The process's `Sender` (live, or writing the fallback trace file).
    """
    global _connected, _previous_emitter
    with _connect_lock:
        if _connected is not None:
            return _connected
        rank = _this_rank() if rank is None else rank
        target = os.environ.get(ENV_CONNECT, "").strip()
        if target:
            sender = Sender(target, rank, capacity=capacity, batch=batch)
            _say_if_remote(target, rank)
        else:
            folder = Path(trace_dir or os.environ.get(ENV_TRACE_DIR) or ".")
            folder.mkdir(parents=True, exist_ok=True)
            sender = Sender.to_file(folder / TRACE_FILE.format(rank=rank), rank,
                                    capacity=capacity, batch=max(batch, 4096))
        _previous_emitter = events.set_default_emitter(sender)
        _connected = sender
        atexit.register(disconnect)
        return sender


def _say_if_remote(target: str, rank: int) -> None:
    """Events leaving this machine are worth a line (once per node: on local rank 0), so that
    a DDPVIZ_CONNECT inherited from somewhere unexpected is not followed silently."""
    address, _ = parse_connect_string(target)
    host = address.rsplit(":", 1)[0].removeprefix("tcp://").strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a host name: not resolved here (no DNS lookup on a rank's start)
    if not loopback and os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"ddpviz: rank {rank} sends its events to {host} (not this machine's loopback), "
              f"from ${ENV_CONNECT}.\nIf that is not your notebook's machine, unset "
              f"{ENV_CONNECT}.", file=sys.stderr)


def disconnect(timeout: float = 10.0) -> None:
    """Undo `connect()`: ship what is buffered, close the Sender, restore the previous
    default emitter. Runs at exit on its own."""
    global _connected, _previous_emitter
    with _connect_lock:
        sender, _connected = _connected, None
        if sender is None:
            return
        if events.default_emitter() is sender:
            events.set_default_emitter(_previous_emitter)
        _previous_emitter = None
    atexit.unregister(disconnect)
    sender.close(timeout)


def _this_rank() -> int:
    value = os.environ.get("RANK")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"ddpviz: RANK={value!r} is not an integer.\nUnset it or pass "
                             "ddpviz.connect(rank=...).") from None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    return 0
