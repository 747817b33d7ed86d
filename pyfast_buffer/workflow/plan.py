"""The FIFO steady state of a rhythm: how old trajectories get, and the ``max_age`` that fits.

``plan(produced_per_step, consumed_per_step, capacity, parameter_sync_step)`` is what ``pyfast-buffer
rhythm`` reports once it has read the rates from config files; it is also the planner the experiment
checks against a real run (``experiment/planner_check.py``).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

#: Capacity at or above this many steps of consumption is "far above" it (the procedure's first flag).
FAR_ABOVE_STEPS = 4
_MAX_SIMULATED_STEPS = 200_000


@dataclass
class Plan:
    """The FIFO steady state of a rhythm, in trainer steps and trajectories per step."""

    produced_per_step: float
    consumed_per_step: float
    capacity: int
    parameter_sync_step: int
    turnover_steps: float  # capacity / consumed_per_step: steps to drain a full buffer once
    age_distribution: Dict[int, float]  # age -> share of trained trajectories, FIFO steady state
    age_mean: float
    age_max: int
    suggested_max_age: int
    reasoning: str
    warnings: List[str]
    max_age: Optional[int] = None  # the configured one, when known
    drop_share_at_max_age: Optional[float] = None  # share of trajectories it drops in steady state
    strategy: Optional[str] = None
    latency_steps: int = 0
    # The suggestion assumes a buffer that has filled once (the worst case); from an empty start at the
    # same rates the oldest trajectory trained on is this old (equal when production outruns consumption).
    age_max_empty_start: Optional[int] = None


def finite_number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def plan(
    produced_per_step: float,
    consumed_per_step: float,
    capacity: int,
    parameter_sync_step: int = 1,
    *,
    max_age: Optional[int] = None,
    strategy: Optional[str] = None,
    latency_steps: int = 0,
) -> Plan:
    """Returns the FIFO steady state of a buffer fed ``produced_per_step`` and drained ``consumed_per_step``.

    Trajectories produced at step t carry the weights of the last push (``t - t % parameter_sync_step``)
    plus ``latency_steps`` of generation; the buffer is assumed full once it has filled (the worst
    case), oldest first out, overflow evicted oldest first. ``max_age`` and ``strategy``, when known,
    add the share the configured threshold drops and the ``wait`` warning. Raises ValueError on
    non-positive rates, capacity or sync step.
    """
    for name, value in (("produced_per_step", produced_per_step), ("consumed_per_step", consumed_per_step)):
        if finite_number(value) is None or value <= 0:
            raise ValueError(f"{name}={value!r} must be a number > 0; pass it or supply it with --set {name}=N")
    capacity = _whole(capacity, "capacity", 1)
    sync = _whole(parameter_sync_step, "parameter_sync_step", 1)
    latency = _whole(latency_steps, "latency_steps", 0, exact=True)
    if max_age is not None:
        max_age = _whole(max_age, "max_age", 0, exact=True)
    ages = _fifo_ages(produced_per_step, consumed_per_step, capacity, sync)
    if strategy not in (None, "drop", "wait"):
        raise ValueError(f"strategy={strategy!r} is unknown; use 'drop' or 'wait'")
    try:
        empty_max: Optional[int] = (
            max(_fifo_ages(produced_per_step, consumed_per_step, capacity, sync, start_full=False)) + latency
        )
    except ValueError:
        empty_max = None
    total = sum(ages.values())
    dist = {a + latency: n / total for a, n in sorted(ages.items())}
    age_max = max(dist)
    age_mean = sum(a * s for a, s in dist.items())
    turnover = capacity / consumed_per_step
    queue_wait = age_max - latency - (sync - 1)
    reasoning = (
        f"max_age={age_max}: the oldest a trajectory gets under FIFO at these rates (queue wait {queue_wait}"
        f" + weight lag up to {sync - 1} + latency {latency}); a smaller one drops a steady share every step,"
        " a larger one only admits stragglers"
    )
    warnings = []
    if capacity >= FAR_ABOVE_STEPS * consumed_per_step:
        warnings.append(
            f"capacity {capacity} is {turnover:g}x one step's consumption ({consumed_per_step:g}): old "
            "trajectories will be picked up again; lower the capacity or drop by age"
        )
    if produced_per_step < consumed_per_step:
        warnings.append(
            f"production {produced_per_step:g}/step is below consumption {consumed_per_step:g}/step: the "
            "trainer will starve (short batches or waiting for rollouts)"
        )
    if strategy == "wait" and max_age is not None and max_age < turnover:
        warnings.append(
            f"strategy 'wait' with max_age {max_age} below the turnover ({turnover:g} steps): the trainer "
            "will block on in-flight prompts; raise the threshold or use 'drop'"
        )
    drop_share = None
    if max_age is not None:
        drop_share = sum(s for a, s in dist.items() if a > max_age)
    return Plan(
        produced_per_step,
        consumed_per_step,
        capacity,
        sync,
        turnover,
        dist,
        age_mean,
        age_max,
        age_max,
        reasoning,
        warnings,
        max_age,
        drop_share,
        strategy,
        latency,
        empty_max,
    )


def _whole(value: Any, name: str, minimum: int, exact: bool = False) -> int:
    """Returns ``value`` as an int >= ``minimum`` (rounded down unless ``exact``), or raises ValueError saying why."""
    if finite_number(value) is None:
        raise ValueError(f"{name}={value!r} is not a number; supply it with --set {name}=N")
    if exact and value != int(value):
        raise ValueError(f"{name}={value!r} is not a whole number; supply it with --set {name}=N")
    if int(value) < minimum:
        raise ValueError(
            f"{name}={value!r} is below {minimum}"
            + (" once rounded down to a whole number" if value != int(value) else "")
            + f"; supply it with --set {name}=N (N >= {minimum})"
        )
    return int(value)


def _fifo_ages(produced: float, consumed: float, capacity: int, sync: int, start_full: bool = True) -> Dict[int, int]:
    """Simulates a FIFO (full, or empty) until it is periodic and counts the age of every trajectory taken.

    Raises ValueError when that takes more than _MAX_SIMULATED_STEPS steps, or when nothing is taken.
    """
    drain = consumed - produced if consumed > produced else produced  # rate the prefill leaves the head
    warm = math.ceil(capacity / max(drain, 1e-9)) + 2 * sync + 2
    window = 8 * sync + 16
    if warm + window > _MAX_SIMULATED_STEPS:
        raise ValueError(
            f"too large to simulate: reaching the steady state takes about {warm + window:.3g} steps "
            f"(capacity {capacity}, parameter_sync_step {sync}, {drain:g} trajectories a step), "
            f"above the {_MAX_SIMULATED_STEPS} simulated; check the values, or --set smaller ones"
        )
    queue: collections.deque = collections.deque([[None, capacity]] if start_full else [])  # [sample_step, count]
    level, made, taken_so_far = (capacity if start_full else 0), 0.0, 0.0
    ages: Dict[int, int] = collections.Counter()
    for t in range(warm + window):
        # Whole trajectories only: accumulate fractional rates (TRL's batch / num_iterations).
        new = int(made + produced) - int(made)
        made += produced
        want = int(taken_so_far + consumed) - int(taken_so_far)
        taken_so_far += consumed
        if new:
            queue.append([t - t % sync, new])
            level += new
        while level > capacity:  # evict oldest
            head = queue[0]
            k = min(head[1], level - capacity)
            head[1] -= k
            level -= k
            if not head[1]:
                queue.popleft()
        while want and queue:
            head = queue[0]
            k = min(head[1], want)
            if t >= warm and head[0] is not None:
                ages[t - head[0]] += k
            head[1] -= k
            level -= k
            want -= k
            if not head[1]:
                queue.popleft()
    if not ages:
        raise ValueError(
            f"no trajectory reached the trainer in {window} simulated steps (production {produced:g}, "
            f"consumption {consumed:g} a step); check the rates"
        )
    return ages
