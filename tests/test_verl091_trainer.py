"""verl 0.9.1's real trainer (sync, colocate_async, separate_async) builds our sampler from verl's composed
config (``custom_sampler.path=pkg://pyfast_buffer.integrations.verl``) and drives it through its own loop on CPU.

The trainer, its config, its dataloader, ``fit`` and the agent-loop manager are verl's; the engines and the
training stages are fakes (``_verl_cpu_trainer``, ``_verl_fake_rollout``). Each run is 50 steps, with
heavy-tailed generation latencies, a few failed generations and a 0/1 accuracy per trajectory for DAPO. After
every step the sampler's ledger must balance. Needs ``verl==0.9.1`` (the verl stage of ``.ci/run``,
``.ci/verl-stage.sh``); skipped elsewhere.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
pytest.importorskip("transfer_queue", reason="TransferQueue is not installed: pip install '.[verl]'")

import ray
from _verl_cpu_trainer import (
    SAMPLER,
    VERL_OWN_WARNINGS,
    balanced,
    base_overrides,
    clear_transfer_queue,
    compose,
    cpu_trainer_class,
    stop,
    train,
)

from pyfast_buffer.integrations.verl import VerlConfigError

pytestmark = [pytest.mark.filterwarnings(w) for w in VERL_OWN_WARNINGS]

STEPS = 50
BATCH = 8  # data.train_batch_size: prompt groups per trainer step
THRESHOLD = 2  # max_off_policy_threshold: verl evicts at global_steps - step + 1 > 2, i.e. age > 1


@pytest.fixture
def fresh(verl_cpu):
    clear_transfer_queue()
    yield
    clear_transfer_queue()


def check_ledger(trainer) -> None:
    balanced(trainer.replay_buffer.ledger("train"), paced=False)


def ages(record) -> list:
    """Age (trainer step - the prompt's global_steps) of every trajectory trained."""
    return [step - tag["global_steps"] for step, tags in record.trained for tag in tags]


def groups_per_update(record) -> list:
    return [len({tag["__key__"].split("_", 1)[0] for tag in tags}) for _, tags in record.trained]


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_verls_trainer_builds_and_drives_our_sampler_for_fifty_steps(fresh, tmp_path, mode):
    extra = [f"trainer.v1.sampler.max_off_policy_threshold={THRESHOLD}"]
    if mode == "separate_async":  # verl's idle-GPU lending calls get_sampleable_count and wait_for_sampleable
        extra.append("trainer.v1.separate_async.hybrid_rollout.enable_switch=true")
    config = compose(base_overrides(tmp_path, mode, STEPS, batch=BATCH) + SAMPLER + extra)
    slow = {} if mode == "sync" else {"straggler_every": 23, "straggler_s": 0.6}  # a sync step waits for them all
    run = train(config, {"seed": 3, "fail_rate": 0.05, **slow}, check_ledger)
    stop(run)
    rb = run.trainer.replay_buffer
    assert type(rb).__module__ == "pyfast_buffer.integrations.verl._sampler"
    assert type(rb).__name__ == "FastReplayBuffer" and rb.on_policy == (mode == "sync")
    assert len(run.record.steps) == STEPS
    mini_batch = BATCH // (2 if mode == "separate_async" else 1)  # parameter_sync_step=2 samples twice a step
    assert set(groups_per_update(run.record)) == {mini_batch}
    led = rb.ledger("train")
    assert led["taken"] == STEPS * BATCH and led["vanished"] == 0
    if mode == "sync":  # on-policy: generated and trained at the same step; failed groups are trained padded
        assert set(ages(run.record)) == {0} and led["evicted"] == 0
    else:
        assert max(ages(run.record)) <= THRESHOLD - 1
        assert led["evicted_failure"] > 0 and led["evicted_stale"] > 0  # both eviction paths ran in verl's loop
        assert led["refill_requested"] == led["refill_delivered"] == led["evicted"]  # verl's refill_fn accepted all
    if mode == "separate_async":
        assert ray.get(run.trainer.standalone_server_manager.global_load_balancer.count.remote()) > 0


@pytest.mark.parametrize("mode, metric", [("sync", "acc"), ("colocate_async", "acc"), ("colocate_async", "reward")])
def test_dapo_set_the_verl_way_reaches_our_sampler(fresh, tmp_path, mode, metric):
    # algorithm.filter_groups reaches a custom sampler only through the trainer refill_fn is bound to.
    overrides = [
        "algorithm.filter_groups.enable=true",
        f"algorithm.filter_groups.metric={metric}",  # reward: 0.9.1 reads the canonical reward from rm_scores
        f"trainer.v1.sampler.max_off_policy_threshold={THRESHOLD}",
    ]
    config = compose(base_overrides(tmp_path, mode, 20, batch=BATCH, n=4) + SAMPLER + overrides)
    run = train(config, {"seed": 5, "fail_rate": 0.0}, check_ledger)
    stop(run)
    rb = run.trainer.replay_buffer
    assert rb.filter_groups_metric == metric
    assert run.trainer.config.data.gen_batch_size == 1  # verl's dataloader was sized for exact refills
    led = rb.ledger("train")
    assert led["evicted_filtered"] > 0 and led["taken"] == 20 * BATCH
    filtered_in_metrics = sum(m.get("training/filter_groups/evicted_samples", 0) for m in run.record.metrics)
    assert filtered_in_metrics == led["evicted_filtered"]
    if mode == "sync":  # sync DAPO refills two prompts per filtered group and discards the drained surplus
        assert led["refill_requested"] == led["refill_delivered"] > 0
    else:
        assert led["refill_requested"] == led["evicted"]


def test_sync_refill_failed_groups_set_the_verl_way_replaces_failed_groups(fresh, tmp_path):
    overrides = ["trainer.v1.sampler.sync_refill_failed_groups=true"]
    config = compose(base_overrides(tmp_path, "sync", 20, batch=BATCH, n=1) + SAMPLER + overrides)
    run = train(config, {"seed": 7, "fail_rate": 0.15}, check_ledger)  # n=1: a failed group has no trajectory
    stop(run)
    rb = run.trainer.replay_buffer
    led = rb.ledger("train")
    assert rb.sync_refill_failed_groups and rb.gen_batch_size == 1
    assert led["evicted_failure"] > 0 and led["refill_requested"] == led["evicted_failure"]
    assert all(len(tags) == BATCH for _, tags in run.record.trained)  # every trained group has its trajectory


def test_a_null_threshold_turns_staleness_control_off(fresh, tmp_path):
    # verl 0.9.1: max_off_policy_threshold: null -> no drop and no wait. Stragglers are trained, however old.
    config = compose(
        base_overrides(tmp_path, "colocate_async", 25, batch=BATCH)
        + SAMPLER
        + ["trainer.v1.sampler.max_off_policy_threshold=null"]
    )
    run = train(config, {"seed": 3, "fail_rate": 0.0, "straggler_every": 23, "straggler_s": 0.6}, check_ledger)
    stop(run)
    led = run.trainer.replay_buffer.ledger("train")
    assert run.trainer.replay_buffer.max_off_policy_threshold is None
    assert led["evicted"] == 0 and led["taken"] == 25 * BATCH
    assert max(ages(run.record)) > THRESHOLD - 1  # the same stragglers a threshold of 2 evicts are trained here


REFUSED = [
    (
        "sync",
        ["+trainer.v1.sampler.sampler_kwargs.filter_groups_metric=acc"],
        r"filter_groups_metric='acc' is set but algorithm.filter_groups.enable is false.*"
        r"algorithm.filter_groups.enable=true and algorithm.filter_groups.metric=acc",
    ),
    (
        "sync",
        ["+trainer.v1.sampler.sampler_kwargs.sync_refill_failed_groups=true"],
        r"sync_refill_failed_groups=True contradicts trainer.v1.sampler.sync_refill_failed_groups=False",
    ),
    (
        "colocate_async",
        ["+trainer.v1.sampler.sampler_kwargs.train_batch_size=99"],
        r"train_batch_size=99 contradicts data.train_batch_size=8",
    ),
    (
        "colocate_async",
        ["trainer.v1.sampler.max_off_policy_strategy=pace"],
        r"pace admits prompts before generation.*actor_rollout_ref.rollout.agent.agent_loop_manager_class=None.*"
        r"PacedAgentLoopManager",
    ),
    (
        "colocate_async",
        [
            "trainer.v1.sampler.max_off_policy_strategy=pace",
            "trainer.v1.sampler.max_off_policy_threshold=null",
        ],
        r"pace bounds the age of what is trained, but max_off_policy_threshold is null",
    ),
    (
        "colocate_async",
        [
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
            "reward.reward_model.enable=true",
            "reward.reward_model.enable_resource_pool=false",
        ],
        r"reward.reward_model.enable_resource_pool=true",
    ),
    (  # a misspelled key once built with timeout=600.0 and no word (issue 59, item 11)
        "colocate_async",
        ["+trainer.v1.sampler.sampler_kwargs.timout=5"],
        r"sampler_kwargs has keys the sampler does not read: 'timout' \(did you mean 'timeout'\?\)",
    ),
]


@pytest.mark.parametrize("mode, overrides, match", REFUSED)
def test_a_config_our_sampler_cannot_honour_is_refused_when_verl_builds_it(verl_cpu, tmp_path, mode, overrides, match):
    config = compose(base_overrides(tmp_path, mode, STEPS, batch=BATCH) + SAMPLER + overrides)
    with pytest.raises(VerlConfigError, match=match):
        cpu_trainer_class(mode)(config)  # verl's PPOTrainer.__init__ builds the sampler
