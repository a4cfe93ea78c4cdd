"""`tensor_summary.summarize` (what `dbg.inspect` shows per rank) against a reference computed
apart in numpy, fp64, for the usual all-finite tensors (its fast path: no copy) and the rest
(NaN/Inf, 16-bit, complex, integers, empty, norms beyond fp32's range)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from ddpviz.debugger.tensor_summary import summarize
from ddpviz.events import MAX_CHUNK_DIGESTS


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    nan = torch.randn(7, 50, generator=g)
    nan[1, 3] = float("nan")
    nan[4, 0] = float("inf")
    nan[6, 49] = float("-inf")
    return {
        "fp32": torch.randn(33, 129, generator=g),
        "fp64": torch.randn(1000, generator=g, dtype=torch.float64) * 1e200,
        "fp16": torch.randn(300, generator=g).half(),
        "bf16": torch.randn(300, generator=g).bfloat16(),
        "nonfinite": nan,
        "all nan": torch.full((5,), float("nan")),
        "beyond fp32's norm": torch.full((100,), 3e38),
        "overflowing sum, finite": torch.tensor([3e38, 3e38, -1.0]),
        "complex": torch.randn(40, generator=g, dtype=torch.complex64),
        "int": torch.arange(-50, 77),
        "empty": torch.zeros(0, 3),
        "one": torch.tensor(2.5),
        "non-contiguous": torch.randn(20, 30, generator=g).t(),
    }


@pytest.mark.parametrize("name", list(_tensors()))
def test_summary_matches_a_reference_computed_apart(name: str):
    t = _tensors()[name]
    got = summarize(t)
    a = t.contiguous().reshape(-1)
    ref = a.double().numpy() if not a.is_complex() else a.numpy().astype(np.complex128)
    finite = ref[np.isfinite(ref)]
    mags = np.abs(finite)
    assert got["numel"] == a.numel() and got["shape"] == tuple(t.shape)
    assert got["n_nan"] == int(np.isnan(ref).sum())
    if not a.is_complex():
        assert got["n_posinf"] == int(np.isposinf(ref).sum())
        assert got["n_neginf"] == int(np.isneginf(ref).sum())
    with np.errstate(over="ignore"):  # (fp64 values of 1e200: inf, as torch says too)
        norm = float(np.sqrt((mags.astype(np.float64) ** 2).sum())) if mags.size else 0.0
    if math.isinf(norm):  # (fp64 beyond its range: both say inf)
        assert math.isinf(got["norm"])
    else:
        assert got["norm"] == pytest.approx(norm, rel=1e-6, abs=1e-30)
    assert got["max_abs"] == pytest.approx(float(mags.max()) if mags.size else 0.0, rel=1e-6)
    bad = np.flatnonzero(~np.isfinite(ref)) if not a.is_complex() else np.array([], int)
    assert got["nonfinite_at"] == tuple(
        tuple(int(i) for i in np.unravel_index(j, tuple(t.shape))) for j in bad[:16])
    raw = a.view(torch.uint8).numpy().tobytes() if a.numel() else b""
    assert got["digest"] == hashlib.blake2b(raw, digest_size=16).hexdigest()  # the contract
    if not a.is_complex():
        n, k = ref.size, min(64, ref.size)  # bin i: flat elements [n*i//k, n*(i+1)//k)
        bins = [~np.isfinite(ref[n * i // k:n * (i + 1) // k]) for i in range(k)]
        assert got["finiteness"] == pytest.approx(tuple(float(b.mean()) for b in bins))


def test_chunk_digests_locate_the_one_differing_element():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(10_007, generator=g)
    b = a.clone()
    b[7_000] = b[7_000] + 1
    sa, sb = summarize(a), summarize(b)
    assert sa["chunk_elements"] == math.ceil(a.numel() / MAX_CHUNK_DIGESTS)
    assert len(sa["chunk_digests"]) == math.ceil(a.numel() / sa["chunk_elements"])
    assert sa["digest"] != sb["digest"]
    differ = [i for i, (x, y) in enumerate(zip(sa["chunk_digests"], sb["chunk_digests"],
                                               strict=True)) if x != y]
    assert differ == [7_000 // sa["chunk_elements"]]
    assert summarize(a.clone())["chunk_digests"] == sa["chunk_digests"]
