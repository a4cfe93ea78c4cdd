"""The few lines of torch's `test/distributed/test_distributed_spawn.py` (not in the wheel):
torch 2.13's `DistributedTest._DistTestBase` run in fresh spawned rank processes, with
`torch.nn.parallel.DistributedDataParallel` replaced by ddpviz's inside every rank when
`DDPVIZ_CONFORMANCE_ENGINE=ddpviz`.

Run by tests/conformance/runner.py, one test per invocation:
    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=... python -m tests.conformance.torch_spawn TEST_NAME
Spawned ranks re-import this module, so the swap below runs in every rank before torch's test
module binds the name `DistributedDataParallel`.
"""

from __future__ import annotations

import os
import sys

import torch

ENGINE = os.environ.get("DDPVIZ_CONFORMANCE_ENGINE", "torch")
COUNT_DIR = os.environ.get("DDPVIZ_CONFORMANCE_COUNT_DIR", "")


def _install_ddpviz() -> type:
    """Puts ddpviz's class where torch's tests look for DDP; counts constructions per process."""
    import ddpviz

    cls = ddpviz.DistributedDataParallel
    if not getattr(cls, "_conformance_counted", False):
        original_init = cls.__init__

        def counted_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if COUNT_DIR:
                with open(os.path.join(COUNT_DIR, f"{os.getpid()}.count"), "a") as f:
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
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *[f"TestDistBackendWithSpawn.{n}" for n in sys.argv[1:]], "-v"]
    run_tests()
