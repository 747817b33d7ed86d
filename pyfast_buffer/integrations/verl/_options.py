"""The verl sampler's settings, read from its constructor, verl's own keys and ``sampler_kwargs``, checked once.

verl hands a custom sampler only ``trainer_mode, trainer_config, max_off_policy_threshold,
max_off_policy_strategy, sampler_kwargs`` and ``refill_fn``. The options it gives its own buffer as arguments
(DAPO from ``algorithm.filter_groups``, ``trainer.v1.sampler.sync_refill_failed_groups``, the batch sizes) are
read from the trainer that ``refill_fn`` is bound to (``_trainer_keys``). Where verl's keys are not reachable
(a sampler built by hand), the constructor arguments and then the ``sampler_kwargs`` entries of the same names
are read, as before. A setting given twice must agree; one the sampler cannot honour is refused here, naming
the keys and the fix, never at step 1.

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pyfast_buffer._args import MAX_TIMEOUT
from pyfast_buffer.integrations.verl._trainer_keys import MANAGER_FQN, MANAGER_KEY, VerlKeys, verl_keys
from pyfast_buffer.verl_mapping import DEFAULT_VERL_CAPACITY, VERL_STRATEGIES, read

logger = logging.getLogger("pyfast_buffer.verl")

DEFAULT_TIMEOUT_S = 600.0  # verl waits forever; a stuck rollout should fail a run, not hang it
DEFAULT_POLL_BACKOFF_MAX_S = 0.05  # TransferQueue has no change notification: poll 1 ms, doubling, capped here
#: Where a group's age is counted from (docs/verl.md, "Staleness from generation versions").
AGE_FROM = ("dispatch", "generation_start", "generation_finish")
SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs"
#: Every ``sampler_kwargs`` key the sampler reads (``poll_interval`` only to refuse it with its replacement).
KNOWN_SAMPLER_KWARGS = frozenset(
    {
        "age_from",
        "capacity",
        "filter_groups_metric",
        "gen_batch_size",
        "ledger_metrics",
        "lookahead",
        "max_inflight_gen_batches",
        "poll_backoff_max",
        "poll_interval",
        "prompts_per_step",
        "sync_refill_failed_groups",
        "timeout",
        "train_batch_size",
    }
)


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

    max_off_policy_threshold: Optional[int]  # None: verl 0.9.1's "no staleness control"
    max_off_policy_strategy: str
    filter_groups_metric: Optional[str]
    train_batch_size: Optional[int]
    gen_batch_size: Optional[int]
    max_inflight_gen_batches: int
    sync_refill_failed_groups: bool
    timeout: float
    poll_backoff_max: float
    capacity: int
    ledger_metrics: bool
    age_from: str = "dispatch"
    prompts_per_step: Optional[int] = None  # pace: the prompt groups one trainer step takes
    lookahead: Optional[int] = None  # pace: steps generation may run ahead (default max_age)
    verl_keys: VerlKeys = field(default_factory=VerlKeys)

    @property
    def max_age(self) -> Optional[int]:
        """verl's cutoff as an age: ``threshold - 1`` (None without a threshold)."""
        return None if self.max_off_policy_threshold is None else self.max_off_policy_threshold - 1


def _check_known_keys(sampler_kwargs: Any) -> None:
    """Refuses a ``sampler_kwargs`` key the sampler does not read: a misspelled ``timout`` would otherwise leave
    ``timeout`` at its default without a word."""
    if sampler_kwargs is None:
        return
    if not isinstance(sampler_kwargs, Mapping) and not hasattr(sampler_kwargs, "keys"):
        raise TypeError(f"{SAMPLER_KWARGS}={sampler_kwargs!r} must be a mapping of settings (a dict or a config node)")
    unknown = sorted(str(k) for k in sampler_kwargs.keys() if k not in KNOWN_SAMPLER_KWARGS)  # noqa: SIM118 (a config node)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(KNOWN_SAMPLER_KWARGS), n=1)
            hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        raise VerlConfigError(
            f"{SAMPLER_KWARGS} has keys the sampler does not read: {', '.join(hints)}; remove or rename them "
            f"(it reads {', '.join(sorted(KNOWN_SAMPLER_KWARGS))})"
        )


def _check_threshold_and_strategy(threshold: Any, strategy: Any) -> None:
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0):
        raise VerlConfigError(
            f"max_off_policy_threshold={threshold!r} is invalid (Invalid max off policy threshold: {threshold}, "
            "must be an integer greater than 0, or null to disable off-policy version control); set "
            "trainer.v1.sampler.max_off_policy_threshold to an int >= 1, or null"
        )
    if strategy not in VERL_STRATEGIES:
        raise VerlConfigError(
            f"max_off_policy_strategy={strategy!r} is invalid (Invalid max off policy strategy: {strategy}, "
            f"must be one of {list(VERL_STRATEGIES)}); set trainer.v1.sampler.max_off_policy_strategy to one of them"
        )


