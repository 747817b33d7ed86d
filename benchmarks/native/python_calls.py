"""The perf guard's Python workloads: whole public calls (argument checks, the binding, the core), run under
callgrind by benchmarks/perf_guard.py with the instrumentation switched on only around the measured calls.

    python benchmarks/native/python_calls.py --list
    python benchmarks/native/python_calls.py SWITCH_LIBRARY WORKLOAD     # prints {"entries": .., "calls": ..}

The driver of the native core (perf_driver.cpp) counts the core alone; these count what a user's call costs
from Python, where a put from a torch tensor spends most of its instructions.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from typing import Callable, Dict, Tuple

CAPACITY, BATCH, CALLS = 100_000, 512, 2_000


def _put(as_tensor: bool) -> Tuple[Callable[[], None], int]:
    import numpy as np

    import pyfast_buffer as pfb

    buf = pfb.StalenessBuffer(CAPACITY, max_age=8)
    buf.put(np.arange(CAPACITY, dtype=np.int64), 0)  # full: every put overwrites the oldest entries
    ids = np.arange(BATCH, dtype=np.int64)
    if as_tensor:
        import torch

        ids = torch.from_numpy(ids)
    return (lambda: buf.put(ids, 1)), BATCH


WORKLOADS: Dict[str, Callable[[], Tuple[Callable[[], None], int]]] = {
    "py_put512_torch": lambda: _put(True),
    "py_put512_numpy": lambda: _put(False),
}


def main() -> None:
    if sys.argv[1:] == ["--list"]:
        print(" ".join(WORKLOADS))
        return
    library, name = sys.argv[1:3]
    switch = ctypes.CDLL(library)
    call, entries = WORKLOADS[name]()
    for _ in range(100):  # warm: first-call paths (attribute caches, interned names) are not the steady state
        call()
    gc.disable()  # a collection would land in one run's count and not another's
    switch.pfb_callgrind_on()
    for _ in range(CALLS):
        call()
    switch.pfb_callgrind_off()
    print(json.dumps({"entries": entries * CALLS, "calls": CALLS}))


if __name__ == "__main__":
    main()
