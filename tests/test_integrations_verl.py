"""The verl sampler against a real TransferQueue on a local Ray (no mock): verl's semantics as of its
main branch (sync and async buffers, refill, DAPO filtering, failures, validation) and what we add
(timeouts, the ledger, concurrent callers). Skipped without the ``verl`` extra."""

from __future__ import annotations

import importlib.util
import logging
import threading
import time

import pytest
import torch
from _verl_helpers import (
    Background,
    Refiller,
    clear_partition,
    listed,
    new_partition,
    new_uid,
    put_group,
    put_prompt,
    running_transfer_queue,
    uids_of,
)

pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
verl_mod = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")
ReplayBuffer, ReplayBufferAsync, FastReplayBuffer = (
    verl_mod.ReplayBuffer,
    verl_mod.ReplayBufferAsync,
    verl_mod.FastReplayBuffer,
)
COUNTS_KEY = verl_mod.DAPO_FILTERED_REWARD_COUNTS_KEY


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
def make(mode="colocate_async", strategy="drop", threshold=8, timeout=30.0, cls=FastReplayBuffer, kwargs=None, **extra):
    return cls(
        trainer_mode=mode,
        trainer_config={},
        max_off_policy_threshold=threshold,
        max_off_policy_strategy=strategy,
        sampler_kwargs={"timeout": timeout, "poll_backoff_max": 0.01, **(kwargs or {})},
        **extra,
    )


def balanced(rb, partition_id):
    """The ledger's identities, checked on every test that samples."""
    led = rb.ledger(partition_id)
    assert led["seen"] == led["taken"] + led["evicted"] + led["vanished"] + led["held"], led
    assert led["refill_requested"] == led["refill_delivered"] + led["refill_short"] + led["refill_failed"], led
    assert led["core_dispatched"] == led["core_completed"] + led["core_failed"] + led["core_in_flight"], led
    assert led["core_in_flight"] == led["held"] and led["core_taken"] == led["taken"], led
    return led


# ---- construction -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, verl_words",
    [
        ({"threshold": 0}, "Invalid max off policy threshold"),
        ({"strategy": "bogus"}, "Invalid max off policy strategy"),
    ],
)
def test_bad_threshold_or_strategy_is_both_assertion_and_value_error(kwargs, verl_words):
    for caught in (AssertionError, ValueError):
        with pytest.raises(caught, match=verl_words):
            make(**kwargs)


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"filter_groups_metric": "acc"}, "requires refill_fn"),
        ({"sync_refill_failed_groups": True}, "requires refill_fn"),
        (
            {"filter_groups_metric": "acc", "refill_fn": print, "max_inflight_gen_batches": 0, "train_batch_size": 2},
            "max_inflight_gen_batches",
        ),
        ({"sync_refill_failed_groups": True, "refill_fn": print, "gen_batch_size": 2}, "requires gen_batch_size=1"),
        ({"filter_groups_metric": "acc", "refill_fn": print}, "train_batch_size"),
    ],
)
def test_bad_sync_options_are_value_errors(extra, match):
    with pytest.raises(ValueError, match=match):
        make(mode="sync", **extra)


def test_async_accepts_what_only_sync_checks():
    rb = make(sync_refill_failed_groups=True, refill_fn=print, gen_batch_size=2)
    assert not rb.on_policy and rb.gen_batch_size == 2


def test_fast_replay_buffer_picks_verls_class_by_trainer_mode():
    assert make(mode="sync").on_policy and isinstance(make(mode="sync"), ReplayBuffer)
    for mode in ("colocate_async", "separate_async", "anything_else"):
        assert not make(mode=mode).on_policy
    assert make(mode="colocate_async", cls=ReplayBuffer).on_policy  # the class, not the mode, decides for verl's names
    assert not make(mode="sync", cls=ReplayBufferAsync).on_policy


