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
    """What the worker runs with, from its own arguments and the trainer's config (docs/trl.md, "Batching").

    Our buffer's step is TRL's ``model_version``. ``samples_per_version`` is the fewest samples TRL's planner pulls
    between two weight syncs: exact for its fixed-count batcher (``per_device_train_batch_size * processes`` a
    micro-batch), and for its token-budget batcher the fewest that can fill a micro-batch, ``floor(token_budget /
    longest sample) + processes - 1``, with the longest sample the longest prompt of the dataset plus
    ``max_completion_length``. ``groups_per_version`` is the fewest groups the trainer then takes from the buffer per
    version (``floor(samples_per_version / G)``; pace's ``prompts_per_step``). ``margin`` is how many syncs can fall
    between the first and the last sample of one group (``ceil((G - 1) / samples_per_version)``, 0 when every
    micro-batch is whole groups and no budget is set), so the buffer's own bound is ``max_age - margin`` and the last
    sample of a group is still within ``max_age`` when TRL checks it. ``exact`` says the trainer takes exactly
    ``groups_per_version`` groups each version. ``max_ahead_groups`` (wait only) caps
    the groups reserved, generating or ready: ``(bound + 1) * groups_per_version``, what the trainer takes before the
    newest of them passes the bound. ``token_budget`` is the budget planned for (None: off).
    """

    groups_per_version: int
    margin: int
    capacity: int
    max_inflight_groups: int
    max_ahead_groups: Optional[int]
    samples_per_version: int = 0
    exact: bool = True
    token_budget: Optional[int] = None


#: Stands for "the budget in the trainer's config" (plan's ``token_budget`` argument not given).
FROM_CONFIG = object()


def resolved_budget(value: Any) -> Optional[int]:
    """TRL's ``token_budget`` as its trainer uses it: ``<= 0`` turns budgeting off (``FixedCountBatcher``), ``None``
    is resolved at train start to the vLLM server's ``max_model_len``; returns None for off, else the budget."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"AsyncGRPOConfig.token_budget={value!r} must be an int (<= 0: off) or None")
    return value if value > 0 else None


def plan(worker: Any, args: Any, token_budget: Any = FROM_CONFIG) -> Plan:
    """Checks the trainer's config against the worker and returns the plan; raises ValueError naming the keys and a
    fix. ``token_budget``: the budget TRL will batch by, when it differs from ``args.token_budget`` (the callback
    passes the one TRL resolved at train start)."""
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
    G = worker.num_generations
    processes = int(getattr(args, "world_size", 1) or 1)
    per_device = int(getattr(args, "per_device_train_batch_size", 1))
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1))
    sync_steps = int(getattr(args, "weight_sync_steps", 1))
    raw = getattr(args, "token_budget", None) if token_budget is FROM_CONFIG else token_budget
    budget = resolved_budget(raw)
    if budget is None:  # TRL's FixedCountBatcher: exactly this many samples a micro-batch
        per_micro = per_device * processes
        exact = per_micro % G == 0
    else:  # TRL's TokenBudgetBatcher: a micro-batch closes when the next sample fits in no row
        longest = worker.longest_prompt() + worker.max_completion_length
        if longest > budget:
            raise ValueError(
                f"AsyncGRPOConfig.token_budget={budget} is smaller than the longest sample this run can make "
                f"({longest} tokens: the longest prompt of the dataset, {longest - worker.max_completion_length}, "
                f"plus max_completion_length={worker.max_completion_length}); TRL drops any sample longer than its "
                f"budget (batch/dropped_oversize_total). Set token_budget >= {longest}, or lower "
                "max_completion_length."
            )
        per_micro = budget // longest + processes - 1
        exact = False
    samples = per_micro * accumulation * sync_steps  # the fewest samples TRL pulls between two weight syncs
    derived = samples // G
    margin = 0 if exact else -(-(G - 1) // samples)
    settings = (
        f"per_device_train_batch_size={per_device}, gradient_accumulation_steps={accumulation}, "
        f"weight_sync_steps={sync_steps}, processes={processes}, token_budget={raw!r}"
    )
    if worker.groups_per_step is not None:
        if worker.groups_per_step * sync_steps > derived:
            raise ValueError(
                f"{WHERE}(groups_per_step={worker.groups_per_step}): with {settings}, TRL may train as few as "
                f"{samples} samples ({derived} whole group(s) of num_generations={G}) between two weight syncs, "
                f"fewer than groups_per_step * weight_sync_steps = {worker.groups_per_step * sync_steps}; the bound "
                f"would not hold. Leave groups_per_step unset (derived: {derived // sync_steps or 1}), or pass at most "
                f"{max(derived // sync_steps, 1)}."
            )
        per_version = worker.groups_per_step * sync_steps
        exact = exact and per_version == derived
    else:
        per_version = derived
    pace = worker.strategy == "pace"
    if pace and per_version < 1:
        raise ValueError(
            f"{WHERE}(strategy='pace'): with {settings}, TRL may train as few as {samples} sample(s) between two "
            f"weight syncs, less than one group of num_generations={G}, so pace cannot reserve a whole group per "
            f"sync. Raise per_device_train_batch_size, gradient_accumulation_steps or weight_sync_steps (or "
            f"token_budget) until at least {G} samples are trained between syncs, or use strategy='drop'."
        )
    bound = worker.max_age - margin
    if bound < 0:
        raise ValueError(
            f"{WHERE}(max_age={worker.max_age}): with {settings}, a group's last sample can reach the trainer {margin} "
            f"weight sync(s) after its first (a micro-batch is not whole groups of num_generations={G}, or a token "
            f"budget decides its size), so no bound below {margin} can hold. Use max_age >= {margin}, or "
            f"token_budget=0 with per_device_train_batch_size a multiple of {G}."
        )
    if pace and bound == 0:
        raise ValueError(
            f"{WHERE}(strategy='pace', max_age={worker.max_age}): the buffer's own bound after the {margin}-sync "
            "margin would be 0, and pace cannot keep a bound of 0 in TRL's trainer: its data loader pulls the next "
            "micro-batch before the weight sync that ends a step, so the first version takes a micro-batch more "
            f"than pace can admit for it, and generation would wait on a take that waits on it. Use max_age >= "
            f"{margin + 1} with pace, or strategy='drop' for a bound of {margin}."
        )
    groups_per_version = max(per_version, 1)
    inflight = worker.max_inflight_groups or max(worker.max_age, 1) * groups_per_version
    queue_max = int(getattr(args, "queue_maxsize", 0) or 0)
    capacity = worker.capacity or max(queue_max, (worker.max_age + 2) * groups_per_version * G + inflight * G)
    if capacity < G:
        raise ValueError(f"{WHERE}: capacity={capacity} holds less than one group of num_generations={G}")
    ahead = max(bound, 1) * groups_per_version if worker.strategy == "wait" else None
    return Plan(
        groups_per_version=groups_per_version,
        margin=margin,
        capacity=capacity,
        max_inflight_groups=inflight,
        max_ahead_groups=ahead,
        samples_per_version=samples,
        exact=exact,
        token_budget=budget,
    )
