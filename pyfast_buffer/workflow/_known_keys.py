"""Which config keys set the produce / store / consume rhythm, and what each one means.

Two sources: the public config keys of verl, AReaL and TRL (matched on the dotted key,
anywhere in a file), and the keyword patterns of the practitioner procedure
(docs/workflow.md), matched on the last part of the key for any other framework.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Optional

PRODUCTION, CAPACITY, CONSUMPTION, STALENESS = "production", "capacity", "consumption", "staleness"


@dataclass(frozen=True)
class KnownKey:
    """A framework key: glob on the dotted key, its class, its role in the rhythm and a short meaning."""

    pattern: str
    cls: str
    source: str
    role: str
    meaning: str


# Roles are the names rhythm.derive_rhythm reads; order matters only inside one framework.
KNOWN_KEYS = (
    # verl: ppo_trainer.yaml, the trainer.v1 sampler block (PR #6778) and the fully-async recipe.
    KnownKey("data.train_batch_size", PRODUCTION, "verl", "verl.prompts_per_step", "prompts per trainer step"),
    KnownKey(
        "actor_rollout_ref.rollout.n",
        PRODUCTION,
        "verl",
        "verl.samples_per_prompt",
        "responses per prompt (GRPO group size)",
    ),
    KnownKey(
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        CONSUMPTION,
        "verl",
        "verl.mini_batch_prompts",
        "prompts per optimiser mini-batch",
    ),
    KnownKey(
        "actor_rollout_ref.actor.ppo_epochs",
        CONSUMPTION,
        "verl",
        "verl.ppo_epochs",
        "passes over each batch inside one step",
    ),
    KnownKey(
        "trainer.*.sampler.max_off_policy_threshold",
        STALENESS,
        "verl",
        "verl.threshold",
        "policy versions a trajectory may lag",
    ),
    KnownKey("trainer.*.sampler.max_off_policy_strategy", STALENESS, "verl", "strategy", "drop or wait"),
    KnownKey(
        "trainer.v1.trainer_mode",
        STALENESS,
        "verl",
        "verl.trainer_mode",
        "sync, colocate_async or separate_async: whether rollouts lag the trainer",
    ),
    KnownKey(
        "trainer.v1.separate_async.num_warmup_batches",
        STALENESS,
        "verl",
        "verl.warmup.separate_async",
        "batches generated ahead before training starts",
    ),
    KnownKey(
        "trainer.v1.colocate_async.num_warmup_batches",
        STALENESS,
        "verl",
        "verl.warmup.colocate_async",
        "batches generated ahead before training starts",
    ),
    KnownKey(
        "trainer.*.sampler.sampler_kwargs.capacity",
        CAPACITY,
        "verl",
        "capacity",
        "ready trajectories the sampler holds",
    ),
    KnownKey(
        "async_training.trigger_parameter_sync_step",
        STALENESS,
        "verl",
        "parameter_sync_step",
        "trainer steps between weight pushes (fully async)",
    ),
    KnownKey("parameter_sync_step", STALENESS, "verl", "parameter_sync_step", "trainer steps between weight pushes"),
    KnownKey(
        "async_training.staleness_threshold",
        STALENESS,
        "verl",
        "verl.staleness_threshold",
        "extra sync windows of samples the queue may hold",
    ),
    KnownKey(
        "async_training.require_batches",
        CONSUMPTION,
        "verl",
        "verl.require_batches",
        "mini-batches per trainer step (fully async)",
    ),
    KnownKey(
        "async_training.max_queue_size", CAPACITY, "verl", "verl.max_queue_size", "message queue bound (fully async)"
    ),
    KnownKey(
        "async_training.partial_rollout", PRODUCTION, "verl", "", "interrupted rollouts resume across weight pushes"
    ),
    KnownKey("async_training.*", STALENESS, "verl", "", "fully-async setting"),
    # AReaL: rollout / gconfig / train_dataset of its experiment YAMLs.
    KnownKey(
        "max_head_offpolicyness",
        STALENESS,
        "AReaL",
        "areal.max_head_offpolicyness",
        "policy versions a rollout may lag (0 = synchronous)",
    ),
    KnownKey(
        "max_concurrent_rollouts", CAPACITY, "AReaL", "areal.max_concurrent_rollouts", "rollouts in flight at once"
    ),
    KnownKey("rollout.queue_size", CAPACITY, "AReaL", "areal.queue_size", "finished-rollout queue bound"),
    KnownKey(
        "consumer_batch_size", CONSUMPTION, "AReaL", "areal.consumer_batch_size", "groups the trainer takes per step"
    ),
    KnownKey("gconfig.n_samples", PRODUCTION, "AReaL", "areal.n_samples", "responses per prompt"),
    KnownKey("train_dataset.batch_size", PRODUCTION, "AReaL", "areal.prompts_per_step", "prompts per trainer step"),
    # TRL: GRPOConfig.
    KnownKey("num_iterations", STALENESS, "TRL", "trl.num_iterations", "times each generation is trained on (reuse)"),
    KnownKey(
        "steps_per_generation", CONSUMPTION, "TRL", "trl.steps_per_generation", "micro-steps one generation batch lasts"
    ),
    KnownKey("num_generations", PRODUCTION, "TRL", "trl.num_generations", "completions per prompt"),
    KnownKey(
        "per_device_train_batch_size",
        CONSUMPTION,
        "TRL",
        "trl.per_device_train_batch_size",
        "completions per micro-step per device",
    ),
    KnownKey(
        "gradient_accumulation_steps",
        CONSUMPTION,
        "TRL",
        "trl.gradient_accumulation_steps",
        "micro-steps per optimiser step",
    ),
    KnownKey("generation_batch_size", PRODUCTION, "TRL", "trl.generation_batch_size", "completions per generation"),
)

# The procedure's three grep patterns (docs/workflow.md), checked in this order on the key's last part.
KEYWORD_PATTERNS = (
    (CAPACITY, re.compile(r"replay|buffer|queue|maxlen|capacity|pool", re.I)),
    (PRODUCTION, re.compile(r"rollout|sample_batch|n_samples|batch_size|group_size", re.I)),
    (CONSUMPTION, re.compile(r"train_|update_|steps_per|interval|ratio|reuse", re.I)),
)
# Generic names whose value is taken as the capacity when no framework key gives one.
GENERIC_CAPACITY = re.compile(
    r"^(capacity|buffer_size|replay_buffer_size|replay_size|maxlen|max_size|pool_size)$", re.I
)


def match_known(dotted_key: str) -> Optional[KnownKey]:
    """Returns the first known framework key matching ``dotted_key`` (anywhere in the tree), or None."""
    for known in KNOWN_KEYS:
        if fnmatch.fnmatchcase(dotted_key, known.pattern) or fnmatch.fnmatchcase(dotted_key, "*." + known.pattern):
            return known
    return None


def match_keyword(dotted_key: str, value: Any) -> Optional[str]:
    """Returns the class a procedure keyword gives a numeric leaf, or None.

    Only numbers are kept: the procedure's greps also hit names and paths
    (``rollout.name: vllm``), which say nothing about the rhythm.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    leaf = dotted_key.rsplit(".", 1)[-1]
    for cls, pattern in KEYWORD_PATTERNS:
        if pattern.search(leaf):
            return cls
    return None
