"""The verl sampler's verl 0.9.1 behaviours, verl's own keys and pace, on a real TransferQueue (no verl needed).

verl 0.9.1: ``max_off_policy_threshold: null`` turns staleness control off and the DAPO metric ``reward`` reads
``rm_scores``. verl's keys (``algorithm.filter_groups``, ``trainer.v1.sampler.sync_refill_failed_groups``,
``data.*``) are read from the trainer ``refill_fn`` is bound to; a setting the sampler cannot honour is refused.
pace: ``admit`` (what ``PacedAgentLoopManager`` calls), the ready ring and the gated take, exercised here the way
the manager drives them; the manager itself, inside verl's trainer, is tested in ``test_verl091_pace.py``.
Skipped without the ``verl`` extra (TransferQueue and Ray).
"""

from __future__ import annotations

import pytest
from _verl_helpers import (
    Refiller,
    clear_partition,
    listed,
    new_partition,
    new_uid,
    put_group,
    running_transfer_queue,
    uids_of,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
verl_mod = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")
FastReplayBuffer, VerlConfigError = verl_mod.FastReplayBuffer, verl_mod.VerlConfigError
TRAIN = "train"  # pace admits into verl's training partition


@pytest.fixture(scope="module")
def tq_running():
    with running_transfer_queue() as tq:
        yield tq


@pytest.fixture
def pid(tq_running):
    partition_id = new_partition()
    yield partition_id
    clear_partition(partition_id)


@pytest.fixture
def train(tq_running):
    clear_partition(TRAIN)
    yield TRAIN
    clear_partition(TRAIN)


def make(mode="colocate_async", strategy="drop", threshold=8, kwargs=None, **extra):
    return FastReplayBuffer(
        trainer_mode=mode,
        trainer_config={},
        max_off_policy_threshold=threshold,
        max_off_policy_strategy=strategy,
        sampler_kwargs={"timeout": 30.0, "poll_backoff_max": 0.01, **(kwargs or {})},
        **extra,
    )


# ---- verl 0.9.1 ------------------------------------------------------------------------------------
def test_a_null_threshold_evicts_nothing_stale_and_never_waits(pid):
    for strategy in ("drop", "wait"):
        old, _ = put_group(pid, "finished", global_steps=0, sessions=2)
        put_group(pid, "running", global_steps=0)  # at any threshold, this would hold a wait trainer
        rb = make(strategy=strategy, threshold=None, refill_fn=lambda k: k)
        batch, metrics = rb.sample(global_steps=100, partition_id=pid, batch_size=1)
        assert uids_of(batch.keys) == {old} and metrics == {}
        assert rb.ledger(pid)["evicted"] == 0
        clear_partition(pid)


def test_the_reward_metric_reads_the_canonical_reward_from_rm_scores(pid):
    # verl 0.9.1: filter_groups_metric "reward" sums rm_scores; reward_extra_info is not read for it.
    same, _ = put_group(pid, "finished", 0, sessions=2, rewards=[1.0, 1.0])
    mixed, _ = put_group(pid, "finished", 0, sessions=2, rewards=[0.0, 1.0])
    rb = make(threshold=None, filter_groups_metric="reward", refill_fn=lambda k: k)
    batch, metrics = rb.sample(global_steps=0, partition_id=pid, batch_size=1)
    assert uids_of(batch.keys) == {mixed} and same not in listed(pid)
    assert [v for k, v in metrics.items() if k.endswith("/filter_groups/evicted_samples")] == [1]
    assert metrics["_dapo_filtered_reward_counts"] == {1.0: 1}


# ---- verl's keys, through the trainer refill_fn is bound to ----------------------------------------
class Trainer:
    """What verl's trainer looks like to the sampler: a ``config`` and the bound ``_add_prompts_to_generate``."""

    def __init__(self, mode="sync", **sections):
        self.config = {
            "algorithm": {"filter_groups": {"enable": False, "metric": "reward", "max_inflight_gen_batches": 1}},
            "reward": {"reward_model": {"enable": False, "enable_resource_pool": False}},
            "data": {"train_batch_size": 16, "gen_batch_size": None},
            "trainer": {"v1": {"trainer_mode": mode, "sampler": {"sync_refill_failed_groups": False}, mode: {}}},
            "actor_rollout_ref": {"rollout": {"agent": {}}},
        }
        for dotted, value in sections.items():
            node = self.config
            *path, last = dotted.split("__")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value

    def _add_prompts_to_generate(self, count):
        return count


def built(trainer, strategy="drop", threshold=2, kwargs=None):
    mode = trainer.config["trainer"]["v1"]["trainer_mode"]
    return make(mode, strategy, threshold, kwargs, refill_fn=trainer._add_prompts_to_generate)


def test_dapo_and_refills_come_from_verls_own_keys():
    rb = built(Trainer("sync", algorithm__filter_groups__enable=True, algorithm__filter_groups__metric="acc"))
    assert (rb.filter_groups_metric, rb.train_batch_size, rb.gen_batch_size) == ("acc", 16, 1)
    rb = built(Trainer("sync", trainer__v1__sampler__sync_refill_failed_groups=True))
    assert rb.sync_refill_failed_groups and rb.gen_batch_size == 1 and rb.filter_groups_metric is None
    rb = built(Trainer("sync", data__gen_batch_size=4))  # no refills: verl's dataloader keeps its batch
    assert rb.gen_batch_size == 4
    rb = built(Trainer("colocate_async", algorithm__filter_groups__enable=True, algorithm__filter_groups__metric="acc"))
    assert rb.filter_groups_metric == "acc" and rb.gen_batch_size == 1
    # async: sampler_kwargs alone still works (verl fetches one prompt at a time for every async trainer)
    assert built(Trainer("colocate_async"), kwargs={"filter_groups_metric": "acc"}).filter_groups_metric == "acc"


@pytest.mark.parametrize(
    "trainer, strategy, threshold, kwargs, match",
    [
        (Trainer("sync"), "drop", 2, {"filter_groups_metric": "acc"}, r"algorithm.filter_groups.enable is false"),
        (
            Trainer("sync", algorithm__filter_groups__enable=True, algorithm__filter_groups__metric="acc"),
            "drop",
            2,
            {"filter_groups_metric": "score"},
            r"filter_groups_metric='score' contradicts algorithm.filter_groups.metric='acc'.*remove",
        ),
        (Trainer("sync"), "drop", 2, {"gen_batch_size": 4}, r"gen_batch_size=4 contradicts data.gen_batch_size"),
        (Trainer("colocate_async"), "pace", 2, {}, r"agent_loop_manager_class=None"),
        (Trainer("colocate_async"), "pace", None, {}, r"max_off_policy_threshold is null"),
        (
            Trainer(
                "colocate_async",
                actor_rollout_ref__rollout__agent__agent_loop_manager_class=(
                    "pyfast_buffer.integrations.verl.PacedAgentLoopManager"
                ),
            ),
            "pace",
            2,
            {"prompts_per_step": 4},
            r"prompts_per_step=4 contradicts data.train_batch_size=16",
        ),
        (
            Trainer("colocate_async", algorithm__filter_groups__enable=True, algorithm__filter_groups__metric=None),
            "drop",
            2,
            {},
            r"algorithm.filter_groups.metric must be set",
        ),
    ],
)
def test_a_setting_the_sampler_cannot_honour_is_refused_naming_the_keys(trainer, strategy, threshold, kwargs, match):
    with pytest.raises(ValueError, match=match):
        built(trainer, strategy, threshold, kwargs)


def test_pace_reads_the_prompts_per_step_from_verls_batch_size():
    manager = "pyfast_buffer.integrations.verl.PacedAgentLoopManager"
    rb = built(
        Trainer("colocate_async", actor_rollout_ref__rollout__agent__agent_loop_manager_class=manager), "pace", 3
    )
    assert rb.paced and (rb.options.prompts_per_step, rb.options.lookahead) == (16, 2)
    assert not built(Trainer("sync", actor_rollout_ref__rollout__agent__agent_loop_manager_class=manager), "pace").paced


# ---- pace: admission, re-stamp, the gated take -------------------------------------------------------
def paced(per_step=2, threshold=2, timeout=30.0, refill_fn=None, lookahead=None):
    kwargs = {"prompts_per_step": per_step, "timeout": timeout}
    if lookahead is not None:
        kwargs["lookahead"] = lookahead
    return make("colocate_async", "pace", threshold, kwargs, refill_fn=refill_fn)


def submit(count, step):
    """What verl's trainer does before it calls the manager: pending tags stamped with its step."""
    uids = [new_uid() for _ in range(count)]
    import transfer_queue as tq

    tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id=TRAIN, tags=tags)
    return uids


