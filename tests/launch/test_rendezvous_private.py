"""Ranks started by launch() and %%ddp meet through a store nobody else can reach, and their
temporary directories go away, even when the kernel was killed with SIGKILL."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import ddpviz
from ddpviz.private_dir import OWNER, PREFIX, PrivateDir, sweep_stale
from tests.launch import rank_fns
from tests.launch.processes import still_alive

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.dist
def test_launched_ranks_meet_through_a_file_store_in_a_0700_dir_and_listen_on_loopback() -> None:
    run = ddpviz.launch(rank_fns.rendezvous_facts, 2)
    directory = run._dir.path
    mode = stat.S_IMODE(directory.stat().st_mode)
    facts = run.wait()
    assert mode == 0o700
    assert [f["store"] for f in facts] == ["FileStore", "FileStore"]
    assert {Path(f["path"]).parent for f in facts} == {directory}
    assert facts[0]["peer_pid"] == facts[1]["pid"] and facts[1]["peer_pid"] == facts[0]["pid"]
    for f in facts:  # no TCPStore; gloo's own sockets on loopback only
        assert all(ipaddress.ip_address(a).is_loopback for a, _ in f["listening"]), f
    assert not directory.exists()  # removed with the run


@pytest.mark.dist
def test_the_pool_meets_through_a_file_store_too() -> None:
    from ddpviz.launcher.pool import RankPool

    pool = RankPool(2)
    try:
        result = pool.run_cell(textwrap.dedent("""
            from torch.distributed import distributed_c10d as c10d
            import torch.distributed as dist
            s = c10d._get_default_store()
            s = s.underlying_store if isinstance(s, dist.PrefixStore) else s
            type(s).__name__
        """), timeout=120)
        assert result.values == {0: "'FileStore'", 1: "'FileStore'"}
        directory = pool._dir.path
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    finally:
        pool.stop()
    assert not directory.exists()


def test_directories_of_a_killed_owner_are_swept_on_the_next_start(tmp_path: Path) -> None:
    # A process makes a private directory and is killed with SIGKILL before removing it.
    code = ("import sys, time; from ddpviz.private_dir import PrivateDir; "
            f"d = PrivateDir({str(tmp_path)!r}); print(d.path, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    orphan = Path(child.stdout.readline().strip())
    (orphan / "rank0.txt").write_text("a stack")
    live = PrivateDir(tmp_path)  # ours: alive, must stay
    mine_too = tmp_path / f"{PREFIX}recycled"  # a dead pid whose number was reused: stale
    mine_too.mkdir()
    (mine_too / OWNER).write_text(f"{os.getpid()} 1\n")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert still_alive([child.pid]) == []
    assert orphan.is_dir()
    fresh = PrivateDir(tmp_path)  # the next start sweeps
    assert not orphan.exists() and not mine_too.exists()
    assert live.path.is_dir() and fresh.path.is_dir()
    assert sweep_stale(tmp_path) == []
    live.remove()
    fresh.remove()


@pytest.mark.dist
def test_a_killed_kernel_leaves_nothing_after_the_next_launch(tmp_path: Path) -> None:
    # A "kernel" launches ranks that hang, then is killed with SIGKILL: its ranks end on their
    # own (their control pipe closes), its directory stays until another launch sweeps it.
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    code = textwrap.dedent(f"""
        import ddpviz
        from tests.launch import rank_fns
        run = ddpviz.launch(rank_fns.sleep_forever, 2, args=({str(tmp_path)!r},))
        print(run._dir.path, flush=True)
        run.wait()
    """)
    kernel = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    assert kernel.stdout is not None
    directory = Path(kernel.stdout.readline().strip())
    from tests.launch.processes import recorded_pids

    pids = recorded_pids(tmp_path, 2)
    os.kill(kernel.pid, signal.SIGKILL)
    kernel.wait()
    assert still_alive(pids, within=10.0) == []
    assert directory.is_dir()
    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        PrivateDir().remove()
    finally:
        tempfile.tempdir = old
    assert not directory.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]


@pytest.mark.dist
def test_a_child_the_kernel_forked_does_not_keep_the_ranks_alive(tmp_path: Path) -> None:
    # Issue 23: a forked child of the kernel inherited the kernel's end of each rank's control
    # pipe (fork copies every descriptor), so after the kernel died the ranks lived on until
    # the child exited (19 s). The child here lives 300 s; the ranks must end within 10 s.
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    code = textwrap.dedent(f"""
        import os, time
        import ddpviz
        from tests.launch import rank_fns
        run = ddpviz.launch(rank_fns.sleep_forever, 2, args=({str(tmp_path)!r},))
        child = os.fork()
        if child == 0:
            time.sleep(300)
            os._exit(0)
        print(child, flush=True)
        run.wait()
    """)
    kernel = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    assert kernel.stdout is not None
    child = int(kernel.stdout.readline().strip())
    from tests.launch.processes import recorded_pids

    try:
        pids = recorded_pids(tmp_path, 2)
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait()
        assert still_alive(pids, within=10.0) == []
        assert still_alive([child], within=0.0) == [child]  # the forked child still runs
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
