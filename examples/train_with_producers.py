"""A CPU training loop with producer threads: the buffer between rollout workers and a trainer, its log
line written to a file, payload rows recycled through ``released()``, then ``pyfast-buffer audit`` on the log.

    python examples/train_with_producers.py --strategy wait --steps 40 --log train.log

Each producer thread plays a rollout worker: it reserves payload rows for a group (examples/slot_pool.py),
dispatches the prompt stamped with the trainer's current weights, "generates" for a few milliseconds,
writes the rows and completes the group (or fails it now and then). The trainer takes a full batch per
step, reads the rows, then drains ``released()`` so the rows go back to the pool. The process exits with
the audit's status: 0 when the ledger in the log balances.
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import threading
import time
from typing import List, Optional

import torch
from slot_pool import SlotPool

from pyfast_buffer import BufferClosedError, BufferFullError, StalenessBuffer

GROUP = 4
#: The strategies this example runs (docs/design.md, "Strategies").
STRATEGIES = ("drop", "wait", "pace")


def buffer_options(strategy: str, batch: int) -> dict:
    """The StalenessBuffer keywords for ``strategy``: the one place a new strategy's settings go."""
    if strategy == "pace":  # admission: a step consumes batch // GROUP prompt groups
        return {"strategy": strategy, "prompts_per_step": batch // GROUP}
    return {"strategy": strategy}


def log_to_file(path: str) -> logging.Handler:
    """Sends the buffer's one line per take (the ``pyfast_buffer`` logger at INFO) to ``path``."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    log = logging.getLogger("pyfast_buffer")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


class Trainer:
    """The weights version producers stamp their prompts with (read without a lock: an int is atomic)."""

    def __init__(self) -> None:
        self.step = 0


def producer(
    worker: int, buf: StalenessBuffer, pool: SlotPool, payload: torch.Tensor, trainer: Trainer, stop: threading.Event
) -> None:
    rng = random.Random(worker)
    prompt = worker << 32  # prompt ids unique across workers
    try:
        while not stop.is_set():
            rows = pool.acquire(GROUP, timeout=30.0)  # before dispatch: an in-flight prompt never waits for rows
            prompt += 1
            try:  # under pace this waits for an admission slot; the other strategies start at once
                buf.dispatch([prompt], trainer.step, timeout=30.0)
            except (BufferFullError, TimeoutError):  # not admitted (pace): nothing is in flight
                pool.give_back(rows)
                continue
            time.sleep(rng.uniform(0.0, 0.004))  # generation
            if rng.random() < 0.03:
                buf.fail([prompt])
                pool.give_back(rows)  # nothing of a failed prompt enters the buffer
                continue
            payload[rows] = torch.randint(0, 32000, (GROUP, payload.shape[1]))
            buf.complete(rows, [prompt] * GROUP)
    except BufferClosedError:
        pass  # the trainer is done


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=STRATEGIES, default="wait")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-age", type=int, default=2)
    parser.add_argument("--log", default="train.log")
    args = parser.parse_args(argv)

    handler = log_to_file(args.log)
    capacity = 8 * args.batch
    rows = capacity + 2 * args.batch + args.producers * GROUP  # the ring, one batch being read, reservations
    pool = SlotPool(rows)
    payload = torch.empty(rows, 16, dtype=torch.long)
    buf = StalenessBuffer(
        capacity=capacity, max_age=args.max_age, track_released=True, **buffer_options(args.strategy, args.batch)
    )
    trainer, stop = Trainer(), threading.Event()
    workers = [
        threading.Thread(target=producer, args=(w, buf, pool, payload, trainer, stop), daemon=True)
        for w in range(args.producers)
    ]
    for w in workers:
        w.start()
    weights = torch.zeros(16)
    recycled = 0
    try:
        for step in range(args.steps):
            trainer.step = step
            batch = buf.take(args.batch, current_step=step, timeout=30.0)
            tokens = payload[batch.traj_ids].float()  # read the rows before giving them back
            weights += 1e-3 * (tokens.mean(dim=0) / 32000 - weights)  # a stand-in update
            recycled += pool.recycle(buf.released())
    finally:
        stop.set()
        buf.close()  # wakes producers blocked in the buffer
        for w in workers:
            w.join(timeout=30.0)
        handler.close()
        logging.getLogger("pyfast_buffer").removeHandler(handler)
    ledger = buf.ledger()
    print(
        f"{args.steps} steps under {args.strategy}: {ledger['taken']} taken, {ledger['dropped_stale']} dropped "
        f"stale, {ledger['evicted']} evicted; {recycled} payload rows recycled through released(), "
        f"{pool.free()} of {rows} free at the end"
    )
    audit = subprocess.run([sys.executable, "-m", "pyfast_buffer", "audit", args.log])
    return audit.returncode


if __name__ == "__main__":
    raise SystemExit(main())
