"""What pyfast_buffer knows of verl's configuration, in one place: its defaults and how they map.

``config_from_verl`` turns verl's ``trainer.v1.sampler`` block into ``StalenessBuffer`` arguments,
``max_age_from_threshold`` is verl's cutoff as a ``max_age`` and ``sample_step_from_tag`` reads a
trajectory tag's step. The library re-exports them (``pyfast_buffer.config_from_verl`` ...); the verl
sampler (``integrations/verl/``) and the ``rhythm`` command read the same defaults from here.

No third-party import (no verl, omegaconf or TransferQueue: a config is read through ``get`` or
attributes), and absolute imports only: verl may load the sampler, which imports this, by file path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyfast_buffer._args import STRATEGIES, as_count, as_step

#: The strategies verl's sampler option can select (``pace`` inside verl needs ``PacedAgentLoopManager``, docs/verl.md).
VERL_STRATEGIES = ("drop", "wait", "pace")
#: verl's ``max_off_policy_threshold`` default.
DEFAULT_VERL_THRESHOLD = 8
#: Ring capacity when verl's ``sampler_kwargs`` sets none (from_verl's and the verl sampler's default).
DEFAULT_VERL_CAPACITY = 1 << 16


def read(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` from a dict, an omegaconf DictConfig (both have ``get``) or an attribute object; None
    (and a missing ``cfg``) counts as absent."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, Mapping) or hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def max_age_from_threshold(max_off_policy_threshold: Any) -> int:
    """Returns verl's cutoff as a max_age: ``max_off_policy_threshold - 1``.

    verl's replay buffers (main branch, 2026-08) evict a finished group when
    ``global_steps - step + 1 > threshold`` and, under ``wait``, hold sampling while an in-flight
    prompt has ``global_steps - step + 1 >= threshold``; with ``current_step = global_steps`` both are
    ``age > max_age`` and ``age >= max_age`` for this max_age. (verl PR #6778 divided the span by
    ``parameter_sync_step``; today's verl does not, and neither does this mapping.)
    """
    threshold = as_count(max_off_policy_threshold, "max_off_policy_threshold", 1)
    return threshold - 1


def config_from_verl(sampler_cfg: Any, trainer_cfg: Any, **overrides: Any) -> dict:
    """Returns ``StalenessBuffer`` keyword arguments equivalent to verl's sampler settings.

    Reads ``max_off_policy_threshold`` (default 8) and ``max_off_policy_strategy``
    (default ``"drop"``) from ``sampler_cfg``; ``current_step`` is verl's ``global_steps``, which
    advances once per weight push, so ``policy_version`` is stamped as the step. ``parameter_sync_step``
    in ``trainer_cfg``, if present, is checked (an int >= 1, as verl asserts) but does not enter the
    cutoff, as in today's verl. ``sampler_kwargs.capacity`` or ``overrides`` may set any other argument.
    """
    threshold = read(sampler_cfg, "max_off_policy_threshold", DEFAULT_VERL_THRESHOLD)
    strategy = read(sampler_cfg, "max_off_policy_strategy", "drop")
    sync = read(trainer_cfg, "parameter_sync_step", 1)
    if _is_null(sampler_cfg, "max_off_policy_threshold") and "max_age" not in overrides:
        raise ValueError(
            "max_off_policy_threshold=null turns verl's staleness control off, but a StalenessBuffer always bounds "
            "age: set max_off_policy_threshold to an int >= 1, or pass max_age= to from_verl"
        )
    if not isinstance(threshold, int) or isinstance(threshold, bool):
        raise TypeError(
            f"max_off_policy_threshold={threshold!r} is not an int; set it to an int >= 1 (verl's default is 8)"
        )
    if not isinstance(sync, int) or isinstance(sync, bool) or sync <= 0:
        raise ValueError(
            f"parameter_sync_step={sync!r} must be an int >= 1; it is the number of trainer steps between weight pushes"
        )
    if strategy not in STRATEGIES:
        raise ValueError(f"max_off_policy_strategy={strategy!r} is unknown; use 'drop', 'wait' or 'pace'")
    sampler_kwargs = read(sampler_cfg, "sampler_kwargs", None)
    kwargs = {
        "capacity": read(sampler_kwargs, "capacity", DEFAULT_VERL_CAPACITY),
        "max_age": max_age_from_threshold(threshold),
        "strategy": strategy,
        # verl pushes weights once per global step, so the weight version is the step itself.
        "parameter_sync_step": 1,
    }
    if strategy == "pace":  # the prompt groups one trainer step takes: verl's data.train_batch_size
        for key in ("prompts_per_step", "lookahead"):
            if read(sampler_kwargs, key) is not None:
                kwargs[key] = read(sampler_kwargs, key)
        if "prompts_per_step" not in kwargs and "prompts_per_step" not in overrides:
            raise ValueError(
                "max_off_policy_strategy='pace' needs the prompt groups one trainer step takes: set "
                "sampler_kwargs.prompts_per_step (verl's data.train_batch_size) or pass prompts_per_step="
            )
    kwargs.update(overrides)
    return kwargs


def _is_null(cfg: Any, key: str) -> bool:
    """Whether ``cfg`` has ``key`` set to None (verl 0.9.1's null threshold), as opposed to not having it."""
    if cfg is None:
        return False
    if isinstance(cfg, Mapping) or hasattr(cfg, "keys"):
        return key in cfg and cfg[key] is None
    return hasattr(cfg, key) and getattr(cfg, key) is None


def sample_step_from_tag(tag: Any) -> int:
    """Returns a verl trajectory tag's ``global_steps`` as an int, or raises a ValueError that says how to fix it.

    verl's ReplayBuffer indexes ``tag["global_steps"]`` directly, so a tag written
    without it fails as a bare KeyError far from its cause.
    """
    if not isinstance(tag, Mapping) and not hasattr(tag, "get"):
        raise TypeError(f"tag={tag!r} is not a mapping; pass the trajectory's TransferQueue tag dict")
    step = tag.get("global_steps")
    if step is None:
        raise ValueError(
            f"trajectory tag {dict(tag)!r} has no 'global_steps'; stamp global_steps "
            "(the step of the weights that produced it) when the prompt is dispatched"
        )

    return as_step(step, "tag['global_steps']")
