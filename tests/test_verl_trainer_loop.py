"""A verl-shaped run on a real TransferQueue: a rollout thread and a separate_async-shaped trainer loop.

The rollout thread moves each prompt pending -> running -> finished (or failure), writing its
trajectories before the final status as verl's agent loop does; some prompts are slow, so they
finish several trainer steps late. The trainer, per step, dispatches a batch of prompts (verl's
``prepare_step``), reads ``get_sampleable_count``, waits with ``wait_for_sampleable`` when short,
samples, and clears the batch's trajectories; its ``refill_fn`` dispatches new prompts. 200 steps
under ``drop`` and under ``wait``.
"""

from __future__ import annotations

import heapq
import random
import threading
import time

import pytest
from _verl_helpers import (
    clear_partition,
    new_partition,
    new_uid,
    running_transfer_queue,
    uids_of,
)

pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
verl_mod = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")

STEPS = 200
BATCH = 4
SESSIONS = 2
THRESHOLD = {"drop": 2, "wait": 3}  # wait blocks on prompts one step younger than drop evicts
TIMEOUT_S = 20.0
SLACK_S = 5.0  # scheduling slack on a loaded 2-core machine; a call that hangs would take TIMEOUT_S more


@pytest.fixture(scope="module")
def tq_running():
    with running_transfer_queue() as tq:
        yield tq


class Rollout(threading.Thread):
    """Runs dispatched prompts: running at once, terminal after a delay (10% slow, 5% failures)."""

    def __init__(self, tq, partition_id: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.tq, self.partition_id, self.rng = tq, partition_id, random.Random(seed)
        self.queue: list = []  # (due time, uid, step, phase)
        self.cond = threading.Condition()
        self.stopping = False
        self.error: BaseException | None = None
        self.dispatched = 0

    def dispatch(self, count: int, step: int) -> int:
        uids = [new_uid() for _ in range(count)]
        self.tq.kv_batch_put(
            keys=uids,
            partition_id=self.partition_id,
            tags=[{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids],
        )
        with self.cond:
            for uid in uids:
                heapq.heappush(self.queue, (time.monotonic(), uid, step, "run"))
            self.dispatched += count
            self.cond.notify()
        return count

    def run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and (not self.queue or self.queue[0][0] > time.monotonic()):
                        self.cond.wait(0.005)
                    if self.stopping:
                        return
                    _, uid, step, phase = heapq.heappop(self.queue)
                self._advance(uid, step, phase)
        except BaseException as exc:
            self.error = exc

    def _advance(self, uid: str, step: int, phase: str) -> None:
        tag = {"is_prompt": True, "global_steps": step}
        if phase == "run":
            self.tq.kv_put(key=uid, partition_id=self.partition_id, tag={**tag, "status": "running"})
            delay = self.rng.uniform(0.15, 0.3) if self.rng.random() < 0.1 else self.rng.uniform(0.0, 0.03)
            with self.cond:
                heapq.heappush(self.queue, (time.monotonic() + delay, uid, step, "end"))
            return
        failed = self.rng.random() < 0.05
        sessions = self.rng.choice([0, 1]) if failed else SESSIONS
        keys = [f"{uid}_{s}_0" for s in range(sessions)]
        if keys:
            self.tq.kv_batch_put(
                keys=keys,
                partition_id=self.partition_id,
                tags=[{"is_prompt": False, "global_steps": step} for _ in keys],
            )
        self.tq.kv_put(
            key=uid, partition_id=self.partition_id, tag={**tag, "status": "failure" if failed else "finished"}
        )

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.join(10)


def timed(durations: list, fn, *args):
    started = time.monotonic()
    try:
        return fn(*args)
    finally:
        durations.append(time.monotonic() - started)


@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_two_hundred_steps_of_a_separate_async_trainer(tq_running, strategy):
    pid = new_partition()
    rollout = Rollout(tq_running, pid, seed=7 if strategy == "drop" else 11)
    step = 0
    refills: list[int] = []

    def refill_fn(count: int) -> int:
        refills.append(count)
        return rollout.dispatch(count, step)

    rb = verl_mod.FastReplayBuffer(
        trainer_mode="separate_async",
        trainer_config={},
        max_off_policy_threshold=THRESHOLD[strategy],
        max_off_policy_strategy=strategy,
        sampler_kwargs={"timeout": TIMEOUT_S},
        refill_fn=refill_fn,
    )
    durations: list[float] = []
    trained: list[str] = []
    evicted_in_metrics = 0
    spans: list[int] = []
    rollout.start()
    try:
        rollout.dispatch(2 * BATCH, step)
        for step in range(STEPS):
            rollout.dispatch(BATCH, step)  # verl's prepare_step: one batch of new prompts per step
            if timed(durations, rb.get_sampleable_count, step, pid) < BATCH:
                _, metrics = timed(durations, rb.wait_for_sampleable, step, pid, BATCH)
                evicted_in_metrics += sum(v for k, v in metrics.items() if k.endswith("/evicted_samples"))
            batch, metrics = timed(durations, rb.sample, step, pid, BATCH)
            evicted_in_metrics += sum(v for k, v in metrics.items() if k.endswith("/evicted_samples"))
            got = uids_of(batch.keys)
            trained.extend(uid for uid in got if uid)
            spans.extend(step - tag["global_steps"] + 1 for tag in batch.tags)
            if batch.keys:
                tq_running.kv_clear(keys=batch.keys, partition_id=pid)  # the trainer's end-of-step cleanup
            assert rollout.error is None, rollout.error
    finally:
        rollout.stop()
        clear_partition(pid)

    led = rb.ledger(pid)
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert led["taken"] == STEPS * BATCH
    assert led["seen"] == led["taken"] + led["evicted"] + led["vanished"] + led["held"], led
    assert led["core_dispatched"] == led["core_completed"] + led["core_failed"] + led["core_in_flight"], led
    assert led["vanished"] == 0 and led["seen"] == rollout.dispatched
    assert sum(refills) == led["refill_requested"] == led["evicted"] == evicted_in_metrics, (refills, led)
    assert led["refill_delivered"] == sum(refills)
    assert max(durations) < TIMEOUT_S + SLACK_S
    if strategy == "drop":
        assert max(spans) <= THRESHOLD[strategy], "a stale group was selected under drop"
        assert led["evicted_stale"] > 0 and led["evicted_failure"] > 0  # both eviction paths ran
    else:
        assert led["evicted_stale"] == 0 and led["evicted_failure"] == led["evicted"] > 0
