"""What runs inside each rank process the launcher spawns (`python -m ddpviz.launcher.rank`).

Two modes. "call": receive one cloudpickled (fn, args, kwargs), join the process group, run it,
send back the return value or the traceback. "cells": join the process group once, then execute
%%ddp cell sources one after another in a namespace that lives as long as the process.
The rank watches its control pipe: when the kernel goes away the pipe closes, and the rank kills
its own process group, so nothing outlives the notebook.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import contextlib
import linecache
import os
import queue
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from ddpviz.launcher import channel, stacks
from ddpviz.launcher.cells import restore_origins

# Written on stdout and stderr after each cell so the kernel knows it has all the cell's output.
CELL_END = "\x1eddpviz-cell-end:"


def main() -> int:
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    control, results = (int(fd) for fd in os.environ.pop("DDPVIZ_CHANNEL").split(","))
    for fd in (control, results):
        os.set_inheritable(fd, False)  # a subprocess of the rank must not hold them open
    for path in os.environ.pop("DDPVIZ_SYS_PATH", "").split(os.pathsep):
        if path and path not in sys.path:
            sys.path.append(path)
    mode = os.environ.pop("DDPVIZ_MODE")
    stacks.install_in_rank()  # where is this rank stuck? asked before a hung rank is stopped
    backend = os.environ.pop("DDPVIZ_BACKEND")
    inbox = _watch_control(control)
    reply: Callable[[Any], None] = lambda message: channel.send(results, message)  # noqa: E731
    if mode == "call":
        return _serve_call(rank, world_size, backend, inbox, reply)
    return _serve_cells(rank, world_size, backend, inbox, reply)


_PARENT_POLL_S = 0.5


def _watch_control(fd: int) -> queue.Queue[Any]:
    """Messages from the kernel, read by a thread that ends the rank if the kernel goes away
    (its pipe closes, or this process gets another parent: See [Note: forked children and the
    control pipe] in process.py)."""
    inbox: queue.Queue[Any] = queue.Queue()
    parent = int(os.environ.pop("DDPVIZ_PARENT", "0") or 0)

    def die() -> None:  # the kernel is gone: take everything down
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    def pump() -> None:
        while True:
            try:
                message = channel.recv(fd)
            except Exception:
                message = None
            if message is None:  # the kernel closed the pipe or died
                die()
            inbox.put(message)

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        die()

    threading.Thread(target=pump, name="ddpviz-control", daemon=True).start()
    if parent:
        threading.Thread(target=orphaned, name="ddpviz-parent", daemon=True).start()
    return inbox


def _failure(phase: str, exc: BaseException, skip_frames: int = 0) -> tuple[Any, ...]:
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return ("error", phase, type(exc).__name__, str(exc), text)


def _start(rank: int, world_size: int, backend: str,
           reply: Callable[[Any], None]) -> _EventLink | None:
    """Join the process group and open the event link; on failure report it and return None."""
    try:
        _init_process_group(rank, world_size, backend)
        return _EventLink.open(rank, reply)
    except BaseException as exc:
        reply(_failure("init", exc))
        return None


def _serve_call(rank: int, world_size: int, backend: str, inbox: queue.Queue[Any],
                reply: Callable[[Any], None]) -> int:
    _, payload, sources, origins = inbox.get()
    _seed_linecache(sources)
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
    except BaseException as exc:
        reply(_failure("unpickle", exc))
        return 1
    restore_origins(fn, origins)
    events = _start(rank, world_size, backend, reply)
    if events is None:
        return 1
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        events.close()
        reply(_failure("call", exc, skip_frames=1))
        return 1
    events.close()
    _destroy_process_group()
    try:
        data = cloudpickle.dumps(value)
    except BaseException as exc:
        reply(_failure("result", exc))
        return 1
    _flush_std()
    reply(("ok", data))
    return 0


def _serve_cells(rank: int, world_size: int, backend: str, inbox: queue.Queue[Any],
                 reply: Callable[[Any], None]) -> int:
    # Cells run in a real __main__ module, so classes they define can be pickled by reference.
    main_module = types.ModuleType("__main__")
    namespace = main_module.__dict__
    namespace.update(__builtins__=builtins, rank=rank, world_size=world_size)
    sys.modules["__main__"] = main_module
    events = _start(rank, world_size, backend, reply)
    if events is None:
        return 1
    reply(("ready",))
    while True:
        message = inbox.get()
        if message[0] == "exit":
            break
        _, cell_id, source, filename, after = message
        _await_commands(after)
        outcome = _run_cell(source, filename, namespace)
        _flush_std()
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.write(fd, f"{CELL_END}{cell_id}\n".encode())
        events.flush()
        reply(("done", cell_id, *outcome))
    events.close()
    _destroy_process_group()
    return 0


_COMMANDS_WAIT_S = 30.0  # a cell waits this long for the debugger commands sent before it


def _await_commands(request: int) -> None:
    """Under %%ddp --debug: start the cell only once the debugger's commands sent before it
    (its breaks) reached this rank: they travel on the event link, the cell on the pipe."""
    if request <= 0:
        return
    from ddpviz.debugger.controller import wait_received

    if not wait_received(request, _COMMANDS_WAIT_S):
        sys.stderr.write(f"ddpviz: the debugger's commands sent before this cell did not reach "
                         f"this rank within {_COMMANDS_WAIT_S:.0f} s; breaks set just before "
                         "it may not stop it (dbg.breaks shows the set).\n")


def _run_cell(source: str, filename: str, namespace: dict[str, Any]) -> tuple[Any, ...]:
    """(True, repr of the last expression or None) or (False, failure tuple)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        tree = ast.parse(source, filename, "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
        else:
            last = None
        exec(compile(tree, filename, "exec"), namespace)
        if last is None:
            return (True, None)
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        return (True, None if value is None else _safe_repr(value))
    except BaseException as exc:
        return (False, _failure("cell", exc, skip_frames=1))


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<repr of {type(value).__name__} failed: {exc}>"


def _seed_linecache(sources: dict[str, str]) -> None:
    """Notebook cells are not files: give tracebacks their source lines anyway."""
    for filename, text in sources.items():
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _init_process_group(rank: int, world_size: int, backend: str) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    # A FileStore in the run's private directory (see process.spawn_rank): no listening socket.
    store = dist.FileStore(os.environ.pop("DDPVIZ_STORE"), world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class _EventLink:
    """This rank's event stream to the kernel's session: `ddpviz.connect()` installs a Sender
    as the process-wide default emitter, so a `ddpviz.DistributedDataParallel` built on this
    rank reports there without being told."""

    def __init__(self, sender: Any, reply: Callable[[Any], None]) -> None:
        self._sender = sender
        self._reply = reply

    @classmethod
    def open(cls, rank: int, reply: Callable[[Any], None]) -> _EventLink:
        if not os.environ.get("DDPVIZ_CONNECT"):
            return cls(None, reply)
        from ddpviz.debugger.controller import install_from_env
        from ddpviz.session.connect import connect

        sender = connect(rank=rank)
        install_from_env(sender, rank)  # launch(debug=True): the notebook's debugger
        return cls(sender, reply)

    def flush(self, timeout: float = 5.0) -> None:
        """Ship everything emitted so far, then tell the kernel how many events that was (it
        waits for them before the cell or run counts as finished)."""
        if self._sender is not None:
            self._sender.flush(timeout)
            self._reply(("events", self._sender.stats.sent))

    def close(self, timeout: float = 5.0) -> None:
        if self._sender is not None:
            from ddpviz.session.connect import disconnect

            disconnect(timeout)
            self._reply(("events", self._sender.stats.sent))
            self._sender = None


def _leave(code: int) -> None:
    """Exit without the interpreter's teardown: atexit handlers run (the user's and
    `ddpviz.connect`'s), output is flushed, then the process ends at once. Tearing down an
    interpreter that imported torch takes ~6 s on a loaded 2-core machine (measured), long
    enough for the kernel to take a rank that already returned for a hung one."""
    try:
        atexit._run_exitfuncs()
    finally:
        _flush_std()
        os._exit(code)


if __name__ == "__main__":
    try:
        _code = main()
    except SystemExit as exc:
        _code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        _code = 1
    _leave(_code)
