"""The verl sampler's settings, read from its constructor and from ``sampler_kwargs``, checked once.

verl hands a custom sampler only ``trainer_mode, trainer_config, max_off_policy_threshold,
max_off_policy_strategy, sampler_kwargs`` and ``refill_fn``; the DAPO and sync-refill options that
its built-in buffer gets as arguments must then come from ``trainer.v1.sampler.sampler_kwargs``.
A constructor argument left at its default gives way to the ``sampler_kwargs`` entry of the same name.

Absolute imports only: verl loads ``verl.py`` by file path, outside the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pyfast_buffer._args import MAX_TIMEOUT, STRATEGIES
from pyfast_buffer.integrations.verl_mapping import DEFAULT_VERL_CAPACITY, read

DEFAULT_TIMEOUT_S = 600.0  # verl waits forever; a stuck rollout should fail a run, not hang it
DEFAULT_POLL_BACKOFF_MAX_S = 0.05  # TransferQueue has no change notification: poll 1 ms, doubling, capped here


class VerlConfigError(AssertionError, ValueError):
    """A bad setting where verl asserts: catchable as verl's AssertionError and as our ValueError."""


def _seconds(value: Any, name: str, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= maximum:
        raise ValueError(f"{name}={value!r} must be a number of seconds in (0, {maximum:g}]")
    return float(value)


def _positive_int(value: Any, name: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer; {fix}")
    return value


@dataclass(frozen=True)
class SamplerOptions:
    """Everything ``sample`` needs to know about its configuration."""

    max_off_policy_threshold: int
    max_off_policy_strategy: str
    filter_groups_metric: str | None
    train_batch_size: int | None
    gen_batch_size: int | None
    max_inflight_gen_batches: int
    sync_refill_failed_groups: bool
    timeout: float
    poll_backoff_max: float
    capacity: int
    ledger_metrics: bool


def parse(
    on_policy: bool,
    threshold: Any,
    strategy: Any,
    sampler_kwargs: Any,
    poll_interval: Any,
    refill_fn: Callable[[int], Any] | None,
    filter_groups_metric: str | None,
    train_batch_size: int | None,
    gen_batch_size: int | None,
    max_inflight_gen_batches: int,
    sync_refill_failed_groups: bool,
) -> SamplerOptions:
    """Checks every setting in verl's order (so the first error is the one verl would raise) and returns them."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0:
        raise VerlConfigError(
            f"max_off_policy_threshold={threshold!r} is invalid (Invalid max off policy threshold: {threshold}, "
            "must be an integer greater than 0); set trainer.v1.sampler.max_off_policy_threshold to an int >= 1"
        )
    if strategy not in STRATEGIES:
        raise VerlConfigError(
            f"max_off_policy_strategy={strategy!r} is invalid (Invalid max off policy strategy: {strategy}, "
            f"must be one of {list(STRATEGIES)}); set trainer.v1.sampler.max_off_policy_strategy to drop or wait"
        )
    if read(sampler_kwargs, "poll_interval") is not None:
        raise ValueError(
            "sampler_kwargs.poll_interval is no longer read: poll_interval is verl's own setting "
            "(the trainer's idle test); our poll backoff cap is sampler_kwargs.poll_backoff_max"
        )
    number = isinstance(poll_interval, (int, float)) and not isinstance(poll_interval, bool)
    if not number or not 0 <= poll_interval <= MAX_TIMEOUT:
        raise ValueError(f"poll_interval={poll_interval!r} must be a number of seconds >= 0 (verl's default is 2.0)")
    metric = filter_groups_metric if filter_groups_metric is not None else read(sampler_kwargs, "filter_groups_metric")
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(f"filter_groups_metric={metric!r} must be the name of a reward_extra_info entry, e.g. 'acc'")
    refill_failed = sync_refill_failed_groups or bool(read(sampler_kwargs, "sync_refill_failed_groups", False))
    if metric is not None and refill_fn is None:
        raise ValueError(
            "Group filtering (filter_groups_metric) requires refill_fn to replace evicted groups; "
            "pass the trainer's refill_fn or unset filter_groups_metric"
        )
    if refill_failed and refill_fn is None:
        raise ValueError(
            "sync_refill_failed_groups requires refill_fn to replace failed groups; "
            "pass the trainer's refill_fn or set sync_refill_failed_groups=False"
        )
    inflight = (
        max_inflight_gen_batches
        if max_inflight_gen_batches != 1
        else read(sampler_kwargs, "max_inflight_gen_batches", 1)
    )
    train_bs = train_batch_size if train_batch_size is not None else read(sampler_kwargs, "train_batch_size")
    gen_bs = gen_batch_size if gen_batch_size is not None else read(sampler_kwargs, "gen_batch_size")
    if gen_bs is None and (metric is not None or refill_failed):
        gen_bs = 1  # what verl's trainer passes its own buffer when it filters groups or refills failures
    if on_policy and metric is not None:
        _positive_int(
            inflight,
            "max_inflight_gen_batches",
            "set sampler_kwargs.max_inflight_gen_batches (prompt batches in flight under sync DAPO)",
        )
        _positive_int(train_bs, "train_batch_size", "set sampler_kwargs.train_batch_size to data.train_batch_size")
        _positive_int(gen_bs, "gen_batch_size", "set sampler_kwargs.gen_batch_size (1 under DAPO)")
    if on_policy and refill_failed and gen_bs != 1:
        raise ValueError(
            f"sync_refill_failed_groups requires gen_batch_size=1 (got {gen_bs!r}): failed groups "
            "are replaced one prompt at a time"
        )
    timeout = _seconds(read(sampler_kwargs, "timeout", DEFAULT_TIMEOUT_S), "sampler_kwargs.timeout", MAX_TIMEOUT)
    backoff = _seconds(
        read(sampler_kwargs, "poll_backoff_max", DEFAULT_POLL_BACKOFF_MAX_S), "sampler_kwargs.poll_backoff_max", 1.0
    )
    capacity = _positive_int(
        read(sampler_kwargs, "capacity", DEFAULT_VERL_CAPACITY),
        "sampler_kwargs.capacity",
        "it bounds batch_size (prompts per sample)",
    )
    ledger_metrics = read(sampler_kwargs, "ledger_metrics", False)
    if not isinstance(ledger_metrics, bool):
        raise TypeError(f"sampler_kwargs.ledger_metrics={ledger_metrics!r} must be true or false")
    return SamplerOptions(
        threshold,
        strategy,
        metric,
        train_bs,
        gen_bs,
        inflight,
        refill_failed,
        timeout,
        backoff,
        capacity,
        ledger_metrics,
    )
