"""Hugging Face `Trainer` (jobs/hf_trainer.py: GPT-2 from a tiny config, synthetic tokens)
under torchrun, recorded by `ddpviz record`, with and without gradient accumulation; and a
planted unused parameter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.harness import (
    assert_finished,
    assert_same_parameters,
    assert_traces,
    job_env,
    launch,
    side_by_side,
    tail,
    torchrun,
)

pytest.importorskip("transformers", reason="the frameworks extra (pip install -e '.[frameworks]')")
pytest.importorskip("accelerate", reason="the frameworks extra (pip install -e '.[frameworks]')")

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

SCRIPT = "hf_trainer.py"


def test_trainer_is_recorded_without_changing_the_job(python: str, tmp_path: Path) -> None:
    recorded, plain = side_by_side(
        lambda: launch(python, torchrun(python, SCRIPT), tmp_path, recorded=True, name="hf",
                       env=job_env(tmp_path)),
        lambda: launch(python, torchrun(python, SCRIPT), tmp_path, recorded=False, name="hf",
                       env=job_env(tmp_path)))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)
    names = recorded.reports[0]["ddp_names"]
    assert "transformer.h.1.attn.c_attn.weight" in names  # GPT-2's own dotted names


def test_gradient_accumulation_keeps_the_sync_contract(python: str, tmp_path: Path) -> None:
    # accelerate's accumulate(): no_sync() on the first micro-batch, the second all-reduces
    # both; no unsynced_gradients (assert_traces), bitwise as unrecorded
    env = job_env(tmp_path, FW_ACCUMULATE="2")
    recorded, plain = side_by_side(
        lambda: launch(python, torchrun(python, SCRIPT), tmp_path, recorded=True,
                       name="hf-accumulate", env=env),
        lambda: launch(python, torchrun(python, SCRIPT), tmp_path, recorded=False,
                       name="hf-accumulate", env=env))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)


def test_an_unused_parameter_is_named(python: str, tmp_path: Path) -> None:
    recorded = launch(python, torchrun(python, SCRIPT), tmp_path, recorded=True,
                      name="hf-unused", env=job_env(tmp_path, FW_UNUSED="1"))
    # torch's DDP (find_unused_parameters=False) cannot go on; ddpviz stops it at the next
    # forward with the parameters' names instead of torch's "Expected to have finished
    # reduction in the prior iteration" error.
    assert recorded.code != 0
    assert "'unused_proj.weight', 'unused_proj.bias'" in recorded.out, tail(recorded)
    assert "ddpviz.errors.UnusedParametersError: ddpviz:" in recorded.out, tail(recorded)
    for rank in (0, 1):
        found = [f for f in recorded.findings(rank) if f.kind == "unused_parameter"]
        assert found, tail(recorded)
        assert found[0].name == "unused_proj.weight" and found[0].step == 0
        assert found[0].ranks == (rank,)