def test_options_are_read_from_sampler_kwargs_as_verl_passes_custom_samplers_none():
    rb = make(
        mode="sync",
        refill_fn=print,
        kwargs={
            "filter_groups_metric": "acc",
            "train_batch_size": 4,
            "max_inflight_gen_batches": 3,
            "sync_refill_failed_groups": True,
            "capacity": 128,
            "ledger_metrics": True,
        },
    )
    assert (
        rb.filter_groups_metric,
        rb.train_batch_size,
        rb.gen_batch_size,
        rb.max_inflight_gen_batches,
        rb.sync_refill_failed_groups,
        rb.options.capacity,
        rb.options.ledger_metrics,
    ) == ("acc", 4, 1, 3, True, 128, True)


def test_poll_interval_keeps_verls_value_and_our_backoff_has_its_own_name():
    assert FastReplayBuffer("separate_async", {}, 8, "drop", {}).poll_interval == 2.0
    rb = make(poll_interval=0.5)
    assert rb.poll_interval == 0.5 and rb.poll_backoff_max == 0.01
    with pytest.raises(ValueError, match="poll_backoff_max"):
        make(kwargs={"poll_interval": 0.01})
    with pytest.raises(ValueError, match=r"sampler_kwargs\.poll_backoff_max"):
        make(kwargs={"poll_backoff_max": 5.0})


def test_accepts_omegaconf_and_loads_from_its_file_path_like_verl():
    omegaconf = pytest.importorskip("omegaconf")
    spec = importlib.util.spec_from_file_location("custom_sampler_module", verl_mod.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rb = module.FastReplayBuffer(
        trainer_mode="separate_async",
        trainer_config=omegaconf.OmegaConf.create({}),
        max_off_policy_threshold=3,
        max_off_policy_strategy="wait",
        sampler_kwargs=omegaconf.OmegaConf.create({"capacity": 128}),
        refill_fn=print,
    )
    assert rb.timeout == 600.0 and rb.refill_fn is print and rb.max_off_policy_threshold == 3


# ---- metadata and selection -------------------------------------------------------------------------
def test_listing_fills_verls_attributes(pid):
    pending, _ = put_group(pid, "pending", sessions=0, global_steps=4)
    running, running_keys = put_group(pid, "running", sessions=1, global_steps=5)
    finished, finished_keys = put_group(pid, "finished", sessions=2, global_steps=6)
    failure, failure_keys = put_group(pid, "failure", sessions=1, global_steps=7)
    rb = make()
    rb._sync_metadata_from_transfer_queue(pid)
    assert (rb.pending_keys[pid], rb.running_keys[pid], rb.finished_keys[pid], rb.failure_keys[pid]) == (
        {pending},
        {running},
        {finished},
        {failure},
    )
    assert rb.prompt_global_steps[pid] == {pending: 4, running: 5, finished: 6, failure: 7}
    assert set(rb.partitions[pid]) == set(running_keys + finished_keys + failure_keys)
    put_prompt(pid, running, "finished", 5)  # a status change is picked up by the next listing
    rb._sync_metadata_from_transfer_queue(pid)
    assert rb.finished_keys[pid] == {finished, running} and not rb.running_keys[pid]


def test_unknown_status_or_missing_step_is_a_value_error_naming_the_prompt(pid):
    rb = make()
    uid, _ = put_group(pid, "bogus", sessions=0)
    with pytest.raises(ValueError, match=f"Unknown status 'bogus' of prompt '{uid}'"):
        rb._sync_metadata_from_transfer_queue(pid)
    clear_partition(pid)
    tq_mod = pytest.importorskip("transfer_queue")
    tq_mod.kv_put(key=uid, partition_id=pid, tag={"is_prompt": True, "status": "finished"})
    with pytest.raises(ValueError, match="has no 'global_steps'"):
        rb._sync_metadata_from_transfer_queue(pid)


@pytest.mark.parametrize("kwargs", [{"timout": 5}, {"capacity": 64, "lookahed": 1}, {"ledger-metrics": True}])
def test_a_sampler_kwargs_key_the_sampler_does_not_read_is_refused_naming_it(kwargs):
    from pyfast_buffer.integrations.verl import VerlConfigError

    with pytest.raises(VerlConfigError, match="sampler_kwargs has keys the sampler does not read") as info:
        make(kwargs=kwargs)
    assert all(repr(k) in str(info.value) for k in kwargs if k != "capacity")
    with pytest.raises(TypeError, match="must be a mapping"):
        FastReplayBuffer(
            trainer_mode="colocate_async",
            trainer_config={},
            max_off_policy_threshold=8,
            max_off_policy_strategy="drop",
            sampler_kwargs=["timeout", 5],
        )


def test_a_trajectory_row_whose_tag_kept_a_cleared_prompts_is_prompt_is_read_as_a_trajectory(pid):
    # TransferQueue merged a new row's tag into what its reused index still held: verl's agent loop writes
    # status="success" on trajectory rows only, so the leftover is_prompt must not make the row a prompt.
    rb = make()
    uid, keys = put_group(pid, "finished", sessions=2, global_steps=3)
    tq_mod = pytest.importorskip("transfer_queue")
    tq_mod.kv_put(key=keys[0], partition_id=pid, tag={"is_prompt": True, "status": "success", "global_steps": 3})
    rb._sync_metadata_from_transfer_queue(pid)
    assert rb.finished_keys[pid] == {uid} and set(rb.partitions[pid]) == set(keys)
    assert uid in rb.prompt_global_steps[pid] and keys[0] not in rb.prompt_global_steps[pid]


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_sample_takes_the_oldest_whole_groups_and_clears_their_prompt_keys(pid, mode):
    newest, _ = put_group(pid, "finished", global_steps=5, sessions=2)
    oldest, oldest_keys = put_group(pid, "finished", global_steps=1, sessions=2)
    middle, middle_keys = put_group(pid, "finished", global_steps=2, sessions=2)
    running, _ = put_group(pid, "running", global_steps=0)
    rb = make(mode=mode)
    batch, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=2)
    assert batch.partition_id == pid and set(batch.keys) == set(oldest_keys + middle_keys)
    assert len(batch.tags) == 4 and all(t["global_steps"] in (1, 2) for t in batch.tags)
    assert metrics == {}  # verl's keys only, and nothing was evicted
    left = listed(pid)
    assert oldest not in left and middle not in left and newest in left and running in left
    assert set(oldest_keys) <= set(left)  # trajectories stay for the trainer to read, as in verl
    led = balanced(rb, pid)
    assert (led["taken"], led["held"]) == (2, 2)


