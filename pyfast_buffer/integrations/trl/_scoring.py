"""A finished group turned into TRL's training rows: rewards, the group's advantages, ``RolloutSample``s.

The rules are TRL 1.16's (``_AsyncRolloutLoop._score_group``), so a group trains the same whichever worker made it:
every reward function sees the group's ``prompts``, ``completions``, ``completion_ids`` and the dataset row's other
columns (one copy per completion); a completion's reward is the sum over the functions, ``None`` counting as missing;
a completion no function could score keeps reward NaN and advantage 0; the others get ``(r - mean) / (std + 1e-8)``
over the scored ones. No TRL import here except ``RolloutSample`` itself, fetched when a group is built.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

#: Columns of a dataset row that are not passed to the reward functions (TRL passes them under their own names).
NOT_REWARD_KWARGS = frozenset({"prompt", "completion", "completion_ids"})
STD_EPS = 1e-8


def reward_name(func: Callable[..., Any]) -> str:
    """The name a reward function's column is logged under (``rewards/<name>``), as TRL names it."""
    name = getattr(func, "__name__", None)
    if name is None:
        inner = getattr(func, "func", None)  # functools.partial
        name = getattr(inner, "__name__", None) or type(func).__name__
    return str(name)


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names it (the group is failed, counted in ``groups_failed``)."""


async def _call(func: Callable[..., Any], kwargs: Dict[str, Any]) -> List[Any]:
    try:
        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
            return list(await func(**kwargs))
        return list(await asyncio.to_thread(func, **kwargs))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # named here: the log line of the failed group says which function to look at
        raise RewardFunctionError(f"reward function {reward_name(func)!r} raised {exc!r}") from exc


async def score(
    reward_funcs: Sequence[Callable[..., Any]],
    prompts: List[Any],
    completions: List[Any],
    completion_ids: List[List[int]],
    row: Dict[str, Any],
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(rewards, advantages, per_function)`` for one group: ``per_function`` is ``(functions, group)``."""
    n = len(completions)
    extra = {key: [value] * n for key, value in row.items() if key not in NOT_REWARD_KWARGS}
    kwargs = dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **extra)
    columns = await asyncio.gather(*[_call(func, kwargs) for func in reward_funcs])
    for func, column in zip(reward_funcs, columns):
        if len(column) != n:
            raise ValueError(
                f"reward function {reward_name(func)!r} returned {len(column)} rewards for a group of {n} "
                "completions; return one float (or None) per completion"
            )
    per_function = np.array([[math.nan if r is None else float(r) for r in column] for column in columns], float)
    unscored = np.all(np.isnan(per_function), axis=0)
    rewards = np.nansum(per_function, axis=0)
    rewards[unscored] = math.nan
    advantages = np.zeros(n)
    scored = ~unscored
    if scored.any():
        values = rewards[scored]
        advantages[scored] = (values - values.mean()) / (values.std() + STD_EPS)
    return rewards, advantages, per_function


def build_samples(
    prompt: Any,
    prompt_ids: List[int],
    completions: List[Any],
    completion_ids: List[List[int]],
    logprobs: List[List[float]],
    rewards: np.ndarray,
    advantages: np.ndarray,
    per_function: np.ndarray,
    names: Sequence[str],
    model_version: int,
    group_id: int,
) -> List[Any]:
    """One ``RolloutSample`` per completion, laid out as TRL lays them out: prompt then completion tokens, the mask 1
    on completion tokens only, the sampled log-probabilities there and 0 on the prompt."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    scored = rewards[~np.isnan(rewards)]
    reward_std = float(scored.std()) if scored.size else math.nan
    samples = []
    for i, ids in enumerate(completion_ids):
        if len(logprobs[i]) != len(ids):
            raise ValueError(
                f"complete() returned {len(ids)} token ids but {len(logprobs[i])} logprobs; return one logprob per "
                "completion token"
            )
        metrics = {"reward": float(rewards[i]), "reward_std": reward_std}
        metrics.update({f"rewards/{name}": float(per_function[j, i]) for j, name in enumerate(names)})
        samples.append(
            RolloutSample(
                prompt=prompt,
                completion=completions[i],
                input_ids=np.asarray(list(prompt_ids) + list(ids), dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt_ids) + [1] * len(ids), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt_ids) + list(logprobs[i]), dtype=np.float32),
                advantage=float(advantages[i]),
                model_version=model_version,
                group_id=group_id,
                metrics=metrics,
            )
        )
    return samples
