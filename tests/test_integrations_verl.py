"""FastReplayBuffer against a real TransferQueue (no mock), on the behaviours verl's own ReplayBuffer
tests check, plus the flaws it fixes. Skipped without the ``verl`` extra."""

from __future__ import annotations

import importlib.util
import logging
import threading
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


def test_sample_blocks_until_enough_groups_then_returns(pid, monkeypatch):
    put_group(pid, "finished")
    rb = make()
    listed_once = threading.Event()
    real_list = verl_mod.tq.kv_list

    def kv_list(*args, **kwargs):
        out = real_list(*args, **kwargs)
        listed_once.set()
        return out

    monkeypatch.setattr(verl_mod.tq, "kv_list", kv_list)
    consumer = Background(lambda: rb.sample(global_steps=0, partition_id=pid, batch_size=2))
    consumer.start()
    assert listed_once.wait(30)
    with rb._mirror(pid).poll_lock:  # the consumer has seen one ready group and not returned
        assert consumer.is_alive(), "sample returned before two groups were ready"
        assert rb._mirror(pid).sampleable(0) and rb.ledger(pid)["taken"] == 0
    put_group(pid, "finished")
    batch, metrics = consumer.outcome()
    assert len(uids_of(batch.keys)) == 2


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
    # 4 samplers while a writer adds groups (running, then finished): no uid or key is served twice.
    rb, n_groups, n_calls = make(), 24, 4
    writer_uids = []

    def write():
        for i in range(n_groups):
            uid, keys = put_group(pid, "running", sessions=2, global_steps=i % 3)
            put_prompt(pid, uid, "finished", i % 3)
            writer_uids.append(uid)

    writer = Background(write)
    calls = [Background(lambda: [rb.sample(global_steps=3, partition_id=pid, batch_size=2) for _ in range(3)])
             for _ in range(n_calls)]
    writer.start()
    for c in calls:
        c.start()
    writer.outcome(60)
    batches = [b for c in calls for b, _ in c.outcome(60)]
    keys = [k for b in batches for k in b.keys]
    uids = [u for b in batches for u in uids_of(b.keys)]
    assert len(keys) == len(set(keys)) == 2 * n_groups
    assert len(uids) == len(set(uids)) == n_groups and set(uids) == set(writer_uids)
    ledger = rb.ledger(pid)
    assert ledger["taken"] == n_groups and ledger["failed"] == 0 and ledger["dispatched"] == n_groups


def test_an_older_listing_never_undoes_a_newer_one(pid, monkeypatch):
    # Thread A lists (the group X is there) and is delayed; meanwhile B takes X, X is cleared and
    # another poll forgets it. Applied late, A's answer used to resurrect X and serve it twice.
    x, _ = put_group(pid, "finished")
    rb = make(timeout=1.0)
    real_list = verl_mod.tq.kv_list
    a_listed, b_done = threading.Event(), threading.Event()

    def kv_list(*args, **kwargs):
        out = real_list(*args, **kwargs)
        if threading.current_thread() is a_thread and not a_listed.is_set():
            a_listed.set()
            b_done.wait(3)  # without the poll lock B finishes meanwhile; with it, B waits for A
        return out

    monkeypatch.setattr(verl_mod.tq, "kv_list", kv_list)
    a_thread = Background(lambda: rb.get_sampleable_count(0, pid))
    a_thread.start()
    assert a_listed.wait(30)

    def b():
        batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=1)
        verl_mod.tq.kv_clear(keys=list(batch.keys), partition_id=pid)  # the trainer clears what it trained on
        rb.get_sampleable_count(0, pid)
        return batch

    b_thread = Background(b)
    b_thread.start()
    b_thread.join(5)
    b_done.set()
    a_thread.outcome()
    assert uids_of(b_thread.outcome().keys) == {x}
    with pytest.raises(TimeoutError):
        rb.sample(global_steps=0, partition_id=pid, batch_size=1)  # X is not served again
    assert rb.ledger(pid)["taken"] == 1


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


