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
    torchrun,
)

pytestmark = [pytest.mark.dist, pytest.mark.frameworks]

PENDING = "lead's fix pending (issue 22)"
MODES = ["ddp_optimizer", "python_reducer", "no_optimization"]


def case(mode: str, optimize: str = "", xfail: str = "") -> pytest.param:  # type: ignore[valid-type]
    marks = [pytest.mark.xfail(strict=True, reason=f"{xfail}: {PENDING}")] if xfail else []
    return pytest.param(mode, optimize, marks=marks,
                        id=f"{mode}-{optimize}" if optimize else mode)


CASES = [
    case("py_hook"),
    case("builtin_hook", xfail="a built-in (C++) comm hook leaves the DDP unwatched"),
    case("replicate", xfail="replicate() calls its DDP's _pre_forward/_post_forward, never "
                            "DDP.__call__, so the DDP is never attached: empty traces"),
    case("compile_inner", "ddp_optimizer"),
    case("compile_inner", "python_reducer"),
    case("compile_inner", "no_optimization"),
    *(case("compile_outer", m, xfail="torch.compile(DDP(m)) crashes under record: dynamo traces "
                        "autowatch's DDP.__call__ into watch()")
      for m in MODES),
]


@pytest.mark.parametrize(("mode", "optimize"), CASES)
def test_torch_ddp_form_is_recorded_without_changing_the_job(
        python: str, baselines: Baselines, tmp_path: Path, mode: str, optimize: str) -> None:
    extra = {"FW_MODE": mode, **({"FW_OPTIMIZE_DDP": optimize} if optimize else {})}
    name = f"{mode}-{optimize}" if optimize else mode
    recorded = launch(python, torchrun(python, "torch_job.py"), tmp_path, recorded=True,
                      name=name, env=job_env(tmp_path, **extra))
    assert_finished(recorded)
    reference = "py_hook" if mode.endswith("hook") else "plain"
    plain = baselines.get(f"torch-{reference}", lambda folder: launch(
        python, torchrun(python, "torch_job.py"), folder, recorded=False, name=reference,
        env=job_env(folder, FW_MODE=reference)))
    assert_same_parameters(recorded, plain)
    assert_traces(recorded)
