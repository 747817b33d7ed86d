"""Contender construction shared by the benchmark modules."""

import pytest

from pyfast_buffer.bench import peers


def make(name: str, capacity: int, max_age: int):
    """Returns a contender instance, or skips the test with the reason it is unavailable."""
    found, skipped = peers.available([name])
    if skipped:
        pytest.skip(skipped[name])
    return found[0](capacity, max_age)
