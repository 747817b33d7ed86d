"""The worker's arguments checked, and what it learns from TRL's ``AsyncGRPOConfig`` at trainer construction.

No TRL import: the config is read by attribute.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

WHERE = "StalenessRolloutWorker"
STRATEGIES = ("drop", "wait", "pace")


def positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{WHERE}: {name}={value!r} must be an int")
    if value < minimum:
        raise ValueError(f"{WHERE}: {name}={value} must be >= {minimum}")
    return value


def optional_int(value: Any, name: str, minimum: int = 1) -> Optional[int]:
    return None if value is None else positive_int(value, name, minimum)


def positive_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{WHERE}: {name}={value!r} must be a number of seconds > 0")
    return float(value)


def strategy(value: Any) -> str:
    if value not in STRATEGIES:
        raise ValueError(f"{WHERE}: strategy={value!r}; use one of {', '.join(map(repr, STRATEGIES))}")
    return str(value)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the worker runs with, from its own arguments and the trainer's config.

    ``groups_per_version`` is how many groups the trainer trains between two weight syncs (our buffer's step is TRL's
    ``model_version``); ``margin`` is 1 when the trainer's planner can split a group across a weight sync (a token
    budget, or a micro-batch that is not a whole number of groups), so the buffer's own bound is one version tighter
    and the part delivered after the sync is still within ``max_age``. ``max_ahead_groups`` (wait only) caps the
    groups reserved, generating or ready: ``(bound + 1) * groups_per_version``, what the trainer takes before the
    newest of them passes the bound.
    """

    groups_per_version: int
    margin: int
    capacity: int
    max_inflight_groups: int
    max_ahead_groups: Optional[int]


def plan(worker: Any, args: Any) -> Plan:
    """Checks the trainer's config against the worker and returns the plan; raises ValueError naming both keys."""
    max_staleness = int(getattr(args, "max_staleness", 4))
    if max_staleness < worker.max_age:
        raise ValueError(
            f"AsyncGRPOConfig.max_staleness={max_staleness} is smaller than {WHERE}(max_age={worker.max_age}): TRL's "
            "own filter would drop what our buffer keeps. Set max_staleness >= max_age (our filter runs first, so "
            "TRL's then never fires), or lower max_age."
        )
    generations = int(getattr(args, "num_generations", worker.num_generations))
    if generations != worker.num_generations:
        raise ValueError(
            f"AsyncGRPOConfig.num_generations={generations} differs from {WHERE}(num_generations="
            f"{worker.num_generations}): the trainer sizes its epochs by it. Pass the same value to both."
        )
    processes = int(getattr(args, "world_size", 1) or 1)
    per_device = int(getattr(args, "per_device_train_batch_size", 1))
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1))
    sync_steps = int(getattr(args, "weight_sync_steps", 1))
    samples_per_step = per_device * accumulation * processes
    G = worker.num_generations
    if worker.groups_per_step is not None:
        per_step = worker.groups_per_step
    elif samples_per_step % G:
        raise ValueError(
            f"AsyncGRPOConfig: per_device_train_batch_size * gradient_accumulation_steps * processes = "
            f"{samples_per_step} samples a step is not a whole number of groups of num_generations={G}; make it a "
            f"multiple of {G}, or pass {WHERE}(groups_per_step=...)"
        )
    else:
        per_step = samples_per_step // G
    token_budget = getattr(args, "token_budget", None)
    aligned = not token_budget and (per_device * processes) % G == 0
    margin = 0 if aligned else 1
    if worker.max_age - margin < 0:
        raise ValueError(
            f"{WHERE}(max_age=0) with AsyncGRPOConfig.token_budget={token_budget!r} (or a micro-batch of "
            f"{per_device * processes} samples, not a whole number of groups of {G}): the trainer may pull part of a "
            "group after a weight sync, one version later. Use max_age >= 1, or token_budget=0 with "
            f"per_device_train_batch_size a multiple of {G}."
        )
    groups_per_version = per_step * sync_steps
    inflight = worker.max_inflight_groups or max(worker.max_age, 1) * groups_per_version
    queue_max = int(getattr(args, "queue_maxsize", 0) or 0)
    capacity = worker.capacity or max(queue_max, (worker.max_age + 2) * groups_per_version * G + inflight * G)
    if capacity < G:
        raise ValueError(f"{WHERE}: capacity={capacity} holds less than one group of num_generations={G}")
    ahead = max(worker.max_age - margin, 1) * groups_per_version if worker.strategy == "wait" else None
    return Plan(
        groups_per_version=groups_per_version,
        margin=margin,
        capacity=capacity,
        max_inflight_groups=inflight,
        max_ahead_groups=ahead,
    )
