"""The settings the slime integration reads from slime's ``args`` (or the environment), checked once.

slime has no flag for a staleness bound (slime/utils/arguments.py at 624b824a8 has none; issues #1800, #2278 and
#2092 ask for one), so ours are plain attributes of ``args``. slime sets any attribute from the YAML file given to
``--custom-config-path``; the environment variables serve where a YAML file is awkward (they must reach the
RolloutManager's Ray actor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from pyfast_buffer.integrations._slime_family import resolve_strategy

WHERE = "pyfast_buffer.integrations.slime"
STRATEGY_ENV = "PYFAST_BUFFER_STRATEGY"
MAX_AGE_ENV = "PYFAST_BUFFER_MAX_AGE"
DEFAULT_STRATEGY = "pace"
#: Outstanding groups allowed when slime's args give no rollout_batch_size (only slime's contract stubs do that).
FALLBACK_CAPACITY = 4096


@dataclass(frozen=True)
class SlimeOptions:
    strategy: str
    max_age: int
    #: rollout_batch_size: the groups one rollout call takes, pace's prompts_per_step (None when args lack it).
    per_step: Optional[int]
    #: The most groups in flight plus ready at once; the data source refuses prompts beyond it.
    capacity: int
    #: Seconds one rollout call may wait for its batch before raising TimeoutError (None: no limit).
    take_timeout: Optional[float]
    n_samples_per_prompt: int


def _int_at_least(value: Any, name: str, low: int, fix: str) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{WHERE}: {name}={value!r} must be an int >= {low}; {fix}")
    return value


def read_options(args: Any) -> SlimeOptions:
    """Reads and checks our settings; each error names the setting and how to set it."""
    if args is None:
        raise TypeError(f"{WHERE}: args is None; slime passes its parsed args (the Namespace from parse_args)")
    raw = getattr(args, "pyfast_buffer_strategy", None) or os.environ.get(STRATEGY_ENV) or DEFAULT_STRATEGY
    strategy = resolve_strategy(raw, f"{WHERE} (args.pyfast_buffer_strategy or ${STRATEGY_ENV})")
    raw_age = getattr(args, "pyfast_buffer_max_age", None)
    if raw_age is None:
        raw_age = os.environ.get(MAX_AGE_ENV)
    set_age = f"set pyfast_buffer_max_age in the --custom-config-path YAML (or ${MAX_AGE_ENV})"
    if raw_age is None:
        raise ValueError(f"{WHERE}: no staleness bound: pyfast_buffer_max_age is unset; {set_age}")
    max_age = _int_at_least(raw_age, "pyfast_buffer_max_age", 0, set_age)
    per_step = getattr(args, "rollout_batch_size", None)
    if per_step is not None:
        per_step = _int_at_least(per_step, "--rollout-batch-size", 1, "pass --rollout-batch-size N with N >= 1")
    elif strategy == "pace":
        raise ValueError(f"{WHERE}: strategy 'pace' needs --rollout-batch-size (the groups trained per rollout)")
    capacity = getattr(args, "pyfast_buffer_capacity", None)
    if capacity is None:
        # Enough for every group trainable within the bound plus one rollout of slack; more would only go stale.
        capacity = (max_age + 2) * per_step if per_step else FALLBACK_CAPACITY
    capacity = _int_at_least(capacity, "pyfast_buffer_capacity", 1, "set it in the --custom-config-path YAML")
    if per_step is not None and capacity < per_step:
        # The data source refuses prompts past the capacity (in flight plus ready), and a rollout call takes its
        # whole batch at once: a batch larger than the capacity could never be complete, and the call would wait
        # for it forever.
        raise ValueError(
            f"{WHERE}: pyfast_buffer_capacity={capacity} is below --rollout-batch-size={per_step}, the groups one "
            f"rollout call takes at once, so no call could ever complete; set pyfast_buffer_capacity >= {per_step} "
            "(or leave it unset: (max_age + 2) x the batch)"
        )
    timeout = getattr(args, "pyfast_buffer_take_timeout", None)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"{WHERE}: pyfast_buffer_take_timeout={timeout!r} must be seconds > 0, or unset (no limit)")
    n = _int_at_least(getattr(args, "n_samples_per_prompt", 1), "--n-samples-per-prompt", 1, "pass N >= 1")
    return SlimeOptions(strategy, max_age, per_step, capacity, None if timeout is None else float(timeout), n)
