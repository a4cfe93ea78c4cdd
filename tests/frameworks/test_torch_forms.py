"""torch's DDP in the forms frameworks and users build it (jobs/torch_job.py, torchrun):
comm hooks (Python and C++), the composable replicate(), and torch.compile outside and inside
DDP under each torch._dynamo.config.optimize_ddp mode, recorded by `ddpviz record`.

Each case: the job finishes, its final parameters are bitwise those of the job run unrecorded,
and every rank left a trace with the parameter names and the bucket map. Two unrecorded
references serve all cases: plain DDP (the same arithmetic as replicate() and, with the
aot_eager backend, every torch.compile form: their unrecorded runs end bitwise equal) and DDP
with fp16_compress_hook (the same arithmetic as the built-in FP16_COMPRESS hook).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.conftest import Baselines
from tests.frameworks.harness import (
    assert_finished,
    assert_same_parameters,
    assert_traces,
    job_env,
    launch,
    tail,
    torchrun,
)

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

OBSERVED = ["ddp_optimizer", "no_optimization"]


def case(mode: str, optimize: str = "") -> pytest.param:  # type: ignore[valid-type]
    return pytest.param(mode, optimize, id=f"{mode}-{optimize}" if optimize else mode)


CASES = [
    case("py_hook"),
    case("builtin_hook"),  # registered with torch at the default (hook-less) level
    case("replicate"),  # never calls the DDP's forward: watched through _pre_forward
    *(case(form, m) for form in ("compile_inner", "compile_outer") for m in OBSERVED),
]


@pytest.mark.parametrize(("mode", "optimize"), CASES)
def test_torch_ddp_form_is_recorded_without_changing_the_job(
        python: str, baselines: Baselines, tmp_path: Path, mode: str, optimize: str) -> None:
    extra = {"FW_MODE": mode, **({"FW_OPTIMIZE_DDP": optimize} if optimize else {})}
    name = f"{mode}-{optimize}" if optimize else mode
    reference = "py_hook" if mode.endswith("hook") else "plain"
    recorded, plain = baselines.beside(
        f"torch-{reference}", lambda folder: launch(
            python, torchrun(python, "torch_job.py"), folder, recorded=False, name=reference,
            env=job_env(folder, FW_MODE=reference)),
        lambda: launch(python, torchrun(python, "torch_job.py"), tmp_path, recorded=True,
                       name=name, env=job_env(tmp_path, **extra)))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)


@pytest.mark.parametrize("form", ["compile_inner", "compile_outer"])
def test_a_python_reducer_ddp_is_left_alone_and_said_so_once(
        python: str, baselines: Baselines, tmp_path: Path, form: str) -> None:
    # optimize_ddp="python_reducer" all-reduces each gradient from DDP's own hook, never
    # through the C++ reducer's buckets that ddpviz watches: ddpviz steps aside
    env = job_env(tmp_path, FW_MODE=form, FW_OPTIMIZE_DDP="python_reducer")
    recorded, plain = baselines.beside(
        "torch-plain", lambda folder: launch(
            python, torchrun(python, "torch_job.py"), folder, recorded=False, name="plain",
            env=job_env(folder, FW_MODE="plain")),
        lambda: launch(python, torchrun(python, "torch_job.py"), tmp_path, recorded=True,
                       name=f"{form}-python_reducer", env=env))
    assert_finished(recorded)
    assert_same_parameters(recorded, plain)
    notes = [line for line in recorded.out.splitlines()
             if "this DistributedDataParallel is not watched" in line]
    assert len(notes) == 1 and "optimize_ddp = 'python_reducer'" in notes[0], tail(recorded)
