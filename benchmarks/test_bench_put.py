"""put(B ids, one stamp) into a full ring, side by side with the baseline and peers."""

import numpy as np
import pytest
from _contenders import make

CAPACITY = 100_000


@pytest.mark.parametrize("batch", [64, 512, 4096])
@pytest.mark.parametrize(
    "name", ["pyfast_buffer", "copy (floor)", "reference", "numpy mask", "cpprb", "cpprb 2 fields", "torchrl"]
)
def test_put(benchmark, name, batch):
    benchmark.group = f"put B={batch} C={CAPACITY:.0e}"
    c = make(name, CAPACITY, 10)
    c.fill(np.arange(CAPACITY, dtype=np.int64), 0)
    ids = np.arange(batch, dtype=np.int64)
    benchmark(c.put, ids, 1)
    assert len(c) == CAPACITY  # full ring: every put replaced the oldest entries
