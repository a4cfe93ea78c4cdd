"""Lightning (jobs/lightning_job.py, 2 CPU processes launched by Lightning itself) recorded by
`ddpviz record`: strategy "ddp", "ddp_spawn", "ddp_notebook" (from a script), manual
optimization, DDPStrategy(static_graph=True) and gradient accumulation. (Its stuck and hanging
ranks: test_lightning_hangs.py, a work unit of its own under xdist.)

The unrecorded reference is one run of strategy="ddp_notebook" (the quickest launch): every
case trains the same model on the same data with the same DDP arithmetic, so each recorded
case must end with exactly its parameters (one reference instead of five).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.conftest import Baselines
from tests.frameworks.harness import (
    assert_finished,
    assert_same_parameters,
    assert_traces,
    fresh_port,
    job_env,
    launch,
    plain_python,
    side_by_side,
    tail,
)

pytest.importorskip("lightning", reason="the frameworks extra (pip install -e '.[frameworks]')")

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

SCRIPT = "lightning_job.py"


def env(folder: Path, **extra: str) -> dict[str, str]:
    return job_env(folder, MASTER_PORT=str(fresh_port()), **extra)


@pytest.mark.parametrize(("strategy", "manual"), [
    ("ddp", False), ("ddp_spawn", False), ("ddp_notebook", False), ("ddp", True),
    ("static", False)], ids=["ddp", "ddp_spawn", "ddp_notebook", "manual", "static_graph"])
def test_lightning_strategy_is_recorded_without_changing_the_job(
        python: str, baselines: Baselines, tmp_path: Path, strategy: str, manual: bool) -> None:
    extra = {"FW_STRATEGY": strategy, **({"FW_MANUAL": "1"} if manual else {})}
    recorded = launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True,
                      name=strategy, env=env(tmp_path, **extra))
    assert_finished(recorded)
    plain = baselines.get("lightning", lambda folder: launch(
        python, plain_python(python, SCRIPT), folder, recorded=False, name="lightning",
        env=env(folder, FW_STRATEGY="ddp_notebook")))
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)


def test_lightning_manual_optimization_with_batchnorm_reports_no_replica_divergence(
        python: str, tmp_path: Path) -> None:
    # Under manual optimization Lightning leaves require_forward_param_sync off after each
    # step, so DDP broadcasts the BatchNorm statistics only before the first forward: each
    # rank's buffers are its own from then on, legitimately (not a replicas_diverged error).
    # Every step checked, and the final comparison at the end.
    recorded = launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True,
                      name="manual-bn", env=env(tmp_path, FW_STRATEGY="ddp", FW_MANUAL="1",
                                                FW_BUFFERS="1", DDPVIZ_RECORDING="replicas=1"))
    assert_finished(recorded)
    assert_traces(recorded)
    for rank in range(2):
        found = [f.title for f in recorded.findings(rank) if f.kind == "replicas_diverged"]
        assert found == [], found
    assert "replicas diverged" not in recorded.out, tail(recorded)


def test_lightning_gradient_accumulation_keeps_the_sync_contract(python: str,
                                                               tmp_path: Path) -> None:
    # accumulate_grad_batches=2: the first micro-batch under no_sync(), the second inside the
    # optimizer's closure (judged after it); no unsynced_gradients (assert_traces)
    recorded, plain = side_by_side(
        lambda: launch(python, plain_python(python, SCRIPT), tmp_path, recorded=True,
                       name="accumulate", env=env(tmp_path, FW_STRATEGY="ddp",
                                                  FW_ACCUMULATE="2")),
        lambda: launch(python, plain_python(python, SCRIPT), tmp_path, recorded=False,
                       name="accumulate", env=env(tmp_path, FW_STRATEGY="ddp_notebook",
                                                  FW_ACCUMULATE="2")))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)
