"""Cost of the opt-in reliability features: unique_ids=True and track_released=True, per put+take cycle.

Usage: python benchmarks/reliability_cost.py [--repeat 40]

One process, the same workload on each variant: put B fresh ids (one group each) then take B, so every
id enters and leaves once. Reports the median time per cycle of repeated runs, each variant's ratio to
the plain buffer, and the physical floor: copying the same bytes (B ids in, a B-row batch out).
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List

import numpy as np

import pyfast_buffer as pfb
from pyfast_buffer.bench.timing import calibrate, median, sample

VARIANTS: Dict[str, Dict[str, bool]] = {
    "plain": {},
    "unique_ids": {"unique_ids": True},
    "track_released": {"track_released": True},
    "both": {"unique_ids": True, "track_released": True},
}


def cycle(variant: Dict[str, bool], size: int) -> Callable[[], object]:
    buf = pfb.StalenessBuffer(size, max_age=1_000_000, pin_memory=False, **variant)
    state = {"next": 0}

    def run() -> object:
        ids = np.arange(state["next"], state["next"] + size, dtype=np.int64)
        state["next"] += size
        buf.put(ids, 0)
        batch = buf.take(size, 0)
        if variant.get("track_released"):
            buf.released()
        return batch

    return run


def floor(size: int) -> Callable[[], object]:
    src_in, dst_in = np.arange(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    src_out, dst_out = np.ones(8 * size, dtype=np.int64), np.empty(8 * size, dtype=np.int64)

    def run() -> object:
        np.copyto(dst_in, src_in)
        np.copyto(dst_out, src_out)
        return dst_out

    return run


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40, help="cycles timed one by one per variant")
    args = parser.parse_args(argv)
    print("| B | variant | median us/cycle | ratio to plain |")
    print("| ---: | --- | ---: | ---: |")
    for size in (256, 4096, 65536):
        results = {}
        for name, variant in {**VARIANTS, "floor (copy of the bytes)": None}.items():
            fn = floor(size) if variant is None else cycle(variant, size)
            # The floor is far below timer resolution per call: time it in loops.
            number = calibrate(fn) if variant is None else 1
            results[name] = median(sample(fn, args.repeat, number=number))
        for name, seconds in results.items():
            print(f"| {size} | {name} | {seconds * 1e6:.1f} | {seconds / results['plain']:.2f} |")


if __name__ == "__main__":
    main()
