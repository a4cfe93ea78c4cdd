"""tests/gpu: the NCCL path on local GPUs (`make test-gpu`), with as many ranks as GPUs (world
size 1 on a single GPU). Every test here is marked `gpu` and skipped, with the reason, where
torch sees no CUDA device or has no NCCL."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


def gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return (f"needs CUDA GPUs: torch {torch.__version__} sees none "
                f"(torch.version.cuda={torch.version.cuda}); run `make test-gpu` on a GPU "
                "machine with a CUDA build of torch")
    if not dist.is_nccl_available():
        return "needs NCCL: this torch build has no NCCL backend"
    return None


def world_size() -> int:
    """As many ranks as GPUs."""
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_skip_reason()
    for item in items:
        if "tests/gpu/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
