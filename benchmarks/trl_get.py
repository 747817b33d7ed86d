"""Per sample, what the trainer's ``rollout_buffer.get`` costs: ours (a group taken from the StalenessBuffer, its
samples handed out one by one) against TRL 1.16's queue path (the ``multiprocessing`` queue its ``AsyncRolloutWorker``
fills from a spawned child: the trainer's get reads and unpickles each sample), with an in-process ``queue.Queue``
(what TRL's protocol also allows) and the floor, a copy of the same sample bytes. All in one process, each drain of
N samples repeated, median per sample; ratios against ours.

    python benchmarks/trl_get.py [--samples 4096] [--tokens 512] [--repeats 5]   (~30 s)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import time
from types import SimpleNamespace
from typing import Any, Callable, List

import numpy as np

G = 8


def make_samples(n: int, tokens: int) -> List[Any]:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    rng = np.random.default_rng(0)
    half = tokens // 2
    out = []
    for i in range(n):
        out.append(
            RolloutSample(
                prompt=[{"role": "user", "content": "what is 3 plus 4 ?"}],
                completion=[{"role": "assistant", "content": "7"}],
                input_ids=rng.integers(0, 150_000, tokens, dtype=np.int64),
                completion_mask=np.r_[np.zeros(half, np.int64), np.ones(tokens - half, np.int64)],
                old_log_probs=rng.standard_normal(tokens).astype(np.float32),
                advantage=0.5,
                model_version=1,
                group_id=i // G,
                metrics={"reward": 1.0, "reward_std": 0.5},
            )
        )
    return out


def ours(samples: List[Any]) -> float:
    """Seconds per sample for the trainer's get from our worker's rollout_buffer."""
    from pyfast_buffer.integrations.trl import StalenessRolloutWorker
    from pyfast_buffer.integrations.trl._worker import READY

    async def unused(prompt_ids: List[int], max_tokens: int) -> Any:
        raise AssertionError("no generation in this benchmark")

    worker = StalenessRolloutWorker(
        dataset=[{"prompt": "x"}],
        processing_class=object(),
        reward_funcs=[len],
        num_generations=G,
        max_completion_length=4,
        complete=unused,
        max_age=4,
        capacity=len(samples),
    )
    worker.configure(
        SimpleNamespace(
            max_staleness=4,
            num_generations=G,
            per_device_train_batch_size=G,
            world_size=1,
            gradient_accumulation_steps=1,
            weight_sync_steps=1,
            token_budget=0,
            queue_maxsize=0,
        )
    )
    worker.update_model_version(1)
    buffer = worker.buffer
    for group in range(len(samples) // G):  # what _generation._into_buffer does for a finished group
        trajectories = [group * G + k for k in range(G)]
        buffer.dispatch([group], 1)
        worker._groups[group] = {"index": 0, "state": READY, "step": 1}
        worker._samples.update(zip(trajectories, samples[group * G : (group + 1) * G]))
        buffer.complete(trajectories, [group] * G)
    get = worker.rollout_buffer.get
    started = time.perf_counter()
    for _ in range(len(samples)):
        get(timeout=1.0)
    return (time.perf_counter() - started) / len(samples)


def _child(q: Any, n: int, tokens: int) -> None:
    samples = make_samples(n, tokens)  # made first: the timed part is the queue path, not the making
    for sample in samples:
        q.put(sample)


def trl_mp(samples: List[Any], tokens: int) -> float:
    """TRL's path: a spawned child puts samples on a spawn-context mp.Queue, the trainer gets them (the child's
    feeder thread pickles and writes while the trainer reads and unpickles, as in a run: 2 cores here)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_child, args=(q, len(samples), tokens), daemon=True)
    child.start()
    q.get(timeout=120)  # the child is up and producing: time the rest
    started = time.perf_counter()
    for _ in range(len(samples) - 1):
        q.get(timeout=60)
    per = (time.perf_counter() - started) / (len(samples) - 1)
    child.join(30)
    return per


def in_process(samples: List[Any]) -> float:
    q: queue.Queue = queue.Queue()
    for sample in samples:
        q.put_nowait(sample)
    started = time.perf_counter()
    for _ in range(len(samples)):
        q.get(timeout=1.0)
    return (time.perf_counter() - started) / len(samples)


def floor(samples: List[Any]) -> float:
    """A copy of each sample's arrays: the bytes a get would have to move at the least if it moved them."""
    started = time.perf_counter()
    for s in samples:
        s.input_ids.copy(), s.completion_mask.copy(), s.old_log_probs.copy()
    return (time.perf_counter() - started) / len(samples)


def median(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    samples = make_samples(args.samples - args.samples % G, args.tokens)
    rows = {
        "ours (StalenessRolloutWorker.rollout_buffer)": median(lambda: ours(samples), args.repeats),
        "TRL's AsyncRolloutWorker path (spawned child, mp.Queue)": median(
            lambda: trl_mp(samples, args.tokens), args.repeats
        ),
        "in-process queue.Queue": median(lambda: in_process(samples), args.repeats),
        "floor: copy of the sample's arrays": median(lambda: floor(samples), args.repeats),
    }
    base = rows["ours (StalenessRolloutWorker.rollout_buffer)"]
    print(f"{len(samples)} samples of {args.tokens} tokens, median of {args.repeats} drains")
    print("| get from | µs per sample | ratio to ours |")
    print("| --- | --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds * 1e6:.2f} | {seconds / base:.2f}x |")


if __name__ == "__main__":
    main()