def _one_source(name: str, verl_key: str, verl_value: Any, kwargs_value: Any) -> Any:
    """verl's value of a setting, refusing a ``sampler_kwargs`` entry that says otherwise."""
    if kwargs_value is not None and kwargs_value != verl_value:
        raise VerlConfigError(
            f"{SAMPLER_KWARGS}.{name}={kwargs_value!r} contradicts {verl_key}={verl_value!r}; verl's key is the one "
            f"verl's trainer acts on: remove {SAMPLER_KWARGS}.{name}"
        )
    return verl_value


def _dapo_and_refills(
    on_policy: bool, keys: VerlKeys, sampler_kwargs: Any, metric_arg: Optional[str], refill_arg: bool
) -> tuple[Optional[str], bool]:
    """The DAPO metric and sync_refill_failed_groups: the constructor's, else verl's keys, else sampler_kwargs."""
    kw_metric = read(sampler_kwargs, "filter_groups_metric")
    kw_refill = read(sampler_kwargs, "sync_refill_failed_groups")
    if not keys.found:
        metric = metric_arg if metric_arg is not None else kw_metric
        return metric, bool(refill_arg or kw_refill)
    if keys.filter_enable:
        if not keys.filter_metric:
            raise ValueError(
                "algorithm.filter_groups.metric must be set when group filtering is enabled "
                "(algorithm.filter_groups.enable=true); set it to a reward_extra_info key such as acc, or reward"
            )
        metric = _one_source("filter_groups_metric", "algorithm.filter_groups.metric", keys.filter_metric, kw_metric)
        if keys.reward_model_enable and not keys.reward_resource_pool:
            raise VerlConfigError(
                "algorithm.filter_groups needs the reward metric at sampling time, but reward.reward_model.enable=true "
                "with reward.reward_model.enable_resource_pool=false computes rewards only after sampling: use a "
                "rule-based reward or set reward.reward_model.enable_resource_pool=true"
            )
        if keys.max_num_gen_batches > 0:
            logger.warning(
                "algorithm.filter_groups.max_num_gen_batches=%s is ignored (as by verl's own buffer); "
                "algorithm.filter_groups.max_inflight_gen_batches bounds sync DAPO generation",
                keys.max_num_gen_batches,
            )
    elif kw_metric is not None and on_policy:
        raise VerlConfigError(
            f"{SAMPLER_KWARGS}.filter_groups_metric={kw_metric!r} is set but algorithm.filter_groups.enable is false: "
            "verl's sync trainer sizes its dataloader from its own keys (data.gen_batch_size is forced to 1 only when "
            "algorithm.filter_groups.enable=true), so the first refill would fail; set "
            f"algorithm.filter_groups.enable=true and algorithm.filter_groups.metric={kw_metric} instead, and remove "
            f"{SAMPLER_KWARGS}.filter_groups_metric"
        )
    else:
        metric = kw_metric
    refill = keys.sync_refill_failed_groups
    if kw_refill is not None and bool(kw_refill) != refill:
        if on_policy or refill:
            raise VerlConfigError(
                f"{SAMPLER_KWARGS}.sync_refill_failed_groups={kw_refill!r} contradicts "
                f"trainer.v1.sampler.sync_refill_failed_groups={refill!r}; verl sizes its dataloader from its own key: "
                "set trainer.v1.sampler.sync_refill_failed_groups and remove "
                f"{SAMPLER_KWARGS}.sync_refill_failed_groups"
            )
        refill = bool(kw_refill)  # async: verl's dataloader fetches one prompt at a time anyway
    return (metric_arg if metric_arg is not None else metric), bool(refill_arg or refill)


def _batch_sizes(
    on_policy: bool, keys: VerlKeys, sampler_kwargs: Any, args: tuple, metric: Optional[str], refill: bool
) -> tuple[Optional[int], Optional[int], int]:
    """(train_batch_size, gen_batch_size, max_inflight_gen_batches), with verl's keys first when reachable."""
    train_arg, gen_arg, inflight_arg = args
    kw_train, kw_gen = read(sampler_kwargs, "train_batch_size"), read(sampler_kwargs, "gen_batch_size")
    kw_inflight = read(sampler_kwargs, "max_inflight_gen_batches")
    if keys.found:
        train = _one_source("train_batch_size", "data.train_batch_size", keys.train_batch_size, kw_train)
        gen = _one_source(
            "gen_batch_size", "data.gen_batch_size (after verl's dataloader)", keys.dataloader_batch(), kw_gen
        )
        inflight = keys.max_inflight_gen_batches if keys.filter_enable else 1
        if keys.filter_enable:
            inflight = _one_source(
                "max_inflight_gen_batches", "algorithm.filter_groups.max_inflight_gen_batches", inflight, kw_inflight
            )
        elif kw_inflight is not None:
            inflight = kw_inflight
    else:
        train, gen = kw_train, kw_gen
        inflight = read(sampler_kwargs, "max_inflight_gen_batches", 1)
    train = train_arg if train_arg is not None else train
    gen = gen_arg if gen_arg is not None else gen
    inflight = inflight_arg if inflight_arg != 1 else inflight
    if gen is None and (metric is not None or refill):
        gen = 1  # what verl's trainer passes its own buffer when it filters groups or refills failures
    if on_policy and metric is not None:
        _positive_int(inflight, "max_inflight_gen_batches", "set algorithm.filter_groups.max_inflight_gen_batches")
        _positive_int(train, "train_batch_size", "set data.train_batch_size")
        _positive_int(gen, "gen_batch_size", "verl uses 1 under DAPO")
    if on_policy and refill and gen != 1:
        raise ValueError(
            f"sync_refill_failed_groups requires gen_batch_size=1 (got {gen!r}): failed groups are replaced one "
            "prompt at a time; set trainer.v1.sampler.sync_refill_failed_groups=true (verl then forces "
            "data.gen_batch_size=1)"
        )
    return train, gen, inflight


