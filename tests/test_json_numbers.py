"""json_numbers writes each number so that JSON reads back exactly the value Python would
have written (integers, and ns / 1000 as the same float), for any int64 within the limits."""

from __future__ import annotations

import json

import numpy as np

from ddpviz import json_numbers
from ddpviz.limits import MAX_COUNT


def test_integers_times_and_quoted_digits_read_back_exactly() -> None:
    rng = np.random.default_rng(7)
    edge = [0, 1, -1, 9, 10, -10, 999, -999, 1000, -1000, 1001, -1001, 123_456_789_012,
            MAX_COUNT, -MAX_COUNT, (1 << 32) - 1, 1 << 32]
    values = np.concatenate([np.array(edge, dtype=np.int64),
                             rng.integers(-MAX_COUNT, MAX_COUNT, 5000),
                             rng.integers(-10_000, 10_000, 5000)])
    params = np.abs(values) % (1 << 20)
    block, width = json_numbers.records([
        b'{"n":"p', json_numbers.digits_then_quote(params), b',"i":',
        json_numbers.integers(values), b',"ts":', json_numbers.micros(values), b"}"])
    assert len(block) == width * len(values)
    for i, v in enumerate(values.tolist()):
        row = json.loads(block[i * width:(i + 1) * width])
        assert row == {"n": f"p{params[i]}", "i": v, "ts": v / 1000}, (i, v)
