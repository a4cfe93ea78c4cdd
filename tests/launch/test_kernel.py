"""In a real Jupyter kernel: rank output lands in the cell that launched, even when it arrives
while a later cell runs; %%ddp output lands in its cell; interrupting the kernel stops every
rank; killing the kernel outright takes the %%ddp ranks down with it."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.launch.processes import recorded_pids, still_alive

pytestmark = [pytest.mark.dist, pytest.mark.notebook]

ROOT = Path(__file__).resolve().parents[2]


class Kernel:
    """A python3 kernel and a client that keeps every iopub message, grouped by cell."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(ROOT), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.messages: list[dict[str, Any]] = []

    def execute(self, code: str) -> str:
        return str(self.client.execute(code))

    def reply(self, msg_id: str, timeout: float = 120) -> dict[str, Any]:
        """Wait for the cell's reply and for the kernel to go idle after it."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        self._drain_until_idle(msg_id, deadline)
        content: dict[str, Any] = reply["content"]
        return content

    def _drain_until_idle(self, msg_id: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            self.messages.append(msg)
            if (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                return

    def streams(self, needle: str) -> list[tuple[str, str]]:
        """(cell msg_id, text) of every stream message whose text contains `needle`."""
        return [(m["parent_header"].get("msg_id", ""), m["content"]["text"])
                for m in self.messages if m["msg_type"] == "stream"
                and needle in m["content"]["text"]]

    def close(self) -> None:
        self.client.stop_channels()
        if self.manager.is_alive():
            self.manager.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.close()


def test_late_rank_output_lands_in_the_launching_cell(kernel: Kernel) -> None:
    launching = kernel.execute(
        "import ddpviz, time\n"
        "def chatty():\n"
        "    import time\n"
        "    print('first line', flush=True)\n"
        "    time.sleep(1.0)\n"
        "    print('late line', flush=True)\n"
        "    return 7\n"
        "run = ddpviz.launch(chatty, 2)\n")
    assert kernel.reply(launching)["status"] == "ok"  # returns before the ranks even start
    waiting = kernel.execute("run.wait()")
    assert kernel.reply(waiting)["status"] == "ok"
    late = kernel.streams("late line")
    assert sorted(text for _, text in late) == ["[rank 0] late line\n", "[rank 1] late line\n"]
    assert {cell for cell, _ in late} == {launching}  # not the cell that was running then
    assert {cell for cell, _ in kernel.streams("first line")} == {launching}
    results = [m for m in kernel.messages if m["msg_type"] == "execute_result"
               and m["parent_header"].get("msg_id") == waiting]
    assert results[0]["content"]["data"]["text/plain"] == "[7, 7]"


def test_interrupting_the_kernel_stops_every_rank(kernel: Kernel, tmp_path: Path) -> None:
    cell = kernel.execute(  # self-contained: the tests of this file may run in any order
        "import ddpviz\n"
        "from tests.launch.rank_fns import sleep_forever\n"
        f"run = ddpviz.launch(sleep_forever, 2, args=({str(tmp_path)!r},))\n"
        "run.wait()\n")
    pids = recorded_pids(tmp_path, 2)
    kernel.manager.interrupt_kernel()
    start = time.monotonic()
    reply = kernel.reply(cell)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - start < 5.0
    assert still_alive(pids) == []


def test_ddp_output_lands_in_its_cell_and_dies_with_the_kernel(kernel: Kernel,
                                                              tmp_path: Path) -> None:
    assert kernel.reply(kernel.execute("%load_ext ddpviz"))["status"] == "ok"
    cell = kernel.execute(
        "%%ddp -n 2\n"
        "from tests.launch.rank_fns import start_grandchild\n"
        f"start_grandchild({str(tmp_path)!r})\n"
        "print('hello from the pool')\n")
    assert kernel.reply(cell)["status"] == "ok"
    hello = kernel.streams("hello from the pool")
    assert sorted(t for _, t in hello) == ["[rank 0] hello from the pool\n",
                                           "[rank 1] hello from the pool\n"]
    assert {c for c, _ in hello} == {cell}
    pids = recorded_pids(tmp_path, 2)
    assert still_alive(pids, within=0) == pids
    kernel.manager.shutdown_kernel(now=True)  # SIGKILL: no atexit, no cleanup code runs
    assert still_alive(pids, within=5.0) == []