def test_empty_terminal_group_takes_a_batch_slot_like_verl(pid):
    # verl's _validate samples batch_size = number of prompts submitted: a prompt whose sessions all
    # failed (no trajectory) must still count, or the call hangs until the timeout.
    full = {put_group(pid, "finished", sessions=2)[0] for _ in range(2)}
    empty = put_group(pid, "failure", sessions=0)[0]
    rb = make(timeout=5.0)
    batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=3)
    assert uids_of(batch.keys) == full and len(batch.keys) == 4  # the empty group contributes no key
    assert empty not in listed(pid)  # its prompt key is cleared like any sampled prompt
    assert rb.ledger(pid)["taken"] == 3 and rb.ledger(pid)["failed"] == 0


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


# ---- order across refreshes -------------------------------------------------------------------------
def test_oldest_first_holds_across_refreshes(pid):
    # NEW (step 5) is finished and seen first; OLD (step 1) finishes one refresh later: verl serves OLD first.
    old = put_group(pid, "running", global_steps=1, sessions=0)[0]
    new, _ = put_group(pid, "finished", global_steps=5)
    rb = make()
    assert rb.get_sampleable_count(5, pid) == 1
    old_keys = put_group(pid, "finished", global_steps=1, uid=old)[1]
    rb._sync_metadata_from_transfer_queue(pid)
    assert rb._mirror(pid).sampleable(5) == [old, new]  # what the views report is the order take uses
    batch, _ = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert batch.keys == old_keys
    batch, _ = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == {new}


# ---- kv_clear failures -------------------------------------------------------------------------------
def test_failed_kv_clear_still_returns_the_batch_and_logs(pid, monkeypatch, caplog):
    put_group(pid, "finished", global_steps=0)  # stale at step 5 under threshold 1: dropped
    fresh, fresh_keys = put_group(pid, "finished", global_steps=5)
    calls = []

    def kv_clear(*args, **kwargs):
        calls.append(kwargs)
        raise RuntimeError("controller unreachable")

    monkeypatch.setattr(verl_mod.tq, "kv_clear", kv_clear)
    rb = make(threshold=1)
    with caplog.at_level(logging.ERROR, logger="pyfast_buffer"):
        batch, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert batch.keys == fresh_keys and metrics["validation/off_policy/dropped_samples"] == 1
    assert len(calls) == 4  # dropped keys and the sampled prompt key, each tried twice
    assert sum("kv_clear" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR) == 2
    monkeypatch.undo()
    rb.timeout = 0.3
    with pytest.raises(TimeoutError):  # the uncleared keys are not served again
        rb.sample(global_steps=5, partition_id=pid, batch_size=1)


# ---- _drop_max_off_policy_samples --------------------------------------------------------------------
def test_drop_max_off_policy_samples_without_a_batch_drops_stale_ready_groups(pid):
    stale, stale_keys = put_group(pid, "finished", global_steps=0, sessions=2)
    fresh, _ = put_group(pid, "finished", global_steps=4)
    rb = make(threshold=2)
    rb._sync_metadata_from_transfer_queue(pid)
    out, metrics = rb._drop_max_off_policy_samples(5, pid)
    assert out is None and metrics["validation/off_policy/dropped_samples"] == 2
    remaining = listed(pid)
    assert stale not in remaining and not set(stale_keys) & set(remaining) and fresh in remaining
    assert rb.ledger(pid)["dropped_stale"] == 1 and rb._mirror(pid).sampleable(5) == [fresh]


def test_drop_max_off_policy_samples_filters_a_batch_by_each_tag(pid):
    _, old_keys = put_group(pid, "finished", global_steps=0, sessions=2)
    _, new_keys = put_group(pid, "finished", global_steps=5)
    tags = listed(pid)
    batch = verl_mod.KVBatchMeta(partition_id=pid, keys=old_keys + new_keys, tags=[tags[k] for k in old_keys + new_keys])
    rb = make(threshold=2)
    out, metrics = rb._drop_max_off_policy_samples(5, pid, batch)
    assert out.keys == new_keys and metrics["validation/off_policy/dropped_samples"] == 2
    assert not set(old_keys) & set(listed(pid))
    bad = verl_mod.KVBatchMeta(partition_id=pid, keys=["x_0_0"], tags=[{"is_prompt": False}])
    with pytest.raises(ValueError, match="no 'global_steps'"):
        rb._drop_max_off_policy_samples(5, pid, bad)


