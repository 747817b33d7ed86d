"""The one place the experiment reads a take's metrics (keys under the buffer's metrics prefix)."""

from __future__ import annotations

from typing import Any, Dict

from ..batch import metric_key, metrics_prefix


def metric(batch: Any, name: str) -> Any:
    """Returns the take's metric ``name`` (e.g. ``"age_mean"``), whatever the metrics prefix."""
    return batch.metrics[metric_key(name)]


def age_hist(batch: Any) -> Dict[str, int]:
    """The fixed-bucket age histogram as ``{"age_hist/<bucket>": count}``, whatever the metrics prefix."""
    start = metrics_prefix() + "age_hist/"
    return {key[len(metrics_prefix()) :]: value for key, value in batch.metrics.items() if key.startswith(start)}


def blocked_by(batch: Any) -> str:
    """Why a take returned short, by name (``batch.blocked_by``: "none", "too_few_ready", ...)."""
    return str(batch.blocked_by)
