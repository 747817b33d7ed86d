"""evict_stale over N entries: shuffled stamps (one pass, vs memcpy) and a non-decreasing stream."""

import numpy as np
import pytest
from _contenders import make

from pyfast_buffer.bench.plan import CURRENT_STEP, MAX_AGE, stamps


@pytest.mark.parametrize("capacity", [100_000, 1_000_000])
@pytest.mark.parametrize("name", ["pyfast_buffer", "numpy mask", "numba loop", "memcpy"])
def test_evict_shuffled(benchmark, name, capacity, rng):
    benchmark.group = f"evict_stale shuffled C={capacity:.0e}"
    c = make(name, capacity, MAX_AGE)
    ids = np.arange(capacity, dtype=np.int64)
    steps = stamps(capacity, 0.5, rng)

    def refill():
        if name != "memcpy":
            c.fill(ids, steps)
        return (), {}

    removed = benchmark.pedantic(lambda: c.evict(CURRENT_STEP), setup=refill, rounds=10, warmup_rounds=1)
    if name != "memcpy":
        assert removed == capacity // 2 and len(c) == capacity - capacity // 2


@pytest.mark.parametrize("name", ["pyfast_buffer", "numpy mask"])
def test_evict_non_decreasing_stream(benchmark, name):
    capacity, steps_in_ring = 1_000_000, 64
    benchmark.group = f"evict_stale non-decreasing stream C={capacity:.0e}"
    c = make(name, capacity, steps_in_ring - 1)
    c.fill(np.arange(capacity, dtype=np.int64), np.arange(capacity, dtype=np.int64) * steps_in_ring // capacity)
    clock = iter(range(steps_in_ring, 2 * steps_in_ring))
    removed = benchmark.pedantic(lambda: c.evict(next(clock)), rounds=40, warmup_rounds=1)
    assert removed == capacity // steps_in_ring  # one step's worth of entries aged out
