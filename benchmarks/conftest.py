"""pytest-benchmark cases: ``pytest benchmarks/`` (the bench extra installs the peers).

Each benchmark group holds the baseline and our code doing the same work on the same data; each
test asserts what the call returned, so a benchmark can never pass by doing nothing.
"""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_addoption(parser):
    parser.addoption("--verl-src", default=None, help="a verl checkout, for test_bench_verl.py's verl rows")