def finish(uids, step, sessions=1, status="finished"):
    for uid in uids:
        put_group(TRAIN, status, global_steps=step, sessions=sessions, uid=uid)


def test_admission_follows_the_pace_rule_and_restamps_the_prompt_tags(train):
    rb = paced(per_step=2, threshold=2)  # max_age 1, lookahead 1: (1 + 1) * 2 = 4 outstanding groups
    first = submit(6, step=0)
    assert rb.admit(first, 3) == 4  # re-stamped with the trainer's step now, not the submit step
    assert {listed(TRAIN)[u]["global_steps"] for u in first[:4]} == {3} and listed(TRAIN)[first[4]]["global_steps"] == 0
    assert rb.ledger(TRAIN)["awaiting_admission"] == 2
    assert rb.admit(first[4:], 3) == 0  # the window is full
    finish(first[:4], 3)
    batch, _ = rb.sample(global_steps=3, partition_id=TRAIN, batch_size=2)
    assert uids_of(batch.keys) <= set(first[:4]) and len(uids_of(batch.keys)) == 2
    # The take made room, but not for prompts stamped 3: step 4 takes the two ready ones, and a prompt stamped 3
    # must be trained by step 4. Stamped 4 (the trainer's next step), both fit.
    assert rb.admit(first[4:], 3) == 0 and rb.admit(first[4:], 4) == 2