def _pace(on_policy: bool, threshold: Optional[int], keys: VerlKeys, sampler_kwargs: Any) -> tuple[int, int]:
    """(prompts_per_step, lookahead) under pace, checked against verl's batch size and manager key."""
    if threshold is None:
        raise VerlConfigError(
            "max_off_policy_strategy=pace bounds the age of what is trained, but max_off_policy_threshold is null "
            "(no bound); set trainer.v1.sampler.max_off_policy_threshold to an int >= 1, or use drop or wait"
        )
    kw_per_step = read(sampler_kwargs, "prompts_per_step")
    if keys.found:
        per_step = _one_source("prompts_per_step", "data.train_batch_size", keys.train_batch_size, kw_per_step)
        if not on_policy and not _names_our_manager(keys.manager_class):
            raise VerlConfigError(
                f"max_off_policy_strategy=pace admits prompts before generation, which only our agent-loop manager "
                f"can do inside verl, but {MANAGER_KEY}={keys.manager_class!r}; set "
                f"+{MANAGER_KEY}={MANAGER_FQN} (or a subclass), or use drop or wait"
            )
    else:
        per_step = kw_per_step
    per_step = _positive_int(
        per_step, "prompts_per_step", f"set {SAMPLER_KWARGS}.prompts_per_step to data.train_batch_size"
    )
    lookahead = read(sampler_kwargs, "lookahead", threshold - 1)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or not 0 <= lookahead <= threshold - 1:
        raise ValueError(
            f"{SAMPLER_KWARGS}.lookahead={lookahead!r} must be an int in [0, max_off_policy_threshold - 1 = "
            f"{threshold - 1}]: the steps generation may run ahead of training"
        )
    return per_step, lookahead


def _names_our_manager(fqn: Any) -> bool:
    """Whether ``fqn`` names PacedAgentLoopManager or a subclass (imports it, as verl will)."""
    if fqn == MANAGER_FQN:
        return True
    if not isinstance(fqn, str) or "." not in fqn:
        return False
    import importlib

    module, _, name = fqn.rpartition(".")
    try:
        from pyfast_buffer.integrations.verl._manager import PacedAgentLoopManager

        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, PacedAgentLoopManager)


def parse(
    on_policy: bool,
    threshold: Any,
    strategy: Any,
    sampler_kwargs: Any,
    poll_interval: Any,
    refill_fn: Optional[Callable[[int], Any]],
    filter_groups_metric: Optional[str],
    train_batch_size: Optional[int],
    gen_batch_size: Optional[int],
    max_inflight_gen_batches: int,
    sync_refill_failed_groups: bool,
) -> SamplerOptions:
    """Checks every setting in verl's order (so the first error is the one verl would raise) and returns them."""
    _check_threshold_and_strategy(threshold, strategy)
    _check_known_keys(sampler_kwargs)
    if read(sampler_kwargs, "poll_interval") is not None:
        raise ValueError(
            "sampler_kwargs.poll_interval is no longer read: poll_interval is verl's own setting "
            "(the trainer's idle test); our poll backoff cap is sampler_kwargs.poll_backoff_max"
        )
    number = isinstance(poll_interval, (int, float)) and not isinstance(poll_interval, bool)
    if not number or not 0 <= poll_interval <= MAX_TIMEOUT:
        raise ValueError(f"poll_interval={poll_interval!r} must be a number of seconds >= 0 (verl's default is 2.0)")
    keys = verl_keys(refill_fn)
    metric, refill_failed = _dapo_and_refills(
        on_policy, keys, sampler_kwargs, filter_groups_metric, sync_refill_failed_groups
    )
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(f"filter_groups_metric={metric!r} must be the name of a reward_extra_info entry, e.g. 'acc'")
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
    train_bs, gen_bs, inflight = _batch_sizes(
        on_policy,
        keys,
        sampler_kwargs,
        (train_batch_size, gen_batch_size, max_inflight_gen_batches),
        metric,
        refill_failed,
    )
    per_step, lookahead = _pace(on_policy, threshold, keys, sampler_kwargs) if strategy == "pace" else (None, None)
    age_from = read(sampler_kwargs, "age_from", "dispatch")
    if age_from not in AGE_FROM:
        raise ValueError(f"{SAMPLER_KWARGS}.age_from={age_from!r} is unknown; use one of {list(AGE_FROM)}")
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
        age_from,
        per_step,
        lookahead,
        keys,
    )
