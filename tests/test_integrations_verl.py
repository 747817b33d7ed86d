"""FastReplayBuffer against a real TransferQueue (no mock), on the behaviours verl's own ReplayBuffer
tests check, plus the flaws it fixes. Skipped without the ``verl`` extra."""

from __future__ import annotations

import importlib.util
import time

import pytest

from _verl_helpers import (Background, clear_partition, listed, new_partition, new_uid, put_group, put_prompt,
                           running_transfer_queue, uids_of)

verl_mod = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")
FastReplayBuffer = verl_mod.FastReplayBuffer


@pytest.fixture(scope="module")
def tq_running():
    with running_transfer_queue() as tq:
        yield tq


@pytest.fixture
def pid(tq_running):
    partition_id = new_partition()
    yield partition_id
    clear_partition(partition_id)


# timeout is a liveness bound for a loaded machine; the tests of the timeout pass their own.
def make(strategy="drop", threshold=8, sync=None, timeout=30.0, **sampler_kwargs):
    trainer_config = {} if sync is None else {"parameter_sync_step": sync}
    return FastReplayBuffer(trainer_mode="separate_async", trainer_config=trainer_config,
                            max_off_policy_threshold=threshold, max_off_policy_strategy=strategy,
                            sampler_kwargs={"timeout": timeout, "poll_interval": 0.01, **sampler_kwargs})


# ---- construction: bad configs fail at the source -------------------------------------------------
@pytest.mark.parametrize("sync", [0, -1])
def test_non_positive_parameter_sync_step_is_a_value_error(sync):
    with pytest.raises(ValueError, match="parameter_sync_step"):
        make(sync=sync)


@pytest.mark.parametrize("kwargs, match", [
    ({"threshold": 0}, "max_off_policy_threshold"),
    ({"strategy": "bogus"}, "max_off_policy_strategy"),
    ({"timeout": 0}, "sampler_kwargs.timeout"),
    ({"poll_interval": 5.0}, "sampler_kwargs.poll_interval"),
])
def test_bad_sampler_config_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_accepts_omegaconf_and_the_verl_call_shape():
    omegaconf = pytest.importorskip("omegaconf")
    rb = FastReplayBuffer(trainer_mode="colocate_async",
                          trainer_config=omegaconf.OmegaConf.create({"parameter_sync_step": 2}),
                          max_off_policy_threshold=3, max_off_policy_strategy="wait",
                          sampler_kwargs=omegaconf.OmegaConf.create({"capacity": 128}), refill_fn=None)
    assert rb.parameter_sync_step == 2
    assert rb._buffer_kwargs["max_age"] == 5  # 3 * 2 - 1
    assert rb.timeout == verl_mod.DEFAULT_TIMEOUT_S


def test_loads_from_its_file_path_like_verl_custom_sampler():
    spec = importlib.util.spec_from_file_location("custom_sampler_module", verl_mod.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.FastReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8,
                                   max_off_policy_strategy="drop", sampler_kwargs={}).parameter_sync_step == 1


# ---- metadata --------------------------------------------------------------------------------------
def test_sync_metadata_classifies_prompts_and_trajectories(pid):
    pending, _ = put_group(pid, "pending", sessions=0, global_steps=4)
    running, _ = put_group(pid, "running", sessions=1, global_steps=3)
    finished, fin_keys = put_group(pid, "finished", sessions=2, global_steps=2)
    failure, _ = put_group(pid, "failure", sessions=1, global_steps=1)
    rb = make()
    rb._sync_metadata_from_transfer_queue(pid)
    assert (rb.pending_keys[pid], rb.running_keys[pid]) == ({pending}, {running})
    assert (rb.finished_keys[pid], rb.failure_keys[pid]) == ({finished}, {failure})
    assert rb.prompt_global_steps[pid] == {pending: 4, running: 3, finished: 2, failure: 1}
    assert set(fin_keys) <= set(rb.partitions[pid])
    assert rb._has_enough_samples(5, pid, 2) and not rb._has_enough_samples(5, pid, 3)


