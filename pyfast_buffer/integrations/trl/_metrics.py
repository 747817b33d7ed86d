"""What the worker reports into TRL's logs through ``metrics_queue``, under ``pyfast_buffer/``.

TRL reduces a logging window's values by the key's last word (``_reduce_metric``): ``max`` is a maximum, anything
else a mean. The ledger and the worker's counts are cumulative, so the callback pushes them once per window (on the
step that logs), where the mean of one value is the value; the ages of the groups handed out are pushed every step.
"""

from __future__ import annotations

from typing import Any, Dict

PREFIX = "pyfast_buffer/"
#: The worker's own counts that reach the logs (docs/trl.md, "What is logged").
WORKER_COUNTS = (
    "groups_completed",
    "groups_delivered",
    "groups_dropped_stale",
    "groups_evicted",
    "groups_failed",
    "completion_retries",
    "stopped_in_flight",
    "samples_delivered",
    "delivered_over_age",
    "backpressure_ms",
)


def ages(worker: Any) -> Dict[str, float]:
    """Mean and max age (model versions) of the groups handed out since the last call; empties the list."""
    with worker._lock:
        values, worker._ages = worker._ages, []
    if not values:
        return {}
    return {f"{PREFIX}trajectory_age/mean": sum(values) / len(values), f"{PREFIX}trajectory_age/max": max(values)}


def totals(worker: Any) -> Dict[str, float]:
    """The buffer's ledger and the worker's counts, cumulative."""
    out = {f"{PREFIX}{key}": float(value) for key, value in worker.buffer.ledger().items()}
    out.update({f"{PREFIX}{key}": float(worker.counts[key]) for key in WORKER_COUNTS})
    return out


def step_metrics(worker: Any) -> Dict[str, float]:
    out = totals(worker)
    out.update(ages(worker))
    return out
