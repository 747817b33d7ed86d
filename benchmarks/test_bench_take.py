"""take(B) under drop from a ring with 0%, 50% and 99% stale entries."""

import numpy as np
import pytest
from _contenders import make

from pyfast_buffer.bench.plan import CURRENT_STEP, MAX_AGE, stamps

CAPACITY = 100_000


@pytest.mark.parametrize("stale", [0.0, 0.5, 0.99])
@pytest.mark.parametrize(
    "name", ["pyfast_buffer", "copy (floor)", "reference", "numpy mask", "numba loop", "cpprb to full", "torchrl"]
)
def test_take_512(benchmark, name, stale, rng):
    benchmark.group = f"take B=512 stale={stale:.0%} C={CAPACITY:.0e}"
    c = make(name, CAPACITY, MAX_AGE)
    ids = np.arange(CAPACITY, dtype=np.int64)
    steps = stamps(CAPACITY, stale, rng)

    def refill():
        if len(c) < 0.6 * CAPACITY:
            c.fill(ids, steps)
        return (), {}

    c.fill(ids, steps)
    returned = benchmark.pedantic(lambda: c.take(512, CURRENT_STEP), setup=refill, rounds=30, warmup_rounds=1)
    assert returned == 512  # a full batch of fresh entries
