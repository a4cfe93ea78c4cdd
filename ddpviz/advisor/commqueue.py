"""The in-order all-reduce queue DDP's buckets go through, as arithmetic.

DDP launches bucket all-reduces strictly in bucket order (bucket b only after b-1), and one
process group runs them one after another: bucket b starts once every rank has launched it and
bucket b-1 has finished, and takes its cost. Where AllReduceDone is seen only as finalize waits
for each bucket in order after the backward (ddpviz's DDP), the done time seen is the later of
the finish and finalize reaching it. Every function here works on numpy arrays so the cost
model's fit can try many costs at once (a trailing axis G).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def finish_times(launch_s: Array, cost_s: Array) -> Array:
    """When each bucket's all-reduce finishes.

    Args:
        launch_s: (B, R) seconds: when rank r launched bucket b (in launch order).
        cost_s: (B,) or (B, G) seconds each all-reduce takes once started.

    Returns:
        (B,) or (B, G) finish times.
    """
    start_ready = launch_s.max(axis=1)  # a collective starts once its last rank joins
    out = np.empty_like(cost_s, dtype=np.float64)
    prev: Array | float = -np.inf
    for b in range(cost_s.shape[0]):
        s = np.maximum(start_ready[b], prev)
        out[b] = s + cost_s[b]
        prev = out[b]
    return out


def seen_done(finish_s: Array, gate_s: Array, finalize_s: float, at_finalize: bool) -> Array:
    """When each rank sees each bucket done.

    Args:
        finish_s: (B,) or (B, G) finish times.
        gate_s: (R,) when each rank's finalize starts (its last gradient ready).
        finalize_s: time finalize spends on one bucket once it is done.
        at_finalize: True where done is seen only by finalize, in order (ddpviz's DDP).

    Returns:
        (B, R) or (B, R, G).
    """
    if finish_s.ndim == 1:
        f = finish_s[:, None]
        g = gate_s
    else:
        f = finish_s[:, None, :]
        g = gate_s[:, None]
    if not at_finalize:
        return np.broadcast_to(f, (f.shape[0], gate_s.shape[0], *f.shape[2:])).copy()
    out = np.empty((f.shape[0], gate_s.shape[0], *f.shape[2:]), dtype=np.float64)
    prev = g - finalize_s
    for b in range(f.shape[0]):
        out[b] = np.maximum(f[b], prev + finalize_s)
        prev = out[b]
    return out
