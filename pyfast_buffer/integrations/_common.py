"""What the framework integrations share: checking a framework config's keys against our buffer's arguments, and
the metrics an integration reports (trajectory ages, the ledger, starvation and the bias monitor).

No framework import here.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, Iterable, Mapping, Optional

from pyfast_buffer.batch import metrics_prefix
from pyfast_buffer.buffer import StalenessBuffer

#: StalenessBuffer's constructor arguments, the keys a framework config may pass through to our buffer.
BUFFER_ARGUMENTS = tuple(p for p in inspect.signature(StalenessBuffer.__init__).parameters if p != "self")


def check_keys(given: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Raises a TypeError naming each key of ``given`` not in ``allowed``, with the nearest allowed one."""
    allowed = sorted(allowed)
    for key in given:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"{where}: unknown key {key!r}{hint} The keys it reads are: {', '.join(allowed)}")


def as_bool(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name}={value!r} must be true or false")
    return value


def ages_metrics(ages: Iterable[float]) -> Dict[str, float]:
    """The age of what was just trained, in trainer steps: mean and max (the metric NeMo RL #3758 asks for), under
    the library's metrics prefix (``pyfast_buffer.set_metrics_prefix``)."""
    values = [float(a) for a in ages]
    if not values:
        return {}
    prefix = metrics_prefix()
    return {f"{prefix}trajectory_age/mean": sum(values) / len(values), f"{prefix}trajectory_age/max": max(values)}


def buffer_metrics(buffer: Any, keys: Optional[Iterable[str]] = None) -> Dict[str, float]:
    """The buffer's ledger (every counter, or ``keys``) and its data metrics (starvation, the bias monitor's KS),
    under the library's metrics prefix."""
    prefix = metrics_prefix()
    wanted = None if keys is None else set(keys)
    out = {f"{prefix}{k}": float(v) for k, v in buffer.ledger().items() if wanted is None or k in wanted}
    out.update({k: float(v) for k, v in buffer.data_metrics().items()})
    return out