# ---- sample: verl's semantics ----------------------------------------------------------------------
def test_sample_returns_terminal_groups_and_clears_their_prompt_keys(pid):
    finished, fin_keys = put_group(pid, "finished", sessions=2)
    failure, fail_keys = put_group(pid, "failure", sessions=1)
    running, _ = put_group(pid, "running", sessions=1)
    batch, metrics = make().sample(global_steps=0, partition_id=pid, batch_size=2)
    assert batch.partition_id == pid
    assert set(batch.keys) == set(fin_keys) | set(fail_keys) and len(batch.tags) == len(batch.keys)
    remaining = listed(pid)
    assert finished not in remaining and failure not in remaining and running in remaining
    assert not any("/off_policy/" in k for k in metrics)


def test_sample_takes_the_oldest_prompts_first_in_whole_groups(pid):
    newest, _ = put_group(pid, "finished", global_steps=5, sessions=3)
    oldest, _ = put_group(pid, "failure", global_steps=1, sessions=3)
    middle, _ = put_group(pid, "finished", global_steps=2, sessions=3)
    batch, _ = make().sample(global_steps=5, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == {oldest, middle} and len(batch.keys) == 6
    assert newest in listed(pid)


def test_sample_blocks_until_enough_groups_then_returns(pid):
    put_group(pid, "finished")
    rb = make()
    consumer = Background(lambda: rb.sample(global_steps=0, partition_id=pid, batch_size=2))
    consumer.start()
    time.sleep(0.2)
    assert consumer.is_alive(), "sample returned before two groups were ready"
    put_group(pid, "finished")
    batch, metrics = consumer.outcome()
    assert len(uids_of(batch.keys)) == 2
    assert metrics["validation/pyfast_buffer/polls"] > 1


def test_sequential_samples_drain_overproduction_without_repeats(pid):
    uids = {put_group(pid, "finished", sessions=2)[0] for _ in range(5)}
    rb, seen = make(), set()
    for size in (2, 2, 1):
        batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=size)
        got = uids_of(batch.keys)
        assert len(got) == size and not got & seen
        seen |= got
    assert seen == uids


# ---- drop ------------------------------------------------------------------------------------------
def test_drop_removes_stale_groups_before_selection_so_fresh_ones_fill_the_batch(pid):
    # verl issue #6975: verl selects first and drops afterwards, returning a short batch.
    stale, stale_keys = put_group(pid, "finished", global_steps=0, sessions=2)
    fresh = {put_group(pid, "finished", global_steps=g)[0] for g in (4, 5)}  # 4 is on the boundary: kept
    batch, metrics = make(threshold=2).sample(global_steps=5, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == fresh
    remaining = listed(pid)
    assert stale not in remaining and not set(stale_keys) & set(remaining)
    assert metrics["validation/off_policy/dropped_samples"] == 2  # trajectories, as verl counts them
    assert metrics["validation/off_policy/dropped_samples_staleness/mean"] == 6
    assert metrics["validation/off_policy/dropped_samples_staleness/max"] == 6
    assert metrics["validation/off_policy/dropped_samples_staleness/min"] == 6
    assert metrics["validation/pyfast_buffer/dropped_stale"] == 1  # our ledger counts groups


def test_drop_uses_parameter_sync_step_like_verl(pid):
    # threshold 2, sync 2: stale when (g - s + 1) / 2 > 2, i.e. age > 3.
    put_group(pid, "finished", global_steps=1)
    kept, _ = put_group(pid, "finished", global_steps=2)
    rb = make(threshold=2, sync=2)
    batch, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == {kept}
    assert metrics["validation/off_policy/dropped_samples_staleness/mean"] == 2.5


def test_train_partition_reports_under_training_prefix(tq_running):
    clear_partition("train")
    try:
        put_group("train", "finished", global_steps=0)
        put_group("train", "finished", global_steps=9)
        _, metrics = make(threshold=1).sample(global_steps=9, partition_id="train", batch_size=1)
        assert metrics["training/off_policy/dropped_samples"] == 1
        ledger = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("training/pyfast_buffer/")}
        assert ledger["sampled_total"] == ledger["retired"] + ledger["dropped_stale"] + ledger["evicted"] + ledger["buffer_left"]
    finally:
        clear_partition("train")


def test_timeout_under_drop_names_the_in_flight_prompts(pid):
    put_group(pid, "finished")
    waiting = put_group(pid, "running")[0]
    with pytest.raises(TimeoutError, match=f"1 of 2 groups ready.*{waiting}"):
        make(timeout=0.3).sample(global_steps=0, partition_id=pid, batch_size=2)
    put_group(pid, "finished")  # the timed-out call consumed nothing: two are ready now
    batch, _ = make().sample(global_steps=0, partition_id=pid, batch_size=2)
    assert len(uids_of(batch.keys)) == 2


