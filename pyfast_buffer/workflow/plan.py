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
    """The steady state of a rhythm, in trainer steps and trajectories per step, oldest first out.

    ``fills`` says which buffer was modelled: one that fills (production outruns consumption and a
    capacity bounds it; overflow evicted oldest first) or one that never fills (from an empty start the
    trainer consumes what was generated). ``headline`` is the sentence a user acts on.
    """

    produced_per_step: float
    consumed_per_step: float
    capacity: Optional[int]  # None: nothing bounds the buffer (verl's sampler)
    parameter_sync_step: int
    turnover_steps: Optional[float]  # capacity / consumed_per_step: steps to drain a full buffer once
    age_distribution: Dict[int, float]  # age -> share of trained trajectories in the steady state
    age_mean: Optional[float]
    age_max: Optional[int]
    suggested_max_age: Optional[int]
    reasoning: str
    warnings: List[str]
    max_age: Optional[int] = None  # the configured one, when known
    drop_share_at_max_age: Optional[float] = None  # share of trajectories it drops in the steady state
    strategy: Optional[str] = None
    latency_steps: int = 0
    fills: bool = False  # the modelled buffer fills (else: from an empty start it never does)
    steady: bool = True  # False: an unbounded backlog grows every step, so ages grow without limit
    # A bounded buffer that does not fill at these rates can still fill after a trainer stall; then the
    # oldest trajectory trained on gets this old (None when unbounded, or when it does fill).
    age_max_if_full: Optional[int] = None
    # With runs_ahead (producers generate until the capacity stops them), a rollout slower than the trainer
    # never fills the buffer; then the oldest trajectory trained on is this old.
    age_max_if_not_full: Optional[int] = None
    headline: str = ""


