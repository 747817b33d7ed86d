"""``pace`` inside verl 0.9.1's real trainer: our sampler under ``max_off_policy_strategy: pace`` with
``PacedAgentLoopManager`` as verl's ``agent_loop_manager_class`` (two config lines), on CPU with a fake backend.

In verl's own loop (colocate_async and separate_async, 50 steps, stragglers and failed generations): no group is
evicted for staleness, none is trained older than the bound (by its re-stamped dispatch step and by the weight
versions that generated it), every prompt is trained or counted, and nothing deadlocks when generation fails or
the trainer stops. A resume from verl's checkpoint (which restores TransferQueue and re-issues the in-flight
prompts through the manager) keeps the admission window. Also here: staleness counted from the generation
versions (``sampler_kwargs.age_from``). Needs ``verl==0.9.1`` (``.ci/verl-stage.sh``).
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
pytest.importorskip("transfer_queue", reason="TransferQueue is not installed: pip install '.[verl]'")

from _verl_cpu_trainer import (
    PACED,
    SAMPLER,
    VERL_OWN_WARNINGS,
    balanced,
    base_overrides,
    clear_transfer_queue,
    compose,
    import_verl,
    stop,
    train,
)

import_verl()
from pyfast_buffer.integrations.verl import PacedAgentLoopManager  # noqa: E402

pytestmark = [pytest.mark.filterwarnings(w) for w in VERL_OWN_WARNINGS]

STEPS = 50
BATCH = 8
THRESHOLD = 2  # max_age = 1: a prompt dispatched at step s must be trained by step s + 1
MAX_AGE = THRESHOLD - 1
SERVER = {"seed": 11, "fail_rate": 0.1, "straggler_every": 17, "straggler_s": 0.5}


@pytest.fixture
def fresh(verl_cpu):
    clear_transfer_queue()
    yield
    clear_transfer_queue()


def window_kept(trainer) -> None:
    """After every step: the ledger balances and the outstanding groups fit pace's window (lookahead + 1) * P."""
    rb = trainer.replay_buffer
    led = rb.ledger("train")
    balanced(led, paced=True)
    outstanding = led["core_in_flight"] + led["core_ready"] - led["ghosts"]
    assert outstanding <= (rb.options.lookahead + 1) * rb.options.prompts_per_step, led


def paced_config(tmp_path, mode: str, steps: int = STEPS, extra: tuple = ()) -> object:
    overrides = [f"trainer.v1.sampler.max_off_policy_threshold={THRESHOLD}", *extra]
    if mode == "separate_async":
        overrides.append("trainer.v1.separate_async.hybrid_rollout.enable_switch=true")
    return compose(base_overrides(tmp_path, mode, steps, batch=BATCH) + SAMPLER + PACED + overrides)


def trained(record) -> list:
    """(trainer step, trajectory tag) of every trajectory trained."""
    return [(step, tag) for step, tags in record.trained for tag in tags]


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_pace_in_verls_loop_drops_nothing_and_trains_nothing_past_the_bound(fresh, tmp_path, mode):
    # Three warm-up batches: verl keeps (3 + 1) * P prompts submitted, pace's window holds (max_age + 1) * P,
    # so the manager holds the rest until the takes make room (the overfilled window of verl #7759).
    awaiting: list = []

    def check(trainer) -> None:
        window_kept(trainer)
        awaiting.append(trainer.replay_buffer.ledger("train")["awaiting_admission"])

    config = paced_config(tmp_path, mode, extra=(f"trainer.v1.{mode}.num_warmup_batches=3",))
    run = train(config, SERVER, check)
    stop(run)
    assert max(awaiting) >= BATCH  # prompts were held for admission, in verl's own loop
    rb = run.trainer.replay_buffer
    assert rb.paced and isinstance(run.manager, PacedAgentLoopManager)
    led = rb.ledger("train")
    assert len(run.record.steps) == STEPS and led["taken"] == STEPS * BATCH
    assert led["evicted_stale"] == 0 and led["evicted_unadmitted"] == 0 and led["core_trained_over_age"] == 0
    assert led["evicted_failure"] > 0 and led["refill_requested"] == led["refill_delivered"] == led["evicted"]
    rows = trained(run.record)
    assert max(step - tag["global_steps"] for step, tag in rows) <= MAX_AGE  # the re-stamped dispatch step
    # verl's own measure: versions behind the trained policy, from the oldest weights that generated it
    assert max((step - 1) - tag["min_global_steps"] for step, tag in rows) <= MAX_AGE
    assert len({tag["__key__"].split("_", 1)[0] for _, tag in rows}) == led["taken"]  # trained once each
    assert run.manager.held == led["awaiting_admission"]


