"""N rollout workers feed one RemoteBuffer under pace; the trainer takes whole groups never older than max_age."""

import numpy as np
import ray

from pyfast_buffer.ray import RemoteBuffer

GROUP = 4  # samples per prompt (GRPO's n)
BATCH = 64  # trajectories per training step
PROMPTS_PER_STEP = BATCH // GROUP  # pace admits this many prompt groups per trainer step
MAX_AGE = 4
WORKERS, CALLS_PER_WORKER = 3, 10


@ray.remote(num_cpus=1)
def rollout(buf: RemoteBuffer, worker: int) -> int:
    """A rollout worker: dispatch prompts (pace admits them only while they can be trained within MAX_AGE),
    generate, complete them with their payloads."""
    for call in range(CALLS_PER_WORKER):
        first = (worker * CALLS_PER_WORKER + call) * PROMPTS_PER_STEP
        prompts = np.arange(first, first + PROMPTS_PER_STEP)
        step = buf.ledger()["taken"] // BATCH  # the weights' step (in a real system: from the weight sync)
        buf.dispatch(prompts, step, lease=60.0, timeout=600)  # waits for admission; expires 60 s after a crash
        trajs = (prompts[:, None] * GROUP + np.arange(GROUP)).ravel()
        tokens = [np.random.randint(0, 32_000, size=512) for _ in trajs]  # the trajectories themselves
        # Values (not refs): this node's payload owner ray.puts them once and keeps them: they outlive this worker.
        buf.complete(trajs, np.repeat(prompts, GROUP), payloads=tokens)
    return CALLS_PER_WORKER * PROMPTS_PER_STEP * GROUP


def train(buf: RemoteBuffer) -> dict:
    """The trainer loop: one batch per step until every worker's trajectories are trained; returns the ledger."""
    workers = [rollout.remote(buf, w) for w in range(WORKERS)]
    total = WORKERS * CALLS_PER_WORKER * PROMPTS_PER_STEP * GROUP
    oldest = 0
    for step in range(total // BATCH):
        batch = buf.take(BATCH, step, timeout=600)  # blocks in the actor; a completion from any worker wakes it
        batch, tokens = buf.fetch(batch)  # the trajectories, in the order of batch.traj_ids
        oldest = max(oldest, int(batch.age.max()))
        if step % 10 == 0:
            print(
                f"step {step}: {len(batch)} trajectories, max age {int(batch.age.max())}, "
                f"{sum(t.nbytes for t in tokens)} bytes"
            )
        del tokens, batch  # the owners let go of these refs at take: the object store frees them now
    assert sum(ray.get(workers)) == total
    ledger = buf.ledger()
    lost = ledger["payload_lost"] + ledger["lost_in_restart"] + ledger["lost_in_delivery"]
    assert (
        ledger["put_total"]
        == ledger["retired"] + lost + ledger["dropped_stale"] + ledger["evicted"] + ledger["buffer_left"]
    )
    assert oldest <= MAX_AGE and ledger["dropped_stale"] == 0  # pace: nothing trained past the bound, nothing dropped
    print(f"trained {ledger['retired']} trajectories, none older than {oldest} steps; {ledger}")
    return ledger


if __name__ == "__main__":
    ray.init()
    buf = RemoteBuffer.create(
        capacity=65_536,
        max_age=MAX_AGE,
        strategy="pace",
        prompts_per_step=PROMPTS_PER_STEP,
        name="rollouts",
        namespace="rl",
    )
    try:
        train(buf)
    finally:
        buf.kill()  # detached by default: end the index and the payload owners explicitly
        ray.shutdown()
