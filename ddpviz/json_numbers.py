"""JSON text for a column of numbers at once (numpy), for exports of millions of records.

Every record of a block gets the same width: numbers are padded with spaces, which JSON allows
around any value, so a block of records is one (rows x width) byte matrix built with a few
vectorised operations per field instead of a format call per record. Integers only (and
times in ns written as microseconds with three decimals, exact): strings are never written here
(names with numbers in them are `digits_then_quote`, the closing quote right after the digits).
"""

from __future__ import annotations

import numpy as np

_SPACE, _QUOTE, _MINUS, _DOT, _ZERO = 32, 34, 45, 46, 48


def _ndigits(a: np.ndarray) -> np.ndarray:
    """Decimal digits of each value of a non-negative int64 array (0 has 1)."""
    nd = np.ones(len(a), dtype=np.int64)
    top = int(a.max()) if len(a) else 0
    p = 10
    while p <= top:
        nd += a >= p
        p *= 10
    return nd


def _narrow(a: np.ndarray) -> np.ndarray:
    """`a` (non-negative) as uint32 when it fits: its divisions are several times faster."""
    if len(a) and int(a.max()) < (1 << 32):
        return a.astype(np.uint32)
    return a.copy()


def integers(v: np.ndarray) -> np.ndarray:
    """(n, width) ASCII: each integer right-aligned after spaces."""
    v = v.astype(np.int64, copy=False)
    neg = v < 0
    a = np.abs(v)
    nd = _ndigits(a)
    width = int((nd + neg).max()) if len(v) else 1
    out = np.empty((len(v), width), dtype=np.uint8)
    x = _narrow(a)
    for k in range(width - 1, -1, -1):
        out[:, k] = x % 10 + _ZERO
        x = x // 10
    lead = width - nd  # leading zeros to blank
    blank = np.arange(width)[None, :] < lead[:, None]
    out[blank] = _SPACE
    if neg.any():
        rows = np.flatnonzero(neg)
        out[rows, lead[rows] - 1] = _MINUS
    return out


def digits_then_quote(v: np.ndarray) -> np.ndarray:
    """(n, width) ASCII: each non-negative integer, a closing quote, then spaces (the end of a
    string such as "grad p12")."""
    a = v.astype(np.int64, copy=False)
    nd = _ndigits(a)
    width = int(nd.max()) + 1 if len(a) else 2
    out = np.full((len(a), width), _SPACE, dtype=np.uint8)
    for k in np.unique(nd).tolist():
        rows = np.flatnonzero(nd == k)
        x = _narrow(a[rows])
        for col in range(k - 1, -1, -1):
            out[rows, col] = x % 10 + _ZERO
            x = x // 10
        out[rows, k] = _QUOTE
    return out


def micros(ns: np.ndarray) -> np.ndarray:
    """(n, width) ASCII: ns / 1000 with three decimals, which JSON reads as the same float
    as Python's ns / 1000 (both are the double nearest the exact quotient)."""
    ns = ns.astype(np.int64, copy=False)
    a = np.abs(ns)
    whole = integers(np.where(ns < 0, -(a // 1000), a // 1000))
    neg_zero = (ns < 0) & (a < 1000)  # -0.5: the sign is not in the whole part "0"
    if neg_zero.any():
        whole = np.concatenate([np.full((len(a), 1), _SPACE, np.uint8), whole], axis=1)
        whole[np.flatnonzero(neg_zero), -2] = _MINUS
    frac = a % 1000
    tail = np.empty((len(a), 4), dtype=np.uint8)
    tail[:, 0] = _DOT
    tail[:, 1] = frac // 100 + _ZERO
    tail[:, 2] = frac // 10 % 10 + _ZERO
    tail[:, 3] = frac % 10 + _ZERO
    return np.concatenate([whole, tail], axis=1)


def records(parts: list[bytes | np.ndarray]) -> tuple[bytes, int]:
    """Rows of records from constant byte strings and (n, w) column blocks: the bytes of all
    rows back to back, and the width of one row."""
    n = next(len(p) for p in parts if isinstance(p, np.ndarray))
    widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in parts]
    out = np.empty((n, sum(widths)), dtype=np.uint8)
    col = 0
    for p, w in zip(parts, widths, strict=True):
        out[:, col:col + w] = np.frombuffer(p, np.uint8) if isinstance(p, bytes) else p
        col += w
    return out.tobytes(), out.shape[1]
