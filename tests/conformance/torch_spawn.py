"""The few lines of torch's `test/distributed/test_distributed_spawn.py` (not in the wheel):
torch 2.13's `DistributedTest._DistTestBase` run in fresh spawned rank processes, with
`torch.nn.parallel.DistributedDataParallel` replaced by ddpviz's inside every rank when
`DDPVIZ_CONFORMANCE_ENGINE=ddpviz`.

Run by tests/conformance/runner.py, several tests per invocation (as torch runs its suite),
each in its own freshly spawned ranks:
    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=... python -m tests.conformance.torch_spawn TEST_NAME...
Spawned ranks re-import this module, so the swap below runs in every rank before torch's test
module binds the name `DistributedDataParallel`. With DDPVIZ_CONFORMANCE_RESULTS set, each
test's outcome is appended there as a JSON line when it ends (the runner reads them, not the
ranks' interleaved output).
"""

from __future__ import annotations

import json
import os
import sys
import time
import unittest
from typing import Any

import torch

ENGINE = os.environ.get("DDPVIZ_CONFORMANCE_ENGINE", "torch")
COUNT_DIR = os.environ.get("DDPVIZ_CONFORMANCE_COUNT_DIR", "")
RESULTS = os.environ.get("DDPVIZ_CONFORMANCE_RESULTS", "")
# the tests that run ddpviz with torch's error timing (runner.TORCH_TIMING), comma-separated
TORCH_TIMING = set(filter(None, os.environ.get("DDPVIZ_CONFORMANCE_TORCH_TIMING", "").split(",")))
TEST_ENV = "DDPVIZ_CONFORMANCE_TEST"  # the running test: set in the parent, read in its ranks


def _install_ddpviz() -> type:
    """Puts ddpviz's class where torch's tests look for DDP; counts constructions per process."""
    import ddpviz

    cls = ddpviz.DistributedDataParallel
    if not getattr(cls, "_conformance_counted", False):
        original_init = cls.__init__

        def counted_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if COUNT_DIR:
                test = os.environ.get(TEST_ENV, "")
                with open(os.path.join(COUNT_DIR, f"{test}.{os.getpid()}.count"), "a") as f:
                    f.write("1\n")
            original_init(self, *args, **kwargs)

        cls.__init__ = counted_init
        cls._conformance_counted = True
    torch.nn.parallel.DistributedDataParallel = cls
    return cls


if ENGINE == "ddpviz":
    _DDP = _install_ddpviz()
elif ENGINE != "torch":
    raise SystemExit(f"DDPVIZ_CONFORMANCE_ENGINE must be torch or ddpviz, found {ENGINE!r}")

if os.environ.get("DDPVIZ_CONFORMANCE_CPU_SHIM") == "1":  # see cpu_shim.py; before torch's tests
    from tests.conformance import cpu_shim  # read torch.cuda.is_available()

    cpu_shim.install(count=8, ddp_classes=[torch.nn.parallel.distributed.DistributedDataParallel,
                                           torch.nn.parallel.DistributedDataParallel])

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if ENGINE == "ddpviz":
    distributed_test.DistributedDataParallel = _DDP  # bound by name at torch's import


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's own class body from test_distributed_spawn.py (gloo branch)."""

    def setUp(self) -> None:
        super().setUp()
        # the spawned ranks inherit this process's environment as it is at their start
        os.environ[TEST_ENV] = self._testMethodName
        if self._testMethodName in TORCH_TIMING:
            os.environ["DDPVIZ_UNUSED_ERROR_AT"] = "forward"
        else:
            os.environ.pop("DDPVIZ_UNUSED_ERROR_AT", None)
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def run(self, result: Any = None) -> Any:
        if not RESULTS or not isinstance(result, unittest.TestResult):
            return super().run(result)
        seen = {k: len(getattr(result, k)) for k in ("failures", "errors", "skipped")}
        start = time.monotonic()
        try:
            return super().run(result)
        finally:
            new = {k: getattr(result, k)[seen[k]:] for k in seen}
            if new["failures"] or new["errors"]:
                status, detail = "failed", (new["failures"] + new["errors"])[0][1]
            elif new["skipped"]:
                status, detail = "skipped", str(new["skipped"][0][1])
            else:
                status, detail = "passed", ""
            with open(RESULTS, "a") as f:
                f.write(json.dumps({"test": self._testMethodName, "status": status,
                                    "seconds": round(time.monotonic() - start, 1),
                                    "detail": detail}) + "\n")


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *[f"TestDistBackendWithSpawn.{n}" for n in sys.argv[1:]], "-v"]
    run_tests()
