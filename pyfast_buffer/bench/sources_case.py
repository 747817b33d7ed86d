"""The per-source take: take(B) under drop from a ring tagged round-robin with four sources, each its own max_age.

Contenders, timed interleaved in this process on the same stamps: ours with the four bounds (the tagged walk
over the stale-before column), ours untagged with the one max_age that drops the same share (the plain walk
over as many entries), a
numpy ring applying the four bounds in one vectorised mask pass, and the floor (a copy of 64 bytes per entry
taken). registry.py names the case ``take_sources``.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from ..buffer import StalenessBuffer
from . import peers
from .plan import CURRENT_STEP, MAX_AGE, Plan
from .timing import Timed, calibrate, median, percentile, sample_interleaved

#: source -> max_age: source 2 loses most of its entries, source 3 none (ages are uniform in 0..AGES - 1).
SOURCE_BOUNDS = {0: 10, 1: 20, 2: 5, 3: 40}
AGES = 30


def untagged_max_age() -> int:
    """The one max_age that drops the same share of uniform ages as the four bounds do together (16 of 30 kept
    vs 52 of 120 dropped): the untagged walk then skips as many entries as the tagged one."""
    dropped = sum(max(0, AGES - 1 - bound) for bound in SOURCE_BOUNDS.values()) / len(SOURCE_BOUNDS)
    return AGES - 1 - round(dropped)


class NumpySources(peers.NumpyRing):
    """numpy columns plus a source column; take gathers each entry's own cutoff and masks in one pass."""

    name = "numpy mask"

    def __init__(self, capacity: int, max_age: int) -> None:
        super().__init__(capacity, max_age)
        self.cols["source"] = np.zeros(self.storage, np.int64)
        self.bounds = np.full(len(SOURCE_BOUNDS), max_age, np.int64)
        for source, age in SOURCE_BOUNDS.items():
            self.bounds[source] = age

    def fill_tagged(self, ids: np.ndarray, steps: np.ndarray, sources: np.ndarray) -> None:
        self.put(ids, steps)
        self.cols["source"][self.tail - len(ids) : self.tail] = sources

    def take(self, batch_size: int, step: int) -> int:
        live = slice(self.head, self.tail)
        cutoff = step - self.bounds[self.cols["source"][live]]  # each entry's own bound
        fresh = np.flatnonzero(self.cols["sample_step"][live] >= cutoff)[:batch_size]
        out = {k: col[live][fresh] for k, col in self.cols.items()}  # the gather of the batch
        walked = int(fresh[-1]) + 1 if len(fresh) == batch_size else self.tail - self.head
        self.head += walked
        return len(out["traj_id"])


class _Ours:
    """StalenessBuffer filled with the case's stamps, with the four bounds and tags or with one max_age."""

    def __init__(self, capacity: int, tagged: bool) -> None:
        if tagged:
            self.buf = StalenessBuffer(capacity, max_age=MAX_AGE, source_max_age=SOURCE_BOUNDS, pin_memory=False)
        else:
            self.buf = StalenessBuffer(capacity, max_age=untagged_max_age(), pin_memory=False)
        self.tagged = tagged

    def fill(self, ids: np.ndarray, steps: np.ndarray, sources: np.ndarray) -> None:
        if self.tagged:
            self.buf.put(ids, steps, source=sources)
        else:
            self.buf.put(ids, steps)

    def take(self, batch_size: int, step: int) -> int:
        return len(self.buf.take(batch_size, step).traj_ids)

    def __len__(self) -> int:
        return len(self.buf)


def sources_case(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
    """take(B) from a full ring of four round-robin sources with their own max_age; see the module docstring."""
    del skipped  # every contender is part of the package or numpy
    rows = []
    rng = np.random.default_rng(0)
    capacity = plan.capacities[0]  # the walk, not the ring size, sets the cost
    ids = np.arange(capacity, dtype=np.int64)
    sources = ids % len(SOURCE_BOUNDS)
    steps = CURRENT_STEP - rng.integers(0, AGES, capacity)
    for batch in plan.batches:
        contenders: Dict[str, Any] = {
            "tagged": _Ours(capacity, True),
            "untagged": _Ours(capacity, False),
            "numpy": NumpySources(capacity, MAX_AGE),
        }
        timed: Dict[str, Timed] = {}
        returned: Dict[str, List[int]] = {}
        for name, c in contenders.items():
            fill = c.fill_tagged if name == "numpy" else c.fill
            fill(ids, steps, sources)
            got = returned[name] = []

            def refill(c: Any = c, fill: Any = fill) -> None:
                if len(c) < 0.6 * capacity:  # keep the ring about full of the same mix
                    fill(ids, steps, sources)

            def take(c: Any = c, b: int = batch, got: List[int] = got) -> None:
                got.append(c.take(b, CURRENT_STEP))

            # A timed loop walks at most a third of the ring refilled to >= 60% before it: every call finds a batch.
            timed[name] = (take, refill, max(1, min(calibrate(take), capacity // 3 // batch // 4)))
        floor = peers.Copy(capacity)

        def copy(floor: peers.Copy = floor, b: int = batch) -> None:
            floor.take(b, CURRENT_STEP)

        timed["floor"] = (copy, None, calibrate(copy))
        for name, times in sample_interleaved(timed, plan.repeat).items():
            r: Dict[str, Any] = {
                "case": "take_sources",
                "contender": {"floor": "copy (floor)", "numpy": "numpy mask"}.get(name, "pyfast_buffer"),
                "capacity": capacity,
                "batch": batch,
                "order": name,
                "sources": len(SOURCE_BOUNDS),
                "median_s": median(times),
                "p99_s": percentile(times, 99),
                "runs": len(times),
            }
            if name in returned:
                r["returned_mean"] = float(np.mean(returned[name]))
            rows.append(r)
    return rows