def finite_number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def plan(
    produced_per_step: float,
    consumed_per_step: float,
    capacity: Optional[int],
    parameter_sync_step: int = 1,
    *,
    max_age: Optional[int] = None,
    strategy: Optional[str] = None,
    latency_steps: int = 0,
    runs_ahead: bool = False,
) -> Plan:
    """Returns the steady state of a buffer fed ``produced_per_step`` and drained ``consumed_per_step``.

    Trajectories produced at step t carry the weights of the last push (``t - t % parameter_sync_step``)
    plus ``latency_steps`` of generation; the trainer takes the oldest first. The buffer modelled is the
    one these rates give: with ``capacity`` set and production above consumption it fills, and overflow
    is evicted oldest first; otherwise (``capacity=None`` is no bound at all) it starts empty and the
    trainer consumes what was generated. An unbounded buffer fed faster than it is drained has no steady
    state (``steady=False``). ``runs_ahead`` says the producers generate until the capacity stops them
    (AReaL's staleness control, verl's fully-async rollouter): the buffer fills whatever the rates.
    ``max_age`` and ``strategy``, when known, add the share the configured cutoff drops and the ``wait``
    warning. Raises ValueError on non-positive rates, capacity or sync step.
    """
    for name, value in (("produced_per_step", produced_per_step), ("consumed_per_step", consumed_per_step)):
        if finite_number(value) is None or value <= 0:
            raise ValueError(f"{name}={value!r} must be a number > 0; pass it or supply it with --set {name}=N")
    bound = None if capacity is None else _whole(capacity, "capacity", 1)
    sync = _whole(parameter_sync_step, "parameter_sync_step", 1)
    latency = _whole(latency_steps, "latency_steps", 0, exact=True)
    if max_age is not None:
        max_age = _whole(max_age, "max_age", 0, exact=True)
    if strategy not in (None, "drop", "wait"):
        raise ValueError(f"strategy={strategy!r} is unknown; use 'drop' or 'wait'")
    warnings: List[str] = []
    if produced_per_step < consumed_per_step:
        warnings.append(
            f"production {produced_per_step:g}/step is below consumption {consumed_per_step:g}/step: the "
            "trainer will starve (short batches or waiting for rollouts)"
        )
    turnover = None if bound is None else bound / consumed_per_step
    if bound is None and produced_per_step > consumed_per_step:
        growth = produced_per_step - consumed_per_step
        headline = (
            f"no steady state: production outruns consumption by {growth:g} trajectories a step and nothing "
            "bounds the buffer, so the backlog grows every step and the trajectories trained on get older "
            "without limit; set a capacity, produce less, or drop by age"
        )
        return Plan(
            produced_per_step=produced_per_step,
            consumed_per_step=consumed_per_step,
            capacity=None,
            parameter_sync_step=sync,
            turnover_steps=None,
            age_distribution={},
            age_mean=None,
            age_max=None,
            suggested_max_age=None,
            reasoning=headline,
            warnings=warnings,
            max_age=max_age,
            strategy=strategy,
            latency_steps=latency,
            steady=False,
            headline=headline,
        )
    fills = bound is not None and (produced_per_step > consumed_per_step or runs_ahead)
    ages = _fifo_ages(produced_per_step, consumed_per_step, bound, sync, start_full=fills)
    if_full: Optional[int] = None
    if bound is not None and not fills:
        try:
            if_full = max(_fifo_ages(produced_per_step, consumed_per_step, bound, sync, start_full=True)) + latency
        except ValueError:
            if_full = None
    if_not_full: Optional[int] = None
    if fills and produced_per_step <= consumed_per_step:
        if_not_full = max(_fifo_ages(produced_per_step, consumed_per_step, bound, sync, start_full=False)) + latency
    total = sum(ages.values())
    dist = {a + latency: n / total for a, n in sorted(ages.items())}
    age_max = max(dist)
    age_mean = sum(a * s for a, s in dist.items())
    queue_wait = age_max - latency - (sync - 1)
    model = (
        (
            f"the producers run ahead until the capacity ({bound}) stops them, so the buffer stays full"
            if produced_per_step <= consumed_per_step
            else f"the buffer fills (production {produced_per_step:g} > consumption {consumed_per_step:g} a step, "
            f"capacity {bound}) and evicts its oldest"
        )
        if fills
        else ("nothing bounds the buffer" if bound is None else f"the buffer never fills (capacity {bound})")
        + f" and the trainer consumes what was generated ({produced_per_step:g} made, "
        f"{consumed_per_step:g} taken a step)"
    )
    reasoning = (
        f"max_age={age_max}: the oldest a trajectory gets at these rates (queue wait {queue_wait}"
        f" + weight lag up to {sync - 1} + latency {latency}); a smaller one drops a steady share every step,"
        " a larger one only admits stragglers"
    )
    if bound is not None and bound >= FAR_ABOVE_STEPS * consumed_per_step and fills:
        warnings.append(
            f"capacity {bound} is {turnover:g}x one step's consumption ({consumed_per_step:g}): old "
            "trajectories will be picked up again; lower the capacity or drop by age"
        )
    if strategy == "wait" and max_age is not None and age_max > max_age:
        warnings.append(
            f"strategy 'wait' with max_age {max_age} below the oldest age at these rates ({age_max}): the "
            "trainer will block on in-flight prompts; raise the threshold or use 'drop'"
        )
    drop_share = None
    verdict = ""
    if max_age is not None:
        drop_share = sum(s for a, s in dist.items() if a > max_age)
        if drop_share == 0:
            verdict = f"; max_age {max_age} drops nothing at these rates"
        elif strategy == "wait":
            verdict = f"; max_age {max_age} is below it: under 'wait' the trainer blocks instead of dropping"
        else:
            verdict = f"; max_age {max_age} drops {drop_share:.1%} of trajectories (those older than {max_age})"
    headline = f"the oldest trajectory trained on is {age_max} step(s) old (mean {age_mean:.2f}){verdict}; {model}"
    return Plan(
        produced_per_step=produced_per_step,
        consumed_per_step=consumed_per_step,
        capacity=bound,
        parameter_sync_step=sync,
        turnover_steps=turnover,
        age_distribution=dist,
        age_mean=age_mean,
        age_max=age_max,
        suggested_max_age=age_max,
        reasoning=reasoning,
        warnings=warnings,
        max_age=max_age,
        drop_share_at_max_age=drop_share,
        strategy=strategy,
        latency_steps=latency,
        fills=fills,
        age_max_if_full=if_full,
        age_max_if_not_full=if_not_full,
        headline=headline,
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


def _fifo_ages(
    produced: float, consumed: float, capacity: Optional[int], sync: int, start_full: bool = True
) -> Dict[int, int]:
    """Simulates a FIFO (full, or empty) until it is periodic and counts the age of every trajectory taken.

    ``capacity=None`` is an unbounded FIFO, started empty. Raises ValueError when that takes more than
    _MAX_SIMULATED_STEPS steps, or when nothing is taken.
    """
    drain = consumed - produced if consumed > produced else produced  # rate the prefill leaves the head
    prefill = capacity if (start_full and capacity is not None) else 0
    warm = math.ceil(prefill / max(drain, 1e-9)) + 2 * sync + 2
    window = 8 * sync + 16
    if warm + window > _MAX_SIMULATED_STEPS:
        raise ValueError(
            f"too large to simulate: reaching the steady state takes about {warm + window:.3g} steps "
            f"(capacity {capacity}, parameter_sync_step {sync}, {drain:g} trajectories a step), "
            f"above the {_MAX_SIMULATED_STEPS} simulated; check the values, or --set smaller ones"
        )
    queue: collections.deque = collections.deque([[None, prefill]] if prefill else [])  # [sample_step, count]
    level, made, taken_so_far = prefill, 0.0, 0.0
    limit = math.inf if capacity is None else capacity
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
        while level > limit:  # evict oldest
            head = queue[0]
            k = int(min(head[1], level - limit))
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
