"""Arms from the command line: the cartesian product of the axis lists, or an explicit list."""

from __future__ import annotations

import itertools
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

from .config import STRATEGIES, ArmConfig

T = TypeVar("T")
AXIS_DEFAULTS = {"reuse": "1,2,4", "strategy": "drop", "max_age": "4", "lag": "0"}


def parse_list(text: str, name: str, convert: Callable[[str], T]) -> List[T]:
    """Parses ``"1,2,4"`` into ``[1, 2, 4]``; raises ValueError naming ``--name`` and the expected form."""
    if not str(text).strip():
        raise ValueError(f"--{name.replace('_', '-')} is empty; pass a comma-separated list such as "
                         f"{AXIS_DEFAULTS[name]!r}")
    items = [part.strip() for part in str(text).split(",")]
    if not items or any(not part for part in items):
        raise ValueError(f"--{name.replace('_', '-')}={text!r} has an empty item; pass a comma-separated list "
                         f"such as {AXIS_DEFAULTS[name]!r}")
    try:
        values = [convert(part) for part in items]
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')}={text!r} is not a comma-separated list of "
                         f"{'strategies' if convert is str else 'ints'}; pass e.g. {AXIS_DEFAULTS[name]!r}") from None
    if len(set(values)) != len(values):
        raise ValueError(f"--{name.replace('_', '-')}={text!r} repeats a value; list each once")
    return values


def axis_values(arms: Sequence[ArmConfig]) -> Dict[str, str]:
    """Each axis's values among ``arms`` as a comma list, in first-seen order (a preset's unset axes)."""
    out = {}
    for axis in AXIS_DEFAULTS:
        values = list(dict.fromkeys(str(getattr(a, axis)) for a in arms))
        out[axis] = ",".join(values)
    return out


def product_arms(reuse: Optional[str] = None, strategy: Optional[str] = None, max_age: Optional[str] = None,
                 lag: Optional[str] = None, defaults: Optional[Dict[str, str]] = None) -> List[ArmConfig]:
    """Every combination of the four axes, reuse varying slowest. An unset (None) axis takes
    ``defaults`` (a preset's values) or AXIS_DEFAULTS; an empty string is an error."""
    fallback = {**AXIS_DEFAULTS, **(defaults or {})}
    axes = {
        "reuse": parse_list(fallback["reuse"] if reuse is None else reuse, "reuse", int),
        "strategy": parse_list(fallback["strategy"] if strategy is None else strategy, "strategy", str),
        "max_age": parse_list(fallback["max_age"] if max_age is None else max_age, "max_age", int),
        "lag": parse_list(fallback["lag"] if lag is None else lag, "lag", int),
    }

    for s in axes["strategy"]:
        if s not in STRATEGIES:
            raise ValueError(f"--strategy has {s!r}; pass drop, wait or drop,wait")
    return [ArmConfig(reuse=r, strategy=s, max_age=a, lag=g)
            for r, s, a, g in itertools.product(axes["reuse"], axes["strategy"], axes["max_age"], axes["lag"])]


def parse_arm(spec: str) -> ArmConfig:
    """Parses one explicit arm, ``"reuse=4,strategy=wait,max_age=2,lag=1"``; omitted keys take ArmConfig's defaults."""
    fields = {}
    for part in spec.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.replace("-", "_")
        if not sep or key not in AXIS_DEFAULTS:
            raise ValueError(f"--arm {spec!r}: {part.strip()!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(AXIS_DEFAULTS)}; pass e.g. 'reuse=4,strategy=wait'")
        try:
            fields[key] = value if key == "strategy" else int(value)
        except ValueError:
            raise ValueError(f"--arm {spec!r}: {key}={value!r} is not an int") from None
    return ArmConfig(**fields)


def unique(arms: Sequence[ArmConfig]) -> List[ArmConfig]:
    """Returns ``arms`` or raises ValueError if two arms are the same (their records would collide)."""
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--arm: arm {dupes[0]} is listed twice; list each arm once")
    return list(arms)
