"""Arms from the command line: the cartesian product of the axis lists, or an explicit list."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar, Union

from .config import DEFAULT_ADAPTIVE_KL, STRATEGIES, ArmConfig

T = TypeVar("T")
AXIS_DEFAULTS = {"reuse": "1,2,4", "strategy": "drop", "max_age": "4", "lag": "0"}


def parse_list(text: str, name: str, convert: Callable[[str], T]) -> List[T]:
    """Parses ``"1,2,4"`` into ``[1, 2, 4]``; raises ValueError naming ``--name`` and the expected form."""
    if not str(text).strip():
        raise ValueError(
            f"--{name.replace('_', '-')} is empty; pass a comma-separated list such as {AXIS_DEFAULTS[name]!r}"
        )
    items = [part.strip() for part in str(text).split(",")]
    if not items or any(not part for part in items):
        raise ValueError(
            f"--{name.replace('_', '-')}={text!r} has an empty item; pass a comma-separated list "
            f"such as {AXIS_DEFAULTS[name]!r}"
        )
    try:
        values = [convert(part) for part in items]
    except ValueError as exc:
        kind = {str: "strategies", int: "ints"}.get(convert)  # type: ignore[call-overload]
        if kind is None:  # a converter with its own message (max_age's adaptive items)
            raise ValueError(f"--{name.replace('_', '-')}={text!r}: {exc}") from None
        raise ValueError(
            f"--{name.replace('_', '-')}={text!r} is not a comma-separated list of "
            f"{kind}; pass e.g. {AXIS_DEFAULTS[name]!r}"
        ) from None
    if len({repr(v) for v in values}) != len(values):
        raise ValueError(f"--{name.replace('_', '-')}={text!r} repeats a value; list each once")
    return values


MaxAge = Union[int, Dict[str, Any]]


def parse_max_age(item: str) -> MaxAge:
    """One ``--max-age`` item: an int, or ``adaptive[:TARGET]`` with TARGET ``0.01`` (approx KL), ``kl=0.01``,
    ``clip=0.05`` or ``kl=0.01+clip=0.05``; returns the int or the ArmConfig fields of an adaptive arm."""
    item = item.strip()
    if not item.startswith("adaptive"):
        try:
            return int(item)
        except ValueError:
            raise ValueError(
                f"{item!r} is neither an int nor adaptive[:TARGET]; pass e.g. 1,2,4,8,adaptive:0.01"
            ) from None
    head, _, spec = item.partition(":")
    if head != "adaptive":
        raise ValueError(f"{item!r} is not adaptive[:TARGET]; pass e.g. adaptive, adaptive:0.01 or adaptive:clip=0.05")
    if not spec:
        return {"target_kl": DEFAULT_ADAPTIVE_KL}
    fields: Dict[str, Any] = {}
    for part in spec.split("+"):
        key, sep, value = part.partition("=")
        key, value = (key, value) if sep else ("kl", key)
        if key not in ("kl", "clip"):
            raise ValueError(f"{item!r}: {key!r} is not kl or clip; pass e.g. adaptive:kl=0.01 or adaptive:clip=0.05")
        try:
            fields[f"target_{key}"] = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value!r} is not a number; pass e.g. adaptive:0.01") from None
    return fields


def make_arm(reuse: int, strategy: str, max_age: MaxAge, lag: int) -> ArmConfig:
    """The arm for one combination; an adaptive max_age starts at ArmConfig's default bound."""
    if isinstance(max_age, dict):
        return ArmConfig(reuse=reuse, strategy=strategy, lag=lag, **max_age)
    return ArmConfig(reuse=reuse, strategy=strategy, max_age=max_age, lag=lag)


def axis_values(arms: Sequence[ArmConfig]) -> Dict[str, str]:
    """Each axis's values among ``arms`` as a comma list, in first-seen order (a preset's unset axes)."""
    out = {}
    for axis in AXIS_DEFAULTS:
        values = list(dict.fromkeys(a.max_age_spec if axis == "max_age" else str(getattr(a, axis)) for a in arms))
        out[axis] = ",".join(values)
    return out


def product_arms(
    reuse: Optional[str] = None,
    strategy: Optional[str] = None,
    max_age: Optional[str] = None,
    lag: Optional[str] = None,
    defaults: Optional[Dict[str, str]] = None,
) -> List[ArmConfig]:
    """Every combination of the four axes, reuse varying slowest. An unset (None) axis takes
    ``defaults`` (a preset's values) or AXIS_DEFAULTS; an empty string is an error."""
    fallback = {**AXIS_DEFAULTS, **(defaults or {})}
    reuses = parse_list(fallback["reuse"] if reuse is None else reuse, "reuse", int)
    strategies = parse_list(fallback["strategy"] if strategy is None else strategy, "strategy", str)
    ages = parse_list(fallback["max_age"] if max_age is None else max_age, "max_age", parse_max_age)
    lags = parse_list(fallback["lag"] if lag is None else lag, "lag", int)
    for s in strategies:
        if s not in STRATEGIES:
            raise ValueError(f"--strategy has {s!r}; pass a comma list of drop, wait and pace")
    return [make_arm(r, s, a, g) for r, s, a, g in itertools.product(reuses, strategies, ages, lags)]


def parse_arm(spec: str) -> ArmConfig:
    """Parses one explicit arm, ``"reuse=4,strategy=wait,max_age=2,lag=1"``; omitted keys take ArmConfig's defaults."""
    fields: Dict[str, Any] = {}
    for part in spec.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.replace("-", "_")
        if not sep or key not in (*AXIS_DEFAULTS, "max_attempts", "in_flight_updates"):
            raise ValueError(
                f"--arm {spec!r}: {part.strip()!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(AXIS_DEFAULTS)}, max_attempts, in_flight_updates; pass e.g. 'reuse=4,strategy=wait'"
            )
        if key == "in_flight_updates":
            if value not in ("0", "1"):
                raise ValueError(f"--arm {spec!r}: in_flight_updates={value!r} is not 0 or 1")
            fields[key] = value == "1"
            continue
        try:
            if key == "max_age":
                age = parse_max_age(value)
                fields.update(age if isinstance(age, dict) else {"max_age": age})
            else:
                fields[key] = value if key == "strategy" else int(value)
        except ValueError as exc:
            raise ValueError(
                f"--arm {spec!r}: {key}={value!r} is not an int" if key != "max_age" else f"--arm {spec!r}: {exc}"
            ) from None
    return ArmConfig(**fields)


def unique(arms: Sequence[ArmConfig]) -> List[ArmConfig]:
    """Returns ``arms`` or raises ValueError if two arms are the same (their records would collide)."""
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--arm: arm {dupes[0]} is listed twice; list each arm once")
    return list(arms)