def test_sample_blocks_until_enough_then_returns(pid):
    put_group(pid, "finished")
    rb = make()
    call = Background(lambda: rb.sample(global_steps=0, partition_id=pid, batch_size=2))
    call.start()
    time.sleep(0.3)
    assert call.is_alive()
    put_group(pid, "finished")
    batch, _ = call.outcome()
    assert len(uids_of(batch.keys)) == 2


def test_sequential_samples_never_repeat_a_prompt(pid):
    uids = {put_group(pid, "finished", sessions=2)[0] for _ in range(5)}
    rb = make()
    seen: set = set()
    for size in (2, 2, 1):
        got = uids_of(rb.sample(global_steps=0, partition_id=pid, batch_size=size)[0].keys)
        assert len(got) == size and not got & seen
        seen |= got
    assert seen == uids
    balanced(rb, pid)


# ---- sync (on-policy) --------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_sync_ignores_the_off_policy_strategy(pid, strategy):
    stale, _ = put_group(pid, "finished", global_steps=0)
    fresh, _ = put_group(pid, "finished", global_steps=5)
    put_group(pid, "running", global_steps=0)  # would block async wait
    rb = make(mode="sync", strategy=strategy, threshold=1)
    batch, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == {stale, fresh} and metrics == {}


def test_sync_keeps_failed_groups_sampleable_for_padding(pid):
    finished, _ = put_group(pid, "finished")
    failed_empty, _ = put_group(pid, "failure", sessions=0)
    rb = make(mode="sync")
    batch, metrics = rb.sample(global_steps=0, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == {finished} and metrics == {}
    assert failed_empty not in listed(pid)  # it took its batch slot


def test_sync_batch_of_only_empty_failures_is_verls_runtime_error_and_changes_nothing(pid):
    uids = {put_group(pid, "failure", sessions=0)[0] for _ in range(2)}
    rb = make(mode="sync")
    with pytest.raises(RuntimeError, match="sync_refill_failed_groups"):
        rb.sample(global_steps=0, partition_id=pid, batch_size=2)
    assert uids <= set(listed(pid)) and rb.failure_keys[pid] == uids


def test_sync_refill_failed_groups_replaces_empty_failures_only(pid):
    finished, _ = put_group(pid, "finished")
    kept_failure, _ = put_group(pid, "failure", sessions=1)
    empty, _ = put_group(pid, "failure", sessions=0)
    refill = Refiller(pid, global_steps=1)
    rb = make(mode="sync", refill_fn=refill, sync_refill_failed_groups=True)
    batch, metrics = rb.sample(global_steps=1, partition_id=pid, batch_size=3)
    assert uids_of(batch.keys) == {finished, kept_failure, refill.uids[0]} and empty not in listed(pid)
    assert refill.calls == [1] and metrics == {"validation/rollout_failure/evicted_samples": 1}
    led = balanced(rb, pid)
    assert (led["evicted_failure"], led["refill_requested"]) == (1, 1)


def test_sync_dapo_refills_two_per_filtered_group_and_discards_the_surplus(pid):
    same, _ = put_group(pid, "finished", sessions=2, rewards=[0.0, 0.0])
    mixed, _ = put_group(pid, "finished", sessions=2, rewards=[0.0, 1.0])
    refill = Refiller(pid, global_steps=1, sessions=2, rewards=[1.0, 0.0])
    rb = make(mode="sync", refill_fn=refill, filter_groups_metric="acc", train_batch_size=2)
    batch, metrics = rb.sample(global_steps=1, partition_id=pid, batch_size=2)
    got = uids_of(batch.keys)
    assert mixed in got and same not in got and refill.calls == [2] and len(got & set(refill.uids)) == 1
    assert metrics == {
        "validation/filter_groups/evicted_samples": 1,
        COUNTS_KEY: {0.0: 1},
        "validation/filter_groups/discarded_surplus_samples": 1,
    }
    surplus = (set(refill.uids) - got).pop()
    assert surplus not in listed(pid) and f"{surplus}_0_0" not in listed(pid)
    led = balanced(rb, pid)
    assert (led["discarded_surplus"], led["evicted"], led["held"]) == (1, 2, 0)


def test_sync_dapo_dispatches_credit_only_into_free_inflight_slots(pid):
    put_group(pid, "finished", sessions=2, rewards=[1.0, 1.0])
    slow, _ = put_group(pid, "running", sessions=2, rewards=[0.0, 1.0])
    refill = Refiller(pid, global_steps=1, sessions=2, rewards=[0.0, 1.0])
    rb = make(mode="sync", refill_fn=refill, filter_groups_metric="acc", train_batch_size=2)
    call = Background(lambda: rb.sample(global_steps=1, partition_id=pid, batch_size=2))
    call.start()
    deadline = time.monotonic() + 20
    while len(refill.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert refill.calls == [1, 1] and call.is_alive()  # one slot of 2 is held by the slow prompt
    put_prompt(pid, slow, "finished", 0)
    batch, metrics = call.outcome()
    assert len(uids_of(batch.keys)) == 2 and metrics["validation/filter_groups/discarded_surplus_samples"] == 1


# ---- async: drop, wait, failures, DAPO ---------------------------------------------------------------
def test_drop_evicts_stale_groups_refills_exactly_and_reports_verls_metrics(pid):
    stale, stale_keys = put_group(pid, "finished", global_steps=0)
    boundary, _ = put_group(pid, "finished", global_steps=4)  # 5 - 4 + 1 = 2, not > 2: kept
    fresh, _ = put_group(pid, "finished", global_steps=5)
    put_group(pid, "running", global_steps=0)
    refill = Refiller(pid, global_steps=5)
    rb = make(threshold=2, refill_fn=refill)
    batch, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=3)
    assert uids_of(batch.keys) == {boundary, fresh, refill.uids[0]} and refill.calls == [1]
    assert metrics == {
        "validation/off_policy/evicted_samples": 1,
        "validation/off_policy/evicted_samples_staleness/mean": 6.0,
        "validation/off_policy/evicted_samples_staleness/max": 6.0,
        "validation/off_policy/evicted_samples_staleness/min": 6.0,
    }
    assert stale not in listed(pid) and stale_keys[0] not in listed(pid)
    led = balanced(rb, pid)
    assert led["evicted"] == led["evicted_stale"] == led["refill_requested"] == 1


def test_drop_metrics_accumulate_over_polls_with_a_weighted_mean(tq_running):
    partition = "train"
    clear_partition(partition)
    try:
        put_group(partition, "finished", global_steps=0)
        late, _ = put_group(partition, "running", global_steps=2)
        late2, _ = put_group(partition, "running", global_steps=2)
        refills: list[int] = []

        def refill(count):  # the first refill lets the two later stale groups finish
            refills.append(count)
            if len(refills) == 1:
                put_prompt(partition, late, "finished", 2)
                put_prompt(partition, late2, "finished", 2)
            else:
                for _ in range(count):
                    put_group(partition, "finished", global_steps=10)
            return count

        rb = make(threshold=1, refill_fn=refill)
        _, metrics = rb.sample(global_steps=10, partition_id=partition, batch_size=2)
        assert refills == [1, 2]
        assert metrics["training/off_policy/evicted_samples"] == 3
        assert metrics["training/off_policy/evicted_samples_staleness/mean"] == pytest.approx((11 + 9 + 9) / 3)
        assert metrics["training/off_policy/evicted_samples_staleness/max"] == 11.0
        assert metrics["training/off_policy/evicted_samples_staleness/min"] == 9.0
    finally:
        clear_partition(partition)


def test_wait_blocks_while_an_in_flight_prompt_reaches_the_threshold(pid):
    fresh = [put_group(pid, "finished", global_steps=5)[0] for _ in range(2)]
    at_threshold, _ = put_group(pid, "running", global_steps=4)  # 5 - 4 + 1 = 2 >= 2
    rb = make(strategy="wait", threshold=2)
    call = Background(lambda: rb.sample(global_steps=5, partition_id=pid, batch_size=2))
    call.start()
    time.sleep(0.3)
    assert call.is_alive()
    put_prompt(pid, at_threshold, "finished", 4)
    batch, metrics = call.outcome()
    assert len(uids_of(batch.keys)) == 2 and metrics == {}
    assert uids_of(batch.keys) == {at_threshold, fresh[0]} or uids_of(batch.keys) <= {at_threshold, *fresh}


def test_wait_is_dropless_and_does_not_block_below_the_threshold(pid):
    stale, _ = put_group(pid, "finished", global_steps=0)
    put_group(pid, "running", global_steps=99)  # 100 - 99 + 1 = 2 < 3
    rb = make(strategy="wait", threshold=3)
    batch, metrics = rb.sample(global_steps=100, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == {stale} and metrics == {}


def test_wait_timeout_names_the_prompt_at_the_threshold(pid):
    put_group(pid, "finished", global_steps=5)
    blocker, _ = put_group(pid, "running", global_steps=0)
    rb = make(strategy="wait", threshold=2, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"staleness threshold under wait.*{blocker}"):
        rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert time.monotonic() - started < 10  # bounded by the timeout, not by verl's forever


def test_async_failures_are_evicted_and_refilled(pid):
    finished, _ = put_group(pid, "finished")
    failed, _ = put_group(pid, "failure")
    refill = Refiller(pid, global_steps=1)
    rb = make(refill_fn=refill)
    batch, metrics = rb.sample(global_steps=1, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == {finished, refill.uids[0]} and failed not in listed(pid)
    assert refill.calls == [1] and metrics == {"validation/rollout_failure/evicted_samples": 1}


def test_async_dapo_evicts_uniform_groups_and_counts_their_values(pid):
    zero_a, _ = put_group(pid, "finished", sessions=2, rewards=[0.0, 0.0])
    put_group(pid, "finished", sessions=2, rewards=[0.0, 0.0])
    put_group(pid, "finished", sessions=2, rewards=[1.0, 1.0])
    single, _ = put_group(pid, "finished", sessions=1, rewards=[1.0])  # one trajectory carries no variance claim
    mixed, _ = put_group(pid, "finished", sessions=2, rewards=[0.0, 1.0])
    refill = Refiller(pid, global_steps=1, sessions=2, rewards=[0.0, 1.0])
    rb = make(refill_fn=refill, filter_groups_metric="acc")
    batch, metrics = rb.sample(global_steps=1, partition_id=pid, batch_size=2)
    assert uids_of(batch.keys) == {single, mixed} and refill.calls == [3]
    assert metrics == {"validation/filter_groups/evicted_samples": 3, COUNTS_KEY: {0.0: 2, 1.0: 1}}
    assert zero_a not in listed(pid)
    balanced(rb, pid)


def test_dapo_metric_missing_is_verls_runtime_error(pid, tq_running):
    uid = new_uid()
    for s in range(2):  # the reward function wrote no "acc"
        tq_running.kv_put(
            key=f"{uid}_{s}_0",
            partition_id=pid,
            tag={"is_prompt": False, "global_steps": 0},
            fields={"input_ids": torch.tensor([1]), "extra_fields": {"reward_extra_info": {"f1": 1.0}}},
        )
    put_prompt(pid, uid, "finished", 0)
    rb = make(refill_fn=print, filter_groups_metric="acc", timeout=5)
    with pytest.raises(RuntimeError, match="missing DAPO metric 'acc'"):
        rb.sample(global_steps=0, partition_id=pid, batch_size=1)


def test_overlapping_reasons_evict_and_refill_a_group_once(pid):
    put_group(pid, "finished", sessions=2, global_steps=0, rewards=[1.0, 1.0])  # stale and uniform
    refill = Refiller(pid, global_steps=5, sessions=2, rewards=[0.0, 1.0])
    rb = make(threshold=1, refill_fn=refill, filter_groups_metric="acc")
    _, metrics = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert refill.calls == [1]
    assert metrics["validation/off_policy/evicted_samples"] == metrics["validation/filter_groups/evicted_samples"] == 1
    led = balanced(rb, pid)
    assert led["evicted"] == 1 and led["evicted_stale"] == led["evicted_filtered"] == 1


def test_validation_partition_never_evicts(tq_running):
    clear_partition("val")
    try:
        stale_uniform, _ = put_group("val", "finished", sessions=2, global_steps=0, rewards=[1.0, 1.0])
        failed, _ = put_group("val", "failure", global_steps=0)
        refill = Refiller("val", global_steps=5)
        rb = make(threshold=1, refill_fn=refill, filter_groups_metric="acc")
        assert rb.get_sampleable_count(5, "val") == 2
        batch, metrics = rb.sample(global_steps=5, partition_id="val", batch_size=2)
        assert uids_of(batch.keys) == {stale_uniform, failed} and refill.calls == [] and metrics == {}
    finally:
        clear_partition("val")


# ---- get_sampleable_count / wait_for_sampleable -------------------------------------------------------
def test_sampleable_count_excludes_evictable_groups_and_consumes_nothing(pid):
    fresh, _ = put_group(pid, "finished", global_steps=5)
    stale, _ = put_group(pid, "finished", global_steps=0)
    put_group(pid, "failure", global_steps=5)
    rb = make(threshold=1)
    assert rb.get_sampleable_count(global_steps=5, partition_id=pid) == 1
    assert {fresh, stale} <= set(listed(pid))


def test_wait_for_sampleable_evicts_refills_and_leaves_the_batch_for_sample(pid):
    put_group(pid, "finished", global_steps=0)
    refill = Refiller(pid, global_steps=5)
    rb = make(threshold=1, refill_fn=refill)
    ready, metrics = rb.wait_for_sampleable(global_steps=5, partition_id=pid, target_count=1)
    assert ready == set(refill.uids) and refill.calls == [1] and metrics["validation/off_policy/evicted_samples"] == 1
    batch, again = rb.sample(global_steps=5, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == set(refill.uids) and again == {}


def test_wait_for_sampleable_blocks_below_the_target_and_times_out(pid):
    put_group(pid, "finished")
    running, _ = put_group(pid, "running")
    rb = make(timeout=0.3)
    with pytest.raises(TimeoutError, match=f"wait_for_sampleable.*{running}@0"):
        rb.wait_for_sampleable(global_steps=0, partition_id=pid, target_count=2)
    rb = make()
    call = Background(lambda: rb.wait_for_sampleable(global_steps=0, partition_id=pid, target_count=2))
    call.start()
    time.sleep(0.3)
    assert call.is_alive()
    put_prompt(pid, running, "finished", 0)
    assert call.outcome()[1] == {}


# ---- refill_fn that fails or falls short ------------------------------------------------------------
def test_refill_fn_that_raises_is_visible_and_booked(pid, caplog):
    put_group(pid, "failure")

    def broken(count):
        raise ConnectionError("dataloader gone")

    rb = make(refill_fn=broken)
    with (
        caplog.at_level(logging.ERROR, logger="pyfast_buffer.verl"),
        pytest.raises(ConnectionError, match="dataloader gone"),
    ):
        rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert "refill_fn(1) raised" in caplog.text
    led = balanced(rb, pid)
    assert (led["evicted"], led["refill_requested"], led["refill_failed"], led["refill_delivered"]) == (1, 1, 1, 0)


def test_refill_fn_that_returns_fewer_is_booked_and_warned(pid, caplog):
    put_group(pid, "failure")
    put_group(pid, "failure")
    put_group(pid, "finished")
    rb = make(refill_fn=lambda count: count - 1, timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="pyfast_buffer.verl"):
        rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert "submitted only 1 prompts" in caplog.text
    led = balanced(rb, pid)
    assert (led["refill_requested"], led["refill_delivered"], led["refill_short"]) == (2, 1, 1)


def test_async_without_refill_fn_books_the_unrefilled(pid):
    put_group(pid, "failure")
    put_group(pid, "finished")
    rb = make()
    rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert balanced(rb, pid)["unrefilled"] == 1


# ---- our additions: ledger output, concurrency, robustness -------------------------------------------
def test_ledger_goes_to_the_log_and_into_metrics_only_when_asked(pid, caplog):
    for _ in range(2):
        put_group(pid, "finished")
    with caplog.at_level(logging.INFO, logger="pyfast_buffer.verl"):
        _, metrics = make().sample(global_steps=0, partition_id=pid, batch_size=1)
    assert metrics == {}
    assert f"partition={pid} step=0 seen=2 taken=1" in caplog.text
    _, metrics = make(kwargs={"ledger_metrics": True}).sample(global_steps=0, partition_id=pid, batch_size=1)
    assert metrics["validation/pyfast_buffer/taken"] == 1 and metrics["validation/pyfast_buffer/held"] == 0


def test_concurrent_samples_never_share_a_prompt(pid):
    uids = {put_group(pid, "finished")[0] for _ in range(40)}
    rb = make()
    results: list = []
    lock = threading.Lock()

    def worker():
        for _ in range(5):
            batch, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=2)
            with lock:
                results.append(uids_of(batch.keys))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    taken = [u for r in results for u in r]
    assert len(taken) == len(set(taken)) == 40 and set(taken) == uids
    balanced(rb, pid)


def test_prompt_cleared_outside_is_counted_as_vanished(pid, tq_running):
    running, _ = put_group(pid, "running")
    rb = make()
    rb._sync_metadata_from_transfer_queue(pid)
    tq_running.kv_clear(keys=[running], partition_id=pid)
    assert rb.get_sampleable_count(0, pid) == 0
    led = balanced(rb, pid)
    assert (led["vanished"], led["held"]) == (1, 0)


def test_failed_kv_clear_still_returns_the_batch_and_never_repeats_it(pid, monkeypatch, caplog, tq_running):
    uids = {put_group(pid, "finished")[0] for _ in range(2)}
    rb = make()
    real = tq_running.kv_clear

    def failing(*args, **kwargs):
        raise ConnectionError("controller busy")

    monkeypatch.setattr(tq_running, "kv_clear", failing)
    with caplog.at_level(logging.ERROR, logger="pyfast_buffer.verl"):
        first, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert "failed twice" in caplog.text
    monkeypatch.setattr(tq_running, "kv_clear", real)
    second, _ = rb.sample(global_steps=0, partition_id=pid, batch_size=1)  # the uncleared key is not served again
    assert uids_of(first.keys) | uids_of(second.keys) == uids


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, 1 << 20])
def test_bad_batch_size_is_a_value_error(bad):
    with pytest.raises(ValueError, match="batch_size="):
        make().sample(global_steps=0, partition_id="p", batch_size=bad)
