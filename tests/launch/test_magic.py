"""The %%ddp magic in a real IPython shell: per-rank output, state kept across cells, per-rank
errors, a crashed or timed-out pool replaced on the next cell, %ddp_stop leaving no process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpviz.launcher import LaunchTimeout, RankError
from tests.launch.magic_shell import magic_shell, pool, run
from tests.launch.processes import recorded_pids, still_alive

pytestmark = pytest.mark.dist

shell = pytest.fixture(scope="module")(magic_shell)


def test_cells_keep_state_per_rank_and_report_errors_per_rank(
        shell: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    error, out = run(shell, capsys, f"""%%ddp -n 2 --backend gloo
import torch, torch.distributed as dist
from tests.launch.rank_fns import start_grandchild
start_grandchild({str(tmp_path)!r})
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print("sum", t.item())
world_size * 10 + rank
""")
    assert error is None
    pids = recorded_pids(tmp_path, 2)
    assert pool(shell).pids == pids[0::2]
    assert out[0] == f"ddpviz: started 2 ranks (gloo), pids {pids[0::2]}"
    assert sorted(out[1:3]) == ["[rank 0] sum 3.0", "[rank 1] sum 3.0"]
    assert out[3:] == ["[rank 0] Out: 20", "[rank 1] Out: 21"]  # the last expression, per rank

    error, out = run(shell, capsys, "%%ddp\nt += rank\nprint('t is', t.item())\n")
    assert error is None
    assert sorted(out) == ["[rank 0] t is 3.0", "[rank 1] t is 4.0"]  # state persisted

    error, out = run(shell, capsys, "%%ddp\nfrom tests.launch.rank_fns import emit\nemit(3)\n")
    assert error is None
    session = shell.run_line_magic("ddp_session", "")
    assert session is pool(shell).session
    # the events a cell emitted are all in the session when the cell returns
    assert [[e.step for e in session.trace.events(r)] for r in (0, 1)] == [[0, 1, 2]] * 2

    error, out = run(shell, capsys, """%%ddp
if rank == 1:
    raise KeyError("planted on rank 1")
print("rank", rank, "carried on")
""")
    assert isinstance(error, RankError)
    assert error.rank == 1 and [f.rank for f in error.failures] == [1]
    assert "[rank 0] rank 0 carried on" in out  # the other rank's output is kept
    assert "[rank 1]     raise KeyError(\"planted on rank 1\")" in out  # source line shown
    assert "RankError: ddpviz: rank 1 raised KeyError: 'planted on rank 1' (world_size=2)" in out
    assert pool(shell).pids == pids[0::2]  # an exception does not cost the ranks

    error, out = run(shell, capsys, "%%ddp\nprint('t still', t.item())\n")
    assert error is None
    assert sorted(out) == ["[rank 0] t still 3.0", "[rank 1] t still 4.0"]

    shell.run_line_magic("ddp_stop", "")
    assert capsys.readouterr().out == "ddpviz: stopped 2 ranks.\n"
    assert pool(shell) is None
    assert still_alive(pids) == []


def test_a_crashed_or_timed_out_pool_is_replaced_on_the_next_cell(
        shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    error, out = run(shell, capsys,
                     "%%ddp -n 2\nimport os\nx = 1\nif rank == 0:\n    os._exit(5)\n")
    first = pool(shell).pids
    assert isinstance(error, RankError)
    assert str(error).startswith("ddpviz: rank 0 exited with code 5 during the cell")
    assert "the next %%ddp cell starts fresh ranks" in str(error)
    assert not pool(shell).alive
    assert still_alive(first) == []

    error, out = run(shell, capsys,
                     "%%ddp --timeout 3\nimport time\nif rank == 1:\n    time.sleep(600)\n")
    assert out[0].startswith("ddpviz: started 2 ranks (gloo)")  # a fresh pool, same size
    second = pool(shell).pids
    assert isinstance(error, LaunchTimeout)
    assert error.ranks == [1]
    assert error.stacks[1][-1].startswith("[rank 1]   <ddp-cell-")  # stopped in the cell
    assert error.stacks[1][-1].endswith(": time.sleep(600)")
    assert still_alive(second) == []

    error, out = run(shell, capsys, "%%ddp\nprint('x' in globals())\n")
    assert error is None
    assert sorted(out[1:]) == ["[rank 0] False", "[rank 1] False"]  # fresh namespaces
