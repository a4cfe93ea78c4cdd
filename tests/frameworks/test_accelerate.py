"""accelerate (jobs/accelerate_job.py) under `accelerate launch` on CPU, every option on the
command line (no config file), recorded by `ddpviz record`; and a parameter whose shape differs
on rank 1."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddpviz
from tests.frameworks.harness import (
    accelerate_launch,
    assert_finished,
    assert_same_parameters,
    assert_traces,
    job_env,
    launch,
    side_by_side,
    tail,
)

pytest.importorskip("accelerate", reason="the frameworks extra (pip install -e '.[frameworks]')")

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

SCRIPT = "accelerate_job.py"


def test_accelerate_is_recorded_without_changing_the_job(python: str, tmp_path: Path) -> None:
    recorded, plain = side_by_side(
        lambda: launch(python, accelerate_launch(python, SCRIPT), tmp_path, recorded=True,
                       name="accelerate", env=job_env(tmp_path)),
        lambda: launch(python, accelerate_launch(python, SCRIPT), tmp_path, recorded=False,
                       name="accelerate", env=job_env(tmp_path)))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)


def test_a_shape_mismatch_on_rank_1_is_named(python: str, tmp_path: Path) -> None:
    recorded = launch(python, accelerate_launch(python, SCRIPT), tmp_path, recorded=True,
                      name="accelerate-mismatch", env=job_env(tmp_path, FW_MISMATCH="1"))
    assert recorded.code != 0  # the job cannot run, with or without ddpviz
    # every rank raised ddpviz's error before torch's constructor ran its own check
    assert "appears not to match" not in recorded.out, tail(recorded)
    found = [f for f in ddpviz.diagnose(recorded.trace(0)) if f.kind == "param_mismatch"]
    assert found, tail(recorded)
    assert found[0].name == "encoder.2.weight" and found[0].field == "shape"
    assert 1 in found[0].ranks
    assert "encoder.2.weight" in recorded.out, tail(recorded)