def test_a_prompt_that_runs_without_admission_names_the_manager_key(train):
    rb = paced()
    (uid,) = submit(1, step=0)
    put_group(TRAIN, "running", global_steps=0, uid=uid, sessions=0)
    with pytest.raises(RuntimeError, match=r"never admitted.*agent_loop_manager_class=.*PacedAgentLoopManager"):
        rb.sample(global_steps=0, partition_id=TRAIN, batch_size=1)


def test_the_take_waits_for_an_admitted_prompt_that_would_pass_max_age(train):
    rb = paced(per_step=1, threshold=2, timeout=0.5)  # max_age 1
    late, fresh = submit(1, 0), submit(1, 0)
    assert rb.admit(late, 0) == 1 and rb.admit(fresh, 1) == 1
    finish(fresh, 1)
    # At step 1, training the step-1 group would leave the step-0 prompt to be trained at step 2: too old.
    with pytest.raises(TimeoutError, match=r"pace: .*in-flight prompt\(s\) stamped <= 0 .*would pass max_age=1"):
        rb.sample(global_steps=1, partition_id=TRAIN, batch_size=1)
    finish(late, 0)
    batch, _ = rb.sample(global_steps=1, partition_id=TRAIN, batch_size=1)
    assert uids_of(batch.keys) == set(late)  # the stalest first
    assert rb.ledger(TRAIN)["core_trained_over_age"] == 0


def test_groups_that_bypassed_admission_are_admitted_by_the_rule_or_evicted_and_refilled(train):
    refills = []
    rb = paced(per_step=1, threshold=2, refill_fn=lambda k: refills.append(k) or k)  # window 2
    restored = [put_group(TRAIN, "finished", global_steps=5)[0] for _ in range(3)]  # e.g. a restored checkpoint
    batch, metrics = rb.sample(global_steps=5, partition_id=TRAIN, batch_size=1)
    led = rb.ledger(TRAIN)
    assert led["admitted"] == 2 and led["evicted_unadmitted"] == 1 and refills == [1]
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert uids_of(batch.keys) <= set(restored)


