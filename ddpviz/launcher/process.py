"""Starting and ending rank processes: one fresh interpreter per rank, each in its own session.

Fresh interpreters (never fork) keep CUDA usable in the kernel and in the ranks. A rank leads its
own process group, so signalling the group also reaches whatever the rank started (dataloader
workers, subprocesses): stopping a rank never leaves a grandchild behind. A rank also watches its
control pipe and kills its group when the kernel disappears (see rank.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddpviz.interrupts import interrupts_deferred

# SIGTERM, then SIGKILL after this long: everything is gone within 5 s of a stop.
TERM_GRACE_S = 2.0
_KILL_WAIT_S = 2.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_extensions() -> None:
    """Import torch and zmq with interrupts held back: an interrupt that lands inside the
    first import of a C extension leaves it half-initialised (the next `import torch` then
    segfaults the kernel), and launch() may be the first to import them now that
    `import ddpviz` is lazy."""
    with interrupts_deferred():
        import torch  # noqa: F401
        import zmq  # noqa: F401


def choose_backend(nprocs: int) -> str:
    """NCCL when every rank can have its own GPU, gloo otherwise."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs:
        return "nccl"
    return "gloo"


@dataclass
class RankProcess:
    """One running rank: its process, the pipes to and from it."""

    rank: int
    popen: subprocess.Popen[bytes]
    control: int  # kernel -> rank messages (closing it tells the rank the kernel is gone)
    results: int  # rank -> kernel messages
    stdout: int
    stderr: int
    returncode: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn_rank(rank: int, world_size: int, *, port: int, store: Path, backend: str, mode: str,
               env: Mapping[str, str] | None = None) -> RankProcess:
    """Start `python -m ddpviz.launcher.rank` as `rank` of `world_size` in a new session.

    The ranks rendezvous through a FileStore at `store` (in the run's 0700 directory), not a
    TCPStore that any local or remote process could reach. MASTER_ADDR/MASTER_PORT are still
    set, as torchrun sets them, for code that reads them; nothing listens there.
    """
    to_rank_r, to_rank_w = os.pipe()
    from_rank_r, from_rank_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    child_env = dict(os.environ)
    child_env.update(env or {})
    if world_size > 1:  # as torchrun does: N ranks x all cores each would thrash the machine
        child_env.setdefault("OMP_NUM_THREADS", "1")
    if _has_interface("lo"):  # gloo's pair sockets on loopback only, like everything else
        child_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    root = str(Path(__file__).resolve().parents[2])  # the directory holding ddpviz/
    paths = [root, *(p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    child_env.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
        DDPVIZ_BACKEND=backend, DDPVIZ_MODE=mode, DDPVIZ_STORE=str(store),
        DDPVIZ_CHANNEL=f"{to_rank_r},{from_rank_w}",
        DDPVIZ_SYS_PATH=os.pathsep.join(_absolute(sys.path)),
    )
    child_env["DDPVIZ_PARENT"] = str(os.getpid())
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", "ddpviz.launcher.rank"], env=child_env,
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
            pass_fds=(to_rank_r, from_rank_w), start_new_session=True,
        )
    except BaseException:
        close_fds(to_rank_w, from_rank_r, out_r, err_r)
        raise
    finally:  # the rank's ends of the pipes live in the rank only
        close_fds(to_rank_r, from_rank_w, out_w, err_w)
    _control_ends.add(to_rank_w)
    return RankProcess(rank, popen, to_rank_w, from_rank_r, out_r, err_r)


# [Note: forked children and the control pipe]
# A rank ends when its control pipe reaches EOF, i.e. when every copy of the kernel's end is
# closed. os.pipe() ends are close-on-exec, which covers subprocesses, but os.fork() copies
# every descriptor: a child the kernel forks (multiprocessing's fork workers, a DataLoader
# worker, os.fork() in a cell) held the kernel's end and kept the ranks alive until it exited
# (19 s in issue 23). So in a forked child those ends are pointed at /dev/null (the child
# never talks to the ranks; the descriptor numbers stay valid for any code that closes them).
# The ranks also watch their parent pid (rank.py), for forks that bypass Python's hooks.
_control_ends: set[int] = set()


def _drop_control_ends_in_child() -> None:
    if not _control_ends:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    for fd in _control_ends:
        with contextlib.suppress(OSError):
            os.dup2(null, fd, inheritable=False)
    os.close(null)
    _control_ends.clear()


os.register_at_fork(after_in_child=_drop_control_ends_in_child)


def _has_interface(name: str) -> bool:
    try:
        return any(n == name for _, n in socket.if_nameindex())
    except OSError:
        return False


def _absolute(paths: Iterable[str]) -> list[str]:
    return [os.path.abspath(p) if p else os.getcwd() for p in paths]


def stop_ranks(ranks: Iterable[RankProcess], grace: float = TERM_GRACE_S) -> None:
    """End each rank's whole process group: SIGTERM, SIGKILL after `grace`, then reap."""
    ranks = list(ranks)
    for r in ranks:
        _signal_group(r.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for r in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.popen.wait(max(0.0, deadline - time.monotonic()))
    for r in ranks:
        _signal_group(r.pid, signal.SIGKILL)
    for r in ranks:
        r.returncode = r.popen.wait()
    deadline = time.monotonic() + _KILL_WAIT_S
    while any(group_alive(r.pid) for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.01)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process still runs in the group (zombies waiting for a reaper do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces, so split after ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def close_fds(*fds: int) -> None:
    for fd in fds:
        _control_ends.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
