"""What every case shares: the training step and age limit the cases run at, the plan of a run, and the
stamp mixes they store. The cases and the repository's pytest-benchmark files import it; it imports no case.
"""

from __future__ import annotations

import dataclasses

import numpy as np

CURRENT_STEP = 1000  # every case trains at this step
MAX_AGE = 10  # stamps below CURRENT_STEP - MAX_AGE are stale
REFERENCE_LIMIT = 1_000_000  # the twin holds ~1 KB of Python objects per entry: skip it above this


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which configurations a run covers and how often it repeats them."""

    capacities: tuple = (100_000, 1_000_000, 10_000_000)
    batches: tuple = (64, 512, 4096)
    stale: tuple = (0.0, 0.5, 0.99)
    repeat: int = 15
    wake_rounds: int = 300
    throughput_seconds: float = 1.0
    memory_capacity: int = 10_000_000
    reference_limit: int = REFERENCE_LIMIT

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            capacities=(100_000, 1_000_000),
            batches=(512,),
            repeat=7,
            wake_rounds=100,
            throughput_seconds=0.4,
            reference_limit=100_000,
        )


def stamps(n: int, stale: float, rng: np.random.Generator, ordered: bool = False) -> np.ndarray:
    """Stamps of n entries of which a fraction ``stale`` is too old at CURRENT_STEP; shuffled unless ``ordered``."""
    n_stale = round(n * stale)
    steps = np.full(n, CURRENT_STEP, np.int64)
    steps[:n_stale] = CURRENT_STEP - MAX_AGE - 1 - (np.arange(n_stale) % 50)
    if ordered:
        steps.sort()
    else:
        rng.shuffle(steps)
    return steps
