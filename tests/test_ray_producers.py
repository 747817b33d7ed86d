"""Three producer processes feed one RemoteBuffer while a trainer takes: exact accounting on a real local Ray.

Each producer is a Ray actor (its own process) that puts groups of GROUP trajectories, many groups per
call; the trainer is this driver. Under drop one producer lags far behind the trainer's step, so its
groups go stale; under wait every prompt is dispatched, held in flight a moment, then completed.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import List

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")


from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

# Workers unpickle this module's remote functions and actors by value: they need not (and, with the
# repository off their sys.path, cannot) import the test module itself.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("ray_namespace")

TRAJECTORIES = 10_000
GROUP = 4  # trajectories per prompt (GRPO's n)
GROUPS_PER_CALL = 16  # batched calls: 64 trajectories per round trip
BATCH = 64
MAX_AGE = 4
BASE_STEP = 100  # the trainer's first step; producers stamp relative to it


NAMESPACE = "pyfast_buffer_producer_tests"


@ray.remote(num_cpus=0)
class Producer:
    """A rollout worker: stamps with the trainer's step (read from the buffer's ledger) minus ``lag``."""

    def run(self, client: RemoteBuffer, prompts: np.ndarray, lag: int, in_flight: bool, hold_s: float) -> int:
        for start in range(0, len(prompts), GROUPS_PER_CALL):
            chunk = prompts[start : start + GROUPS_PER_CALL]
            step = max(0, trainer_step(client.ledger()["taken"]) - lag)
            trajs = (chunk[:, None] * GROUP + np.arange(GROUP)).ravel()
            owners = np.repeat(chunk, GROUP)
            if in_flight:
                client.dispatch(chunk, step)
                time.sleep(hold_s)  # generating: the trainer may have to wait for these prompts
                client.complete(trajs, owners)
            else:
                client.put(trajs, step, group_ids=owners)
        return len(prompts) * GROUP

    def dispatch_and_hang(self, client: RemoteBuffer, prompts: list, step: int, lease: float) -> None:
        """Dispatches with a lease, then generates forever: the test kills this process mid-generation."""
        client.dispatch(prompts, step, lease=lease)
        time.sleep(3600)

    def ping(self) -> int:
        return 0


def trainer_step(taken: int) -> int:
    return BASE_STEP + taken // BATCH


@pytest.fixture(scope="module")
def producers():
    workers = [Producer.remote() for _ in range(3)]
    ray.get([w.ping.remote() for w in workers])
    return workers


def train(client: RemoteBuffer, runs: List[ray.ObjectRef]) -> List[np.ndarray]:
    """Takes full batches (blocking) while producers run, then drains what is left; returns each batch's columns."""
    batches, taken = [], 0
    while True:
        finished = not ray.wait(runs, num_returns=len(runs), timeout=0)[1]
        try:
            batch = client.take(BATCH, trainer_step(taken), timeout=0.5)
        except TimeoutError:
            if finished:
                break
            continue
        batches.append(batch.columns.numpy())
        taken += len(batch)
    ray.get(runs)
    while len(client):
        batch = client.take(BATCH, trainer_step(taken))
        assert len(batch), batch.metrics  # nothing in flight now: anything left must be takeable
        batches.append(batch.columns.numpy())
        taken += len(batch)
    return batches


def check_batches_and_ledger(client: RemoteBuffer, batches: List[np.ndarray]) -> np.ndarray:
    taken = np.concatenate([b[0] for b in batches])
    assert len(np.unique(taken)) == len(taken), "an id was taken twice"
    for b in batches:  # a batch never splits a group
        assert set(collections.Counter(b[1].tolist()).values()) <= {GROUP}
    led = client.ledger()
    assert led["put_total"] == TRAJECTORIES
    assert led["put_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"]
    assert led["dispatched"] == led["completed"] + led["failed"] + led["in_flight"]
    assert led["buffer_left"] == 0 and led["in_flight"] == 0
    assert led["retired"] == led["taken"] == len(taken)
    # Every id put was taken (retired) or released otherwise, exactly once, and the report says which.
    released = client.released()
    assert np.array_equal(np.sort(released.of("retired")), np.sort(taken))
    left = np.concatenate([released.of("retired"), released.of("dropped_stale"), released.of("evicted")])
    assert np.array_equal(np.sort(left), np.arange(TRAJECTORIES))
    assert len(released.of("dropped_stale")) == led["dropped_stale"] and len(released.of("evicted")) == led["evicted"]
    return taken


def test_three_producers_under_drop_every_id_taken_or_dropped_once(producers):
    client = RemoteBuffer.create(4096, max_age=MAX_AGE, strategy="drop", track_released=True)
    prompts = np.array_split(np.arange(TRAJECTORIES // GROUP), 3)
    lags = (0, 1, MAX_AGE + 4)  # the third producer's groups are always too old to train on
    runs = [p.run.remote(client, ids, lag, False, 0.0) for p, ids, lag in zip(producers, prompts, lags)]
    taken = check_batches_and_ledger(client, train(client, runs))
    led = client.ledger()
    stale_prompts = prompts[2]
    stale_trajs = (stale_prompts[:, None] * GROUP + np.arange(GROUP)).ravel()
    assert not np.isin(taken, stale_trajs).any(), "a stale trajectory was trained on"
    assert led["dropped_stale"] + led["evicted"] >= len(stale_trajs)
    assert len(taken) + led["dropped_stale"] + led["evicted"] == TRAJECTORIES


def test_three_producers_under_wait_every_id_taken_once(producers):
    client = RemoteBuffer.create(4096, max_age=MAX_AGE, strategy="wait", on_full="block", track_released=True)
    prompts = np.array_split(np.arange(TRAJECTORIES // GROUP), 3)
    runs = [p.run.remote(client, ids, 0, True, 0.002) for p, ids in zip(producers, prompts)]
    taken = check_batches_and_ledger(client, train(client, runs))
    led = client.ledger()
    assert led["dropped_stale"] == led["evicted"] == 0
    assert led["dispatched"] == led["completed"] == TRAJECTORIES // GROUP
    assert np.array_equal(np.sort(taken), np.arange(TRAJECTORIES))


def test_a_killed_producer_holds_a_wait_trainer_only_until_its_lease():
    lease = 4.0
    client = RemoteBuffer.create(256, max_age=2, strategy="wait", track_released=True)
    doomed = Producer.remote()
    ray.get(doomed.ping.remote())
    doomed.dispatch_and_hang.remote(client, [70, 71, 72], 0, lease)
    wait_until_in_flight(client, 3)
    ray.kill(doomed)  # mid-generation: its three prompts stay in flight, nobody will complete them
    client.put(list(range(8)), 2)
    client.renew([70, 71, 72], lease)  # the lease counts from here, so the short take below runs well inside it
    with pytest.raises(TimeoutError, match="prompt 70"):  # at step 2 the prompts of step 0 are at max_age
        client.take(8, 2, timeout=0.1)
    batch = client.take(8, 2, timeout=120)  # returns once the lease passes, long before this timeout
    assert batch.traj_ids.tolist() == list(range(8))
    led = client.ledger()
    assert led["expired"] == led["failed"] == 3 and led["in_flight"] == 0
    assert led["dispatched"] == led["completed"] + led["failed"] + led["in_flight"]
    assert sorted(client.released().of("expired").tolist()) == [70, 71, 72]


def wait_until_in_flight(client: RemoteBuffer, n: int, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while client.in_flight < n:
        assert time.monotonic() < deadline, f"the producer never dispatched {n} prompts"
        time.sleep(0.05)
