"""The one place the experiment reads a take's metrics, so a rename of the keys is a one-line change here.

Issue 13 moves the buffer's metric names under a prefix (``batch.metrics["buffer/taken"]``) and puts the
name of the blocking cause on ``batch.blocked_by``. Both spellings are read, the prefixed one first.
"""

from __future__ import annotations

from typing import Any, Dict

#: The prefix the buffer puts on its metric names (issue 13); the bare names are read as a fallback.
PREFIX = "buffer/"


def metric(batch: Any, name: str) -> Any:
    """Returns the take's metric ``name`` (e.g. ``"age_mean"``), prefixed or not."""
    m = batch.metrics
    return m[PREFIX + name] if PREFIX + name in m else m[name]


def age_hist(batch: Any) -> Dict[str, int]:
    """The fixed-bucket age histogram as ``{"age_hist/<bucket>": count}``, whatever the prefix."""
    out = {}
    for key, value in batch.metrics.items():
        bare = key[len(PREFIX) :] if key.startswith(PREFIX) else key
        if bare.startswith("age_hist/"):
            out[bare] = value
    return out


def blocked_by(batch: Any) -> str:
    """Why a take returned short, by name ("" when it did not): ``batch.blocked_by`` if a name, else the metric."""
    name = getattr(batch, "blocked_by", None)
    if isinstance(name, str):
        return name
    value = metric(batch, "blocked_by")
    return value if isinstance(value, str) else str(value or "")
