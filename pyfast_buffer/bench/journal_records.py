"""How many bytes one journal record costs per kind of call, as the ring grows (no Ray cluster needed).

Each ring is filled to capacity and laid out so that one round of a call changes 64 rows: a take of 64, a put
of 64, 64 single-group ``evict_oldest`` calls (what the Ray index's ``capacity_bytes`` eviction makes), an
``evict_stale`` removing 64 rows spread over the ring (stamps out of order; or sorted stamps with a tighter
per-source bound), and pace's re-sort after an out-of-order complete (64 rows that go before the ring's). A
record's size is ``len(encode_record({"core": trimmed(buf._journal_delta())}))`` after the round (the core's
part of the record as the index writes it, its empty arrays left out), the largest of 8 rounds; the whole
ring's export is the snapshot's. ``tests/test_ray_journal.py`` replays every delta.

``python -m pyfast_buffer.bench.journal_records [--sizes 1024 16384 1048576]`` prints the table of docs/ray.md,
then what the snapshot's copy of a full ring costs under the lock beside a copy of the same bytes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import pyfast_buffer as pfb
from pyfast_buffer.ray import _journal
from pyfast_buffer.ray._ring_replay import trimmed

CALLS = ("take", "put", "evict_oldest", "evict_stale_out_of_order", "evict_stale_per_source", "pace_resort")
ROUNDS = 8
ROWS = 64  # rows one round changes
PACE_PROMPT = 1 << 40  # the first of pace_resort's prompt ids


def ring_for(call: str, capacity: int) -> pfb.StalenessBuffer:
    """A full ring of `capacity` (>= 512) entries, laid out so that each round of `call` changes 64 rows."""
    config: Dict[str, Any] = dict(capacity=capacity, max_age=100, max_uses=2, on_full="evict_oldest", pin_memory=False)
    ids = np.arange(capacity, dtype=np.int64)
    marked = ids % (capacity // (ROUNDS * ROWS)) == 0  # 512 rows spread evenly over the ring, 64 for each round
    if call == "pace_resort":  # one prompt per round dispatched at step 0, before a ring stamped 1
        room = capacity + ROUNDS * ROWS
        buf = pfb.StalenessBuffer(**{**config, "capacity": room}, strategy="pace", prompts_per_step=2 * capacity)
        buf.dispatch(PACE_PROMPT + np.arange(ROUNDS, dtype=np.int64), 0)
        buf.put(ids, 1)
        return buf
    if call == "evict_stale_per_source":  # sorted stamps, but source 1's tighter bound removes its rows
        buf = pfb.StalenessBuffer(**config, source_max_age={1: 7})
        buf.put(ids, ids * ROUNDS // capacity, source=marked.astype(np.int64))
        return buf
    buf = pfb.StalenessBuffer(**config)
    if call == "evict_stale_out_of_order":  # the marked rows carry old stamps, one stamp per round
        buf.put(ids, np.where(marked, np.cumsum(marked) * ROUNDS // (marked.sum() + 1), 50))
    else:
        buf.put(ids, 0)
    return buf


def run_round(buf: pfb.StalenessBuffer, call: str, capacity: int, i: int) -> None:
    """Round `i` of `call`: one call changing 64 rows."""
    if call == "take":
        buf.take(ROWS, 1)
    elif call == "put":
        buf.put(np.arange(ROWS, dtype=np.int64) + capacity * (i + 2), 1)
    elif call == "evict_oldest":  # a group at a time, as the Ray index's byte budget evicts
        for _ in range(ROWS):
            buf.evict_oldest(1)
    elif call == "evict_stale_out_of_order":
        assert buf.evict_stale(101 + i) == ROWS
    elif call == "evict_stale_per_source":
        assert buf.evict_stale(i + ROUNDS) == ROWS
    else:  # a prompt of step 0 completes after the ring's step-1 entries: its rows go before them
        buf.complete(np.arange(ROWS, dtype=np.int64) + capacity * (i + 2), np.full(ROWS, PACE_PROMPT + i))


def record_bytes(delta: Dict[str, Any]) -> int:
    """The size of a journal record holding `delta`, as the index writes it (trimmed of its empty arrays)."""
    return len(_journal.encode_record({"core": trimmed(delta)}))


def measure(sizes: Sequence[int]) -> List[Dict[str, Any]]:
    rows = []
    for call in CALLS:
        for capacity in sizes:
            buf = ring_for(call, capacity)
            buf._journal_delta(full=True)
            per_call = []
            for i in range(ROUNDS):
                run_round(buf, call, capacity, i)
                per_call.append(record_bytes(buf._journal_delta()))
            whole = record_bytes(buf._journal_delta(full=True))
            rows.append({"call": call, "ring": capacity, "record": max(per_call), "whole": whole})
    return rows


def capture_ms(size: int, repeat: int = 9) -> Dict[str, float]:
    """The snapshot's copy of a full ring of `size` entries under the lock (``_journal_delta(full=True)``),
    median ms, beside the floor: one copy of the same column bytes into fresh memory."""
    buf = pfb.StalenessBuffer(capacity=size, max_age=10, max_uses=1, on_full="evict_oldest", pin_memory=False)
    buf.put(np.arange(size, dtype=np.int64), 0)
    columns = np.ones(size * 10, np.int64)  # 9 int64 and 2 int32 columns per entry

    def median_ms(work: Any) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[repeat // 2]

    return {"export": median_ms(lambda: buf._journal_delta(full=True)), "floor": median_ms(columns.copy)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Bytes of one journal record per kind of call, by ring size.")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 16384, 1 << 20])
    args = parser.parse_args(argv)
    print("| call | ring | record bytes | whole ring's export | record / whole |")
    print("| --- | --- | --- | --- | --- |")
    for r in measure(args.sizes):
        print(f"| {r['call']} | {r['ring']:,} | {r['record']:,} | {r['whole']:,} | {r['record'] / r['whole']:.4f} |")
    for size in args.sizes:
        t = capture_ms(size)
        print(f"snapshot copy under the lock, {size:,} entries: {t['export']:.2f} ms (floor {t['floor']:.2f} ms)")


if __name__ == "__main__":
    main()
