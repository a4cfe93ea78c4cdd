"""Bucket size limits: which byte caps torch 2.13 uses for the initial map and for the rebuild.

The rules (see ddp-facts.md, "Bucket size limits"):
- bucket_cap_mb=None (default) and find_unused off, or static_graph: one bucket per
  dtype/device at first ([sys.maxsize]); rebuilt in gradient-ready order with [1 MiB, 25 MiB].
- find_unused on (not static): [first, cap] in registration order, never rebuilt.
- an explicit bucket_cap_mb=X makes the first cap X too (no 1 MiB bucket).
- bucket_cap_mb_list: these limits for both the initial and the rebuilt map; cap = max.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
MB = 1024 * 1024


class Limits(NamedTuple):
    """The limits for each of the two assignments DDP makes."""

    initial: list[int]  # passed to the constructor's assignment (registration order)
    rebuild: list[int] | None  # used by the rebuild (gradient-ready order); None: no rebuild
    set_last_bucket_cap: bool  # DDP_SET_LAST_BUCKET_CAP=1: the small bucket goes last


@dataclass(frozen=True)
class BucketCapacity:
    """torch 2.13's `_BucketCapacityConfig`: byte caps derived from the user's settings."""

    bucket_bytes_cap: int
    per_bucket_bytes_caps: tuple[int, ...]
    first_bucket_bytes_cap: int

    @staticmethod
    def create(bucket_cap_mb: float | None = None,
               bucket_cap_mb_list: list[float] | None = None) -> BucketCapacity:
        if bucket_cap_mb is not None and bucket_cap_mb < 0:
            raise ValueError(f"ddpviz: bucket_cap_mb must be >= 0, got {bucket_cap_mb}.")
        if bucket_cap_mb_list is not None and any(c < 0 for c in bucket_cap_mb_list):
            raise ValueError(f"ddpviz: bucket_cap_mb_list entries must be >= 0, got "
                             f"{list(bucket_cap_mb_list)}.")
        default = bucket_cap_mb is None
        cap_mb: float = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        per_bucket: tuple[int, ...] = ()
        if bucket_cap_mb_list:
            per_bucket = tuple(int(c * MB) for c in bucket_cap_mb_list)
            cap_mb = max(bucket_cap_mb_list)
            default = False
        cap = int(cap_mb * MB)
        return BucketCapacity(cap, per_bucket, DEFAULT_FIRST_BUCKET_BYTES if default else cap)

    def limits(self, *, find_unused_parameters: bool, static_graph: bool,
               env: Mapping[str, str] | None = None) -> Limits:
        """The initial and rebuild limits for these settings."""
        source = os.environ if env is None else env
        rebuilds = static_graph or not find_unused_parameters
        set_last = source.get("DDP_SET_LAST_BUCKET_CAP", "N/A") == "1"
        if self.per_bucket_bytes_caps:
            caps = list(self.per_bucket_bytes_caps)
            return Limits(caps, caps if rebuilds else None, set_last)
        if rebuilds:
            initial = [sys.maxsize]
        elif self.first_bucket_bytes_cap < self.bucket_bytes_cap:
            initial = [self.first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            initial = [self.bucket_bytes_cap]
        rebuild = [self.first_bucket_bytes_cap, self.bucket_bytes_cap] if rebuilds else None
        return Limits(initial, rebuild, set_last)