def test_groups_restored_under_a_smaller_threshold_are_evicted_not_trained_past_it(train):
    # Issue 59, item 3: a checkpoint of threshold 3 resumed under threshold 2 (max_age 1) at step 7: its groups
    # stamped 5 were admitted at their stamp and trained at step 7 (trained_over_age 5).
    refill = Refiller(TRAIN, 7)
    rb = paced(per_step=2, threshold=2, refill_fn=refill)
    restored = [put_group(TRAIN, "finished", global_steps=5)[0] for _ in range(3)]
    batch, _ = rb.sample(global_steps=7, partition_id=TRAIN, batch_size=2)
    led = rb.ledger(TRAIN)
    assert led["evicted_unadmitted"] == 3 and sum(refill.calls) == 3
    assert uids_of(batch.keys) <= set(refill.uids) and not uids_of(batch.keys) & set(restored)
    assert led["core_trained_over_age"] == 0


class ManagedLoop:
    """A trainer, a PacedAgentLoopManager and a rollout, by hand: held prompts are admitted in order, an
    admitted prompt ends ``latency`` steps later (finished, or failed), and whenever the sampler would wait its
    poll hook ends the admitted prompt due first (a straggler finishing) and lets the manager release."""

    def __init__(self, per_step, threshold, latencies, failures):
        self.latencies, self.failures = latencies, failures
        self.held: list = []
        self.running: dict = {}  # uid -> (due step, failed, stamp)
        self.started = 0
        self.step = 0
        self.waits = 0
        loop = self

        class Sampler(FastReplayBuffer):
            def _pause(self, partition_id, backoff, deadline):
                loop.waits += 1
                loop.end(min(loop.running, key=lambda u: loop.running[u][0]))
                loop.release()
                return backoff

        self.rb = Sampler(
            "colocate_async",
            {},
            threshold,
            "pace",
            {"prompts_per_step": per_step, "timeout": 30.0},
            refill_fn=self.refill,
        )

    def refill(self, count):
        self.held.extend(submit(count, self.step))
        self.release()
        return count

    def release(self):
        admitted = self.held[: self.rb.admit(self.held, self.step)]
        del self.held[: len(admitted)]
        for uid in admitted:
            i = self.started
            self.started += 1
            self.running[uid] = (self.step + self.latencies[i % len(self.latencies)], i in self.failures, self.step)

    def end(self, uid):
        _, failed, stamp = self.running.pop(uid)
        finish([uid], stamp, status="failure" if failed else "finished")

    def end_due(self):
        for uid in [u for u, (due, _, _) in self.running.items() if due <= self.step]:
            self.end(uid)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    latencies=st.lists(st.integers(0, 3), min_size=8, max_size=24),
    failures=st.sets(st.integers(0, 40), max_size=5),
    threshold=st.integers(1, 3),
)
def test_paced_in_a_trainer_loop_nothing_is_dropped_or_trained_past_max_age(train, latencies, failures, threshold):
    clear_partition(TRAIN)
    per_step, steps = 2, 10
    loop = ManagedLoop(per_step, threshold, latencies, failures)
    for step in range(steps):
        loop.step = step
        loop.held.extend(submit(per_step, step))  # verl's prepare_step, through the manager
        loop.release()
        loop.end_due()
        batch, _ = loop.rb.sample(global_steps=step, partition_id=TRAIN, batch_size=per_step)
        assert len(uids_of(batch.keys)) == per_step
        assert all(step - tag["global_steps"] <= threshold - 1 for tag in batch.tags), (step, batch.tags)
        loop.release()
    led = loop.rb.ledger(TRAIN)
    event(f"trainer waited on a straggler: {loop.waits > 0}; failures evicted: {led['evicted_failure'] > 0}")
    assert led["evicted_stale"] == 0 and led["core_trained_over_age"] == 0 and led["taken"] == steps * per_step
    assert led["seen"] == led["taken"] + led["evicted"] + led["vanished"] + led["held"], led
