"""verl sampling at 4k, 17k and 70k TransferQueue tags: where one ``sample`` spends its time.

Per size, one benchmark group with four rows:
- ``tq round trip``: ``tq.kv_list(partition)`` alone, on a real TransferQueue.
- ``verl polling model, cpu``: the per-poll work of verl's design on that answer (rebuild every
  status set and the trajectory map, sort the sampleable prompts, select, collect keys). This is our
  model of the design described in verl PR #6778, not verl's code; verl adds a sleep of
  ``poll_interval`` (2 s) per poll that finds too little, which no row here includes.
- ``pyfast_buffer, cpu``: FastReplayBuffer's work on the same answer (diff into the mirror, drop,
  native take, collect keys).
- ``pyfast_buffer sample, end to end``: ``FastReplayBuffer.sample`` on the real TransferQueue
  (round trip + cpu + clearing the sampled prompt keys).
Each round consumes ``BATCH`` groups and the next one adds as many, so the partition stays at size.
"""

from __future__ import annotations

import pytest

from _verl_helpers import clear_partition, new_partition, new_uid, put_prompts_bulk, running_transfer_queue

verl_mod = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")

SESSIONS = 3  # a group is 1 prompt tag + 3 trajectory tags
BATCH = 64  # prompts per sample
STEP = 10
SIZES = [4_000, 17_000, 70_000]


@pytest.fixture(scope="module")
def tq_running():
    with running_transfer_queue() as tq:
        yield tq


def groups(tags: int) -> int:
    return tags // (SESSIONS + 1)


def fake_items(n_groups: int, step: int = STEP) -> dict:
    items = {}
    for _ in range(n_groups):
        add_group(items, step)
    return items


def add_group(items: dict, step: int) -> str:
    uid = new_uid()
    for s in range(SESSIONS):
        items[f"{uid}_{s}_0"] = {"is_prompt": False, "global_steps": step}
    items[uid] = {"is_prompt": True, "status": "finished", "global_steps": step}
    return uid


def consume(items: dict, uids) -> None:
    """What the trainer does after a step: the prompt and its trajectories leave TransferQueue."""
    for uid in uids:
        del items[uid]
        for s in range(SESSIONS):
            items.pop(f"{uid}_{s}_0", None)


def replace_taken(items: dict, uids) -> None:
    """Consumes the sampled groups and adds as many fresh ones, so the partition stays at size."""
    consume(items, uids)
    for _ in uids:
        add_group(items, STEP)


def verl_polling_model(items: dict, batch_size: int) -> tuple[list, list]:
    """One poll of the polling design: everything rebuilt from the listed tags, then sort and select."""
    pending, running, finished, failure, steps, trajs = set(), set(), set(), set(), {}, {}
    by_status = {"pending": pending, "running": running, "finished": finished, "failure": failure}
    for key, tag in items.items():
        if tag.get("is_prompt", False):
            steps[key] = tag["global_steps"]
            by_status[tag["status"]].add(key)
        else:
            trajs.setdefault(key, {}).update(tag)
    if len(finished) + len(failure) < batch_size:
        return [], []
    chosen = sorted(finished | failure, key=lambda k: steps.get(k, 0))[:batch_size]
    wanted = set(chosen)
    keys = [k for k in trajs if k.split("_")[0] in wanted]
    return chosen, keys


def make_sampler():
    return verl_mod.FastReplayBuffer(trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=8,
                                     max_off_policy_strategy="drop", sampler_kwargs={"capacity": 1 << 17})


@pytest.mark.parametrize("tags", SIZES)
def test_tq_round_trip(benchmark, tq_running, tags):
    benchmark.group = f"verl sample B={BATCH} tags={tags}"
    pid = new_partition()
    try:
        put_prompts_bulk(pid, groups(tags), "finished", STEP, SESSIONS)
        listed = benchmark.pedantic(lambda: tq_running.kv_list(partition_id=pid), rounds=10, warmup_rounds=1)
        assert len(listed[pid]) == groups(tags) * (SESSIONS + 1)
    finally:
        clear_partition(pid)


@pytest.mark.parametrize("tags", SIZES)
def test_verl_polling_model_cpu(benchmark, tags):
    benchmark.group = f"verl sample B={BATCH} tags={tags}"
    items = fake_items(groups(tags))

    def one_sample():
        chosen, keys = verl_polling_model(items, BATCH)
        replace_taken(items, chosen)
        return chosen, keys

    chosen, keys = benchmark.pedantic(one_sample, rounds=10, warmup_rounds=1)
    assert len(chosen) == BATCH and len(keys) == BATCH * SESSIONS


@pytest.mark.parametrize("tags", SIZES)
def test_pyfast_buffer_cpu(benchmark, tags):
    benchmark.group = f"verl sample B={BATCH} tags={tags}"
    items = fake_items(groups(tags))
    mirror = make_sampler()._mirror("bench")
    mirror.refresh(items)  # steady state: the mirror already knows the partition

    def one_sample():
        mirror.refresh(items)
        mirror.drop_stale(STEP)
        taken, _ = mirror.take(BATCH, STEP)
        replace_taken(items, taken.uids)
        return taken.uids, taken.keys

    uids, keys = benchmark.pedantic(one_sample, rounds=10, warmup_rounds=1)
    assert len(uids) == BATCH and len(keys) == BATCH * SESSIONS


@pytest.mark.parametrize("tags", SIZES)
def test_pyfast_buffer_sample_end_to_end(benchmark, tq_running, tags):
    benchmark.group = f"verl sample B={BATCH} tags={tags}"
    pid = new_partition()
    rb = make_sampler()
    last = {}

    def refill():
        if last:  # the trainer clears a consumed batch's trajectories; new groups replace the consumed ones
            tq_running.kv_clear(keys=last["keys"], partition_id=pid)
        put_prompts_bulk(pid, BATCH, "finished", STEP, SESSIONS)
        return (), {}

    def one_sample():
        batch, _ = rb.sample(global_steps=STEP, partition_id=pid, batch_size=BATCH)
        last["keys"] = batch.keys
        return batch

    try:
        put_prompts_bulk(pid, groups(tags) - BATCH, "finished", STEP, SESSIONS)
        rb.get_sampleable_count(STEP, pid)  # steady state: the mirror already knows the partition
        batch = benchmark.pedantic(one_sample, setup=refill, rounds=5, warmup_rounds=1)
        assert len(batch.keys) == BATCH * SESSIONS
    finally:
        clear_partition(pid)