# ---- re-issue, vanished prompts, capacity, the wait boundary, a step going back ------------------------
def test_reissued_prompt_is_failed_and_dispatched_at_the_new_step(pid):
    uid = put_group(pid, "running", global_steps=1, sessions=0)[0]
    rb = make()
    rb._sync_metadata_from_transfer_queue(pid)
    put_prompt(pid, uid, "running", 4)  # verl's _reissue_inflight_prompts
    rb._sync_metadata_from_transfer_queue(pid)
    keys = put_group(pid, "finished", global_steps=4, uid=uid)[1]
    batch, metrics = rb.sample(global_steps=4, partition_id=pid, batch_size=1)
    assert batch.keys == keys and metrics["validation/pyfast_buffer/age_max"] == 0
    ledger = rb.ledger(pid)
    assert (ledger["dispatched"], ledger["failed"], ledger["taken"]) == (2, 1, 1)


def test_vanished_in_flight_prompt_is_failed(pid):
    uid = put_group(pid, "running", sessions=0)[0]
    rb = make()
    rb._sync_metadata_from_transfer_queue(pid)
    verl_mod.tq.kv_clear(keys=[uid], partition_id=pid)
    rb._sync_metadata_from_transfer_queue(pid)
    assert rb.ledger(pid)["failed"] == 1 and rb.ledger(pid)["in_flight"] == 0
    assert rb._mirror(pid).waited_on(0) == []


def test_capacity_full_keeps_the_rest_in_flight_until_room_frees(pid):
    uids = [put_group(pid, "finished", global_steps=g)[0] for g in range(3)]
    rb = make(capacity=2)
    assert rb.get_sampleable_count(2, pid) == 2
    assert rb.ledger(pid)["in_flight"] == 3 and uids[2] in listed(pid)
    seen = []
    for _ in range(3):
        batch, _ = rb.sample(global_steps=2, partition_id=pid, batch_size=1)
        seen += sorted(uids_of(batch.keys))
    assert seen == uids  # oldest first, nothing lost
    assert rb.ledger(pid)["failed"] == 0 and rb.ledger(pid)["evicted"] == 0


def test_wait_blocks_at_age_equal_to_max_age_not_below(pid):
    put_group(pid, "finished", global_steps=0)
    put_group(pid, "finished", global_steps=0)
    put_group(pid, "running", global_steps=0)  # threshold 3: max_age 2 (verl blocks at (g - s + 1) >= 3)
    rb = make(strategy="wait", threshold=3)
    rb._sync_metadata_from_transfer_queue(pid)
    assert rb._has_enough_samples(1, pid, 1)  # the in-flight prompt is at age 1 = max_age - 1: not blocking
    assert not rb._has_enough_samples(2, pid, 1)  # age 2 = max_age: blocks
    batch, _ = rb.sample(global_steps=1, partition_id=pid, batch_size=1)
    assert len(batch.keys) == 1
    with pytest.raises(TimeoutError, match="staleness threshold"):
        make(strategy="wait", threshold=3, timeout=0.3).sample(global_steps=2, partition_id=pid, batch_size=1)


def test_a_step_below_one_already_seen_does_not_crash_sampling(pid):
    # A prompt stamped ahead of the trainer (verl would compute a negative staleness): the step passed
    # to the core is clamped to the partition's clock, so it is served at age 0.
    ahead, keys = put_group(pid, "finished", global_steps=9)
    batch, metrics = make().sample(global_steps=3, partition_id=pid, batch_size=1)
    assert batch.keys == keys and metrics["validation/pyfast_buffer/age_max"] == 0
