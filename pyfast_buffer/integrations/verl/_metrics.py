"""verl's metric names and values: the eviction metrics a ``sample`` returns and the DAPO group metric.

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

DAPO_FILTERED_REWARD_COUNTS_KEY = "_dapo_filtered_reward_counts"  # verl's name; a dict {metric value: groups}
LEDGER_PREFIX = "pyfast_buffer"  # ledger metrics: {training|validation}/pyfast_buffer/<counter>
VAL = "val"  # verl's validation partition: never evicts
#: verl 0.9.1's DAPO metric name that reads the canonical pre-KL reward (the sum of ``rm_scores``) instead of
#: ``extra_fields.reward_extra_info`` (verl main at 1dda039b reads ``reward_extra_info["reward"]``; see docs/verl.md).
CANONICAL_REWARD_METRIC = "reward"


def metrics_prefix(partition_id: str) -> str:
    """verl reports the ``train`` partition under ``training/`` and every other under ``validation/``."""
    return "training" if partition_id == "train" else "validation"


def _accumulate_eviction_metrics(acc: dict, new: dict, stale_count: int) -> None:
    """Adds one eviction pass's metrics to ``acc``: counts add, value counts merge, and the staleness
    mean stays a mean over every stale group (weighted by ``stale_count``, this pass's stale groups)."""
    count_key = next((k for k in new if k.endswith("/off_policy/evicted_samples")), None)
    before = acc.get(count_key, 0) if count_key else 0
    for key, value in new.items():
        if key.endswith("/evicted_samples_staleness/mean"):
            total = before + stale_count
            acc[key] = (acc.get(key, 0.0) * before + value * stale_count) / total if total else value
        elif key.endswith("/evicted_samples_staleness/max"):
            acc[key] = max(acc.get(key, value), value)
        elif key.endswith("/evicted_samples_staleness/min"):
            acc[key] = min(acc.get(key, value), value)
        elif key == DAPO_FILTERED_REWARD_COUNTS_KEY:
            merged = Counter(acc.get(key, {}))
            merged.update(value)
            acc[key] = dict(merged)
        else:
            acc[key] = acc.get(key, 0) + value


def metric_field(metric: str) -> str:
    """The TransferQueue field a DAPO metric is read from: ``rm_scores`` for verl's canonical ``reward``."""
    return "rm_scores" if metric == CANONICAL_REWARD_METRIC else "extra_fields"


def metric_value(value: Any, metric: str) -> Optional[float]:
    """One trajectory's DAPO metric from its ``metric_field(metric)`` value, or None when it is missing.

    ``reward`` sums the token-level ``rm_scores`` (verl writes the score at the last response token);
    any other name reads ``extra_fields["reward_extra_info"][metric]``.
    """
    if metric == CANONICAL_REWARD_METRIC:
        return None if value is None else float(value.sum().item())
    value = getattr(value, "data", value)  # TransferQueue may wrap non-tensor values
    info = value.get("reward_extra_info", {}) if isinstance(value, dict) else {}
    return float(info[metric]) if isinstance(info, dict) and metric in info else None


def missing_metric_message(metric: str, uids: list) -> str:
    where = "rm_scores" if metric == CANONICAL_REWARD_METRIC else "extra_fields.reward_extra_info"
    return (
        f"Finished groups are missing DAPO metric {metric!r} in {where}: {sorted(uids)[:5]}; the reward "
        "function must write it, or turn group filtering off (algorithm.filter_groups.enable=false)"
    )


def eviction_metrics(partition_id: str, spans: list, filtered: int, counts: Counter, failed: int) -> dict:
    """verl's metrics of one eviction pass: ``spans`` (staleness of each stale group), filtered and failed counts."""
    prefix = metrics_prefix(partition_id)
    metrics: dict = {}
    if spans:
        metrics[f"{prefix}/off_policy/evicted_samples"] = len(spans)
        metrics[f"{prefix}/off_policy/evicted_samples_staleness/mean"] = sum(spans) / len(spans)
        metrics[f"{prefix}/off_policy/evicted_samples_staleness/max"] = max(spans)
        metrics[f"{prefix}/off_policy/evicted_samples_staleness/min"] = min(spans)
    if filtered:
        metrics[f"{prefix}/filter_groups/evicted_samples"] = filtered
        metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] = dict(counts)
    if failed:
        metrics[f"{prefix}/rollout_failure/evicted_samples"] = failed
    return metrics
