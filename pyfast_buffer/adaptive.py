"""An adaptive staleness bound: sets a buffer's ``max_age`` between trainer steps from the trainer's own signals.

``AdaptiveMaxAge(buf, target_kl=0.01, min_age=1, max_age=8)`` and, after every optimiser step,
``buf_max_age = controller.update({"approx_kl": kl, "clip_frac": clip})``. It works with any object
whose ``max_age`` attribute can be read and assigned between calls (``StalenessBuffer``,
``ReferenceBuffer``), so it fits any training loop, not only ``pyfast-buffer experiment``.

The update rule (additive increase, multiplicative decrease, with a dead band and a cool-down)::

    x      = the step's clip fraction / target_clip, and/or approx KL / target_kl (the larger ratio)
    signal = (1 - smoothing) * signal + smoothing * x            # EMA; the first step sets it to x
    if a change happened less than `cooldown` steps ago:   hold
    elif signal > 1 + dead_band:   max_age = max(min_age, min(max_age - 1, floor(max_age * decrease)))
    elif signal < 1 - dead_band:   max_age = min(max_age_bound, max_age + increase)
    else:                          hold

Why this shape:
- Too loose a bound costs stability (ratios far from 1, a clipped and biased gradient) and the damage
  compounds, while too tight a bound only costs sample efficiency (data dropped). So the controller backs
  off fast (multiplicative) and probes for efficiency slowly (one step at a time): the AIMD rule, which
  also converges without oscillating wildly when the "right" value drifts.
- The per-step clip fraction and KL are noisy; without a dead band and the EMA, a signal sitting near
  the target would move the bound every step (a limit cycle). Inside ``[1 - dead_band, 1 + dead_band]`` of
  the target nothing changes: that is the hysteresis.
- A new bound shows in the metrics only once batches are drawn under it, so after a change the
  controller waits ``cooldown`` steps before it may change again.
- A non-finite metric (NaN/inf KL usually means the update blew up) counts as above the target.

What a change does to entries already in the buffer is the buffer's contract (docs/design.md): the next
take or ``evict_stale`` applies the new cutoff to every ready entry. Lowering the bound therefore drops
the entries now older than it at the next take (counted as ``dropped_stale``); raising it never revives
an entry that was already dropped.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Tuple

__all__ = ["AdaptiveMaxAge"]


def _positive(name: str, value: Optional[float], allow_none: bool = True) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0; pass e.g. {name}=0.01")
    return float(value)


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


class AdaptiveMaxAge:
    """Sets ``buffer.max_age`` from the trainer's clip fraction and/or approx KL, within ``[min_age, max_age]``.

    Args:
        buffer: anything with a readable and assignable int ``max_age`` (StalenessBuffer, ReferenceBuffer).
        target_clip: the clip fraction to hold (share of tokens with ``|ratio - 1| > clip_eps``).
        target_kl: the approx KL (to the behaviour policy) to hold. At least one target is required;
            with both, the bound falls when either is above its band and rises only when both are below.
        min_age, max_age: the bounds the controller never leaves (ints, ``0 <= min_age <= max_age``).
        initial: the starting bound (default: the buffer's current ``max_age``, clipped into the bounds);
            it is written to the buffer at construction if it differs.
        dead_band: relative half-width of the no-change band around the target (0.25 = +-25 %).
        decrease: factor in (0, 1) applied on a decrease (always at least one step down).
        increase: steps added on an increase (int >= 1).
        smoothing: EMA weight of the newest step's signal, in (0, 1].
        cooldown: steps to hold after a change (int >= 0).
        clip_key, kl_key: the metric names ``update`` reads.
    """

    def __init__(
        self,
        buffer: Any,
        *,
        target_clip: Optional[float] = None,
        target_kl: Optional[float] = None,
        min_age: int = 1,
        max_age: int = 16,
        initial: Optional[int] = None,
        dead_band: float = 0.25,
        decrease: float = 0.5,
        increase: int = 1,
        smoothing: float = 0.3,
        cooldown: int = 2,
        clip_key: str = "clip_frac",
        kl_key: str = "approx_kl",
    ) -> None:
        try:
            current = buffer.max_age
        except AttributeError:
            raise TypeError(
                f"buffer {type(buffer).__name__} has no max_age attribute; pass a buffer whose max_age "
                "can be set between calls (StalenessBuffer or ReferenceBuffer)"
            ) from None
        self.target_clip = _positive("target_clip", target_clip)
        self.target_kl = _positive("target_kl", target_kl)
        if self.target_clip is None and self.target_kl is None:
            raise ValueError("no target: pass target_clip=... and/or target_kl=... (e.g. target_kl=0.01)")
        self.min_age = _count("min_age", min_age, 0)
        self.max_age = _count("max_age", max_age, 0)
        if self.min_age > self.max_age:
            raise ValueError(f"min_age={min_age} is above max_age={max_age}; pass min_age <= max_age")
        if initial is None:
            initial = min(self.max_age, max(self.min_age, int(current)))
        _count("initial", initial, 0)
        if not self.min_age <= initial <= self.max_age:
            raise ValueError(
                f"initial={initial} is outside [min_age, max_age] = [{min_age}, {max_age}]; "
                "pass a value inside the bounds"
            )
        if isinstance(dead_band, bool) or not isinstance(dead_band, (int, float)) or not 0 <= dead_band < 1:
            raise ValueError(f"dead_band={dead_band!r} must be in [0, 1); pass e.g. 0.25 (+-25 % around the target)")
        if isinstance(decrease, bool) or not isinstance(decrease, (int, float)) or not 0 < decrease < 1:
            raise ValueError(f"decrease={decrease!r} must be in (0, 1); pass e.g. 0.5 (halve on a decrease)")
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 < smoothing <= 1:
            raise ValueError(f"smoothing={smoothing!r} must be in (0, 1]; pass e.g. 0.3 (1 = no smoothing)")
        self.increase = _count("increase", increase, 1)
        self.cooldown = _count("cooldown", cooldown, 0)
        self.dead_band, self.decrease, self.smoothing = float(dead_band), float(decrease), float(smoothing)
        self.clip_key, self.kl_key = clip_key, kl_key
        self.buffer = buffer
        self.value = initial
        self.signal: Optional[float] = None  # EMA of (metric / target); 1.0 = on target
        self.changes = 0
        self.history: List[Tuple[float, int]] = []  # (signal, max_age after the update), one per update
        self._hold = 0
        if int(current) != initial:
            buffer.max_age = initial

    def _ratio(self, metrics: Mapping[str, Any]) -> float:
        ratios = []
        for key, target in ((self.clip_key, self.target_clip), (self.kl_key, self.target_kl)):
            if target is None:
                continue
            if key not in metrics:
                raise KeyError(
                    f"metrics has no {key!r} (have: {', '.join(sorted(map(str, metrics)))}); pass the "
                    f"trainer's step metrics, or set {'clip_key' if key == self.clip_key else 'kl_key'}="
                )
            value = float(metrics[key])
            ratios.append(value / target if math.isfinite(value) else math.inf)
        return max(ratios)

    def update(self, metrics: Mapping[str, Any]) -> int:
        """Feeds one trainer step's metrics; sets and returns the buffer's new ``max_age``."""
        x = self._ratio(metrics)
        if self.signal is None or not math.isfinite(x) or not math.isfinite(self.signal):
            self.signal = x
        else:
            self.signal = (1.0 - self.smoothing) * self.signal + self.smoothing * x
        new = self.value
        if self._hold > 0:
            self._hold -= 1
        elif self.signal > 1.0 + self.dead_band:
            new = max(self.min_age, min(self.value - 1, math.floor(self.value * self.decrease)))
        elif self.signal < 1.0 - self.dead_band:
            new = min(self.max_age, self.value + self.increase)
        if new != self.value:
            self.buffer.max_age = new
            self.value = new
            self.changes += 1
            self._hold = self.cooldown
        self.history.append((self.signal, self.value))
        return self.value