def test_pace_does_not_wedge_when_many_generations_fail(fresh, tmp_path):
    run = train(paced_config(tmp_path, "colocate_async", steps=20), {"seed": 2, "fail_rate": 0.5}, window_kept)
    stop(run)
    led = run.trainer.replay_buffer.ledger("train")
    assert led["taken"] == 20 * BATCH and led["evicted_failure"] >= 20 * BATCH // 2  # about as many failed
    assert led["evicted_stale"] == 0


def test_pace_when_no_generation_ever_finishes_fails_with_the_reason_instead_of_hanging(fresh, tmp_path):
    timeout_s = 3.0
    config = paced_config(tmp_path, "colocate_async", 5, (f"+trainer.v1.sampler.sampler_kwargs.timeout={timeout_s}",))
    started = time.monotonic()
    run = train(config, {"seed": 2, "fail_always": True}, window_kept, raise_errors=False)
    stop(run)
    assert isinstance(run.error, TimeoutError), run.error
    assert "prompts await admission" in str(run.error) and "sampler_kwargs.timeout" in str(run.error)
    assert time.monotonic() - started < 60  # verl's own buffer would poll forever
    balanced(run.trainer.replay_buffer.ledger("train"), paced=True)


def test_pace_when_the_trainer_stops_counts_every_held_prompt(fresh, tmp_path):
    class TrainerStopped(Exception):
        pass

    def stop_at_step_12(trainer) -> None:
        window_kept(trainer)
        if trainer.global_steps == 12:
            raise TrainerStopped

    run = train(paced_config(tmp_path, "colocate_async", 20), SERVER, stop_at_step_12, raise_errors=False)
    stop(run)
    assert isinstance(run.error, TrainerStopped)
    led = run.trainer.replay_buffer.ledger("train")
    balanced(led, paced=True)  # every prompt verl submitted is trained, evicted or held (in flight or awaiting)
    assert led["taken"] == 12 * BATCH
    assert run.manager.held == led["awaiting_admission"]


def test_a_resume_from_verls_checkpoint_keeps_the_admission_window(fresh, tmp_path):
    # Run 1 saves at step 10 (TransferQueue included: finished groups and in-flight prompts). Run 2 is a new
    # trainer, sampler and manager: verl restores TransferQueue, re-issues the in-flight prompts through the
    # manager and tops the warm-up up to its window.
    save = ("trainer.save_freq=5",)
    first = train(paced_config(tmp_path, "colocate_async", steps=10, extra=save), SERVER, window_kept)
    stop(first)
    assert (tmp_path / "checkpoints" / "global_step_10" / "transfer_queue").is_dir()
    left_over = first.trainer.replay_buffer.ledger("train")["held"]
    assert left_over > 0  # something was in flight or ready at the checkpoint
    clear_transfer_queue()  # a new process starts with an empty TransferQueue; verl loads it from the checkpoint
    second = train(paced_config(tmp_path, "colocate_async", steps=20, extra=save), SERVER, window_kept)
    stop(second)
    led = second.trainer.replay_buffer.ledger("train")
    assert second.trainer.global_steps == 21 and len(second.record.steps) == 10
    assert led["evicted_stale"] == 0 and led["evicted_unadmitted"] == 0 and led["core_trained_over_age"] == 0
    assert led["taken"] == 10 * BATCH
    assert max(step - tag["global_steps"] for step, tag in trained(second.record)) <= MAX_AGE


def test_staleness_from_generation_versions_under_drop(fresh, tmp_path):
    # age_from=generation_start counts a group's age from the oldest weights that generated any of its
    # trajectories (verl's trajectory_staleness_worst), not from the dispatch tag: a prompt that queued for a
    # free engine slot across a weight push is younger than its tag says, and is trained instead of evicted (#6975).
    overrides = [
        f"trainer.v1.sampler.max_off_policy_threshold={THRESHOLD}",
        "+trainer.v1.sampler.sampler_kwargs.age_from=generation_start",
    ]
    config = compose(base_overrides(tmp_path, "colocate_async", 30, batch=BATCH) + SAMPLER + overrides)
    run = train(config, {"seed": 4, "fail_rate": 0.0, "slots": 2, "median_s": 0.03})
    stop(run)
    oldest: dict = {}  # uid -> (trainer step, oldest version that generated any of its trajectories)
    for step, tag in trained(run.record):
        uid = tag["__key__"].split("_", 1)[0]
        oldest[uid] = (step, min(oldest.get(uid, (step, tag["min_global_steps"]))[1], tag["min_global_steps"]))
    assert max(step - (version + 1) for step, version in oldest.values()) <= MAX_AGE
    rows = trained(run.record)
    assert any(step - tag["global_steps"] > MAX_AGE for step, tag in rows)  # by its dispatch tag: evicted
