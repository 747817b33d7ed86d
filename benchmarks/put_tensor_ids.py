"""put(512) from a CPU torch tensor of ids against cpprb 2 fields and the reference twin, in one process (issue 50).

    python benchmarks/put_tensor_ids.py [--rounds 9]

The contenders take turns each round over rings of capacity 100,000, full: ours given the ids as a CPU torch
tensor (read through its data pointer, ``Ring.put_tensor``), ours given numpy, cpprb with two fields (idx, step)
given numpy, the reference twin (the deque of records: the plain way) and the copy floor (``numpy.copyto`` of
64 bytes an entry). Each round times a fixed number of calls per contender (the best of 3); printed: medians
and floors of the per-call times, and the median, min and max of the per-round ratios against the torch row.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from typing import Any, Dict, List, Optional

import numpy as np


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    from pyfast_buffer.bench import peers

    capacity = 100_000
    ids, fill = np.arange(512, dtype=np.int64), np.arange(capacity, dtype=np.int64)
    # The reference twin is ~100x slower: fewer calls keep its rounds as long as the others'.
    contenders: Dict[str, Any] = {
        "ours, torch ids": (peers.OursTorch(capacity, 8), 5_000),
        "ours, numpy ids": (peers.Ours(capacity, 8), 5_000),
        "cpprb 2 fields (numpy)": (peers.Cpprb2(capacity, 8), 5_000),
        "reference (deque)": (peers.Reference(capacity, 8), 100),
        "copy floor": (peers.Copy(capacity, 8), 5_000),
    }
    for contender, _ in contenders.values():
        contender.fill(fill, 0)
    per_call: Dict[str, List[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (contender, calls) in contenders.items():

            def put(contender: Any = contender) -> None:
                contender.put(ids, 1)

            per_call[name].append(min(timeit.repeat(put, number=calls, repeat=3)) / calls)
    for name, seconds in per_call.items():
        per = [s * 1e6 for s in seconds]
        print(f"{name:24s} median {statistics.median(per):8.2f} us   floor {min(per):8.2f} us")
    ours = per_call["ours, torch ids"]
    for name in ("cpprb 2 fields (numpy)", "reference (deque)", "ours, numpy ids", "copy floor"):
        ratios = [theirs / mine for theirs, mine in zip(per_call[name], ours)]
        print(
            f"{name} / ours from torch: median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x, "
            f"max {max(ratios):.2f}x"
        )


if __name__ == "__main__":
    main()