# ---- wait ------------------------------------------------------------------------------------------
def test_wait_blocks_on_a_stale_in_flight_prompt_and_names_it(pid):
    put_group(pid, "finished", global_steps=5)
    put_group(pid, "finished", global_steps=5)
    stale = put_group(pid, "running", global_steps=0)[0]
    with pytest.raises(TimeoutError, match=f"staleness threshold: {stale}"):
        make(strategy="wait", threshold=2, timeout=0.3).sample(global_steps=5, partition_id=pid, batch_size=2)


def test_wait_unblocks_when_the_stale_prompt_finishes_and_keeps_it(pid):
    fresh = {put_group(pid, "finished", global_steps=5)[0] for _ in range(2)}
    stale = put_group(pid, "running", global_steps=0)[0]
    rb = make(strategy="wait", threshold=2)
    consumer = Background(lambda: rb.sample(global_steps=5, partition_id=pid, batch_size=3))
    consumer.start()
    time.sleep(0.2)
    assert consumer.is_alive()
    put_prompt(pid, stale, "finished", 0)
    batch, metrics = consumer.outcome()
    assert uids_of(batch.keys) == fresh | {stale}  # wait never drops
    assert not any("/off_policy/" in k for k in metrics)


# ---- concurrency, bad tags, partitions -------------------------------------------------------------
def test_concurrent_samples_never_share_a_prompt(pid):
    uids = {put_group(pid, "finished", sessions=2)[0] for _ in range(8)}
    rb = make()
    calls = [Background(lambda: rb.sample(global_steps=0, partition_id=pid, batch_size=2)) for _ in range(4)]
    for c in calls:
        c.start()
    got = [uids_of(c.outcome()[0].keys) for c in calls]
    assert all(len(g) == 2 for g in got)
    assert set().union(*got) == uids and sum(map(len, got)) == 8


def test_prompt_without_global_steps_is_a_value_error_naming_it(pid):
    uid = new_uid()
    verl_mod.tq.kv_put(key=uid, partition_id=pid, tag={"is_prompt": True, "status": "finished"})
    with pytest.raises(ValueError, match=f"{pid}.*{uid}.*no 'global_steps'"):
        make().sample(global_steps=0, partition_id=pid, batch_size=1)


def test_unknown_status_is_a_value_error_naming_it(pid):
    uid = put_group(pid, "bogus", sessions=0)[0]
    with pytest.raises(ValueError, match=f"{uid}.*status='bogus'"):
        make().sample(global_steps=0, partition_id=pid, batch_size=1)


def test_a_bad_partition_does_not_break_another(pid):
    bad = new_partition()
    try:
        put_group(bad, "bogus", sessions=0)
        good, _ = put_group(pid, "finished")
        rb = make()
        batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=1)
        assert uids_of(batch.keys) == {good}
        other, _ = put_group(pid, "finished", global_steps=1)
        with pytest.raises(ValueError, match=bad):
            rb._sync_metadata_from_transfer_queue()
        assert rb.finished_keys[pid] == {other}  # the good partition was still refreshed
    finally:
        clear_partition(bad)


def test_empty_finished_group_is_failed_and_cleared_not_sampled(pid):
    empty = put_group(pid, "failure", sessions=0)[0]
    full, _ = put_group(pid, "finished")
    rb = make()
    batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == {full} and empty not in listed(pid)
    assert rb.ledger(pid)["failed"] == 1


# ---- newer verl's helpers --------------------------------------------------------------------------
def test_get_sampleable_count_and_wait_for_sampleable(pid):
    put_group(pid, "finished", global_steps=0)
    fresh = {put_group(pid, "finished", global_steps=3)[0] for _ in range(2)}
    rb = make(threshold=1)
    assert rb.get_sampleable_count(3, pid) == 2  # the stale one was dropped first
    ready, metrics = rb.wait_for_sampleable(3, pid, 2)
    assert ready == fresh
    with pytest.raises(TimeoutError):
        make(threshold=1, timeout=0.2).wait_for_sampleable(3, pid, 3)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_batch_size_is_a_value_error(bad):
    with pytest.raises(ValueError, match="batch_size"):
        make().sample(global_steps=0, partition_id="train", batch_size=bad)
