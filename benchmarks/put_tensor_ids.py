"""put(512) from a CPU torch tensor of ids against cpprb 2 fields, in one process (issue 50, item 5).

    python benchmarks/put_tensor_ids.py [--rounds 9]

Three contenders take turns each round over the same rings (capacity 100,000, full): ours with the put fast
path for tensors (``_args.cpu_ids_view``), ours with that path switched off (what ``as_ids`` costs: the code
before it), and cpprb with two fields (idx, step) given numpy. Each round times 5,000 calls (the best of 3);
printed: medians and floors of the times, and the median, min and max of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from typing import Dict, List, Optional

import numpy as np


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    import pyfast_buffer.buffer as buffer_module
    from pyfast_buffer.bench import peers

    capacity, calls = 100_000, 5_000
    ids, fill = np.arange(512, dtype=np.int64), np.arange(capacity, dtype=np.int64)
    fast, general, cpprb = peers.OursTorch(capacity, 8), peers.OursTorch(capacity, 8), peers.Cpprb2(capacity, 8)
    for contender in (fast, general, cpprb):
        contender.fill(fill, 0)
    view = buffer_module.cpu_ids_view

    def general_loop() -> None:
        buffer_module.cpu_ids_view = lambda value: None  # the general conversion only, as before the fast path
        try:
            for _ in range(calls):
                general.put(ids, 1)
        finally:
            buffer_module.cpu_ids_view = view

    times: Dict[str, List[float]] = {"ours, tensor fast path": [], "ours, as_ids (before)": [], "cpprb 2 fields": []}
    for _ in range(args.rounds):
        times["ours, tensor fast path"].append(min(timeit.repeat(lambda: fast.put(ids, 1), number=calls, repeat=3)))
        times["ours, as_ids (before)"].append(min(timeit.repeat(general_loop, number=1, repeat=3)))
        times["cpprb 2 fields"].append(min(timeit.repeat(lambda: cpprb.put(ids, 1), number=calls, repeat=3)))
    for name, seconds in times.items():
        per = [s / calls * 1e6 for s in seconds]
        print(f"{name:24s} median {statistics.median(per):6.2f} us   floor {min(per):6.2f} us")
    for name in ("ours, tensor fast path", "ours, as_ids (before)"):
        ratios = [c / o for c, o in zip(times["cpprb 2 fields"], times[name])]
        print(
            f"cpprb 2 fields / {name}: median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x, "
            f"max {max(ratios):.2f}x"
        )


if __name__ == "__main__":
    main()
